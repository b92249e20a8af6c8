"""The collective algorithms, one per module, each a pure schedule builder.

Every module exposes ``broadcast(world_size, count, root, **options)``,
``reduce(world_size, count, root, **options)`` and ``allreduce(world_size, count,
**options)``, each returning a :class:`lptrain.comm.schedule.Schedule`, and
``ISSUE_ORDER``. ``MODULES`` is the one list of them: the registry, the benchmark, the
DDP hook and backend, ``comm=auto`` and the simulator take their names from it, and the
tests verify every module in it, so adding an algorithm is a module and a line here.
"""

from types import ModuleType

from lptrain.comm.algorithms import be, lp, mst, ring

MODULES: dict[str, ModuleType] = {"lp": lp, "mst": mst, "be": be, "ring": ring}
SCHEDULES = tuple(MODULES)  # the algorithms that are schedules (nccl and auto are not)
# The variants the benchmark and the simulator list as algorithms of their own.
VARIANTS = {"lp-rb": ("lp", {"allreduce": "reduce_broadcast"})}
# Each schedule followed by its variants: lp, lp-rb, mst, be, ring.
WITH_VARIANTS = tuple(n for s in SCHEDULES for n in (s, *(v for v, (base, _) in VARIANTS.items() if base == s)))


def module_of(algorithm: str) -> ModuleType:
    """The schedule module of ``algorithm`` or of its variant (``lp-rb`` is ``lp``)."""
    return MODULES[VARIANTS[algorithm][0] if algorithm in VARIANTS else algorithm]


def issue_orders(algorithm: str) -> dict[str, str]:
    """How the multi-process executor may overlap ``algorithm``'s steps, per op (each
    module's ``ISSUE_ORDER``; see ``lptrain.comm.dataflow.ISSUE_ORDERS``)."""
    return module_of(algorithm).ISSUE_ORDER


def issue_order(algorithm: str, op: str) -> str:
    """``issue_orders(algorithm)`` for one op."""
    return issue_orders(algorithm)[op]
