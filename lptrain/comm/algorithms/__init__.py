"""The collective algorithms, one per module, each a pure schedule builder.

Every module exposes ``broadcast(world_size, count, root, **options)``,
``reduce(world_size, count, root, **options)`` and ``allreduce(world_size, count,
**options)``, each returning a :class:`lptrain.comm.schedule.Schedule`.
"""


def issue_orders(algorithm: str) -> dict[str, str]:
    """How the multi-process executor may overlap ``algorithm``'s steps, per op (each
    module's ``ISSUE_ORDER``; see ``lptrain.comm.dataflow.ISSUE_ORDERS``)."""
    from lptrain.comm.algorithms import be, lp, mst, ring

    return {"lp": lp, "lp-rb": lp, "mst": mst, "be": be, "ring": ring}[algorithm].ISSUE_ORDER


def issue_order(algorithm: str, op: str) -> str:
    """``issue_orders(algorithm)`` for one op."""
    return issue_orders(algorithm)[op]
