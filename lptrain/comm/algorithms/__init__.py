"""The collective algorithms, one per module, each a pure schedule builder.

Every module exposes ``broadcast(world_size, count, root, **options)``,
``reduce(world_size, count, root, **options)`` and ``allreduce(world_size, count,
**options)``, each returning a :class:`lptrain.comm.schedule.Schedule`.
"""


def issue_order(algorithm: str, op: str) -> str:
    """How the multi-process executor may overlap ``algorithm``'s steps for ``op`` (each
    module's ``ISSUE_ORDER``; see ``lptrain.comm.dataflow.ISSUE_ORDERS``)."""
    from lptrain.comm.algorithms import be, lp, mst, ring

    module = {"lp": lp, "lp-rb": lp, "mst": mst, "be": be, "ring": ring}[algorithm]
    return module.ISSUE_ORDER[op]
