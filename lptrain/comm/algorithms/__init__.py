"""The collective algorithms, one per module, each a pure schedule builder.

Every module has the same shape: ``NAME``; ``OPTIONS``, an
:class:`~lptrain.comm.algorithms.options.AlgorithmOptions` (the options a user may set,
their defaults, and the keyword arguments they give the schedule functions per message);
``ISSUE_ORDER``; optionally ``MESSAGES`` (how an op cuts its messages on a slow link, ``link``
where it says nothing: ``lptrain.comm.program.MESSAGE_RULES``); and ``broadcast(world_size, count, root, **keywords)``,
``reduce(world_size, count, root, **keywords)`` and ``allreduce(world_size, count,
**keywords)``, each returning a :class:`lptrain.comm.schedule.Schedule`.

``MODULES`` is the one list of them and ``schedule_builders`` the one adapter from a
module and its options to the builders the executors call: the registry, the benchmark,
the DDP hook and backend, ``comm=auto`` and the simulator take their names and their
builders from here, and the tests verify every module in it, so adding an algorithm is a
module and a line here. ``VARIANTS`` names an algorithm run with preset options (lp-rb is
LP's reduce-then-broadcast allreduce), resolved here alone (``resolve``, ``variant_of``).

Besides its own options every algorithm takes ``order`` (``GENERIC_OPTIONS``): the ranks
place by place, so that a ring or a chain can keep each rack of a machine contiguous. The
adapter builds the schedule over places and relabels it (``lptrain.comm.algorithms.order``),
so no algorithm has a line of its own for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from lptrain.comm.algorithms import be, lp, mst, ring
from lptrain.comm.algorithms.options import HOST, Sizing
from lptrain.comm.algorithms.order import check_order, is_identity, relabel
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.schedule import Schedule

MODULES: dict[str, ModuleType] = {"lp": lp, "mst": mst, "be": be, "ring": ring}
SCHEDULES = tuple(MODULES)  # the algorithms that are schedules (nccl and auto are not)
# The variants the benchmark, the simulator and auto list as algorithms of their own.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {"lp-rb": ("lp", {"allreduce": "reduce_broadcast"})}
# Each schedule followed by its variants: lp, lp-rb, mst, be, ring.
WITH_VARIANTS = tuple(n for s in SCHEDULES for n in (s, *(v for v, (base, _) in VARIANTS.items() if base == s)))
OPS = ("broadcast", "reduce", "allreduce")
# The options every algorithm takes, whatever its module declares: the adapter applies them.
GENERIC_OPTIONS: dict[str, Any] = {"order": None}

# (world_size, count, root, itemsize) -> the schedule of one message; root is None for allreduce
Builder = Callable[[int, int, "int | None", int], Schedule]


def resolve(algorithm: str) -> tuple[str, dict[str, Any]]:
    """The schedule module's name and the preset options of ``algorithm`` (a variant such as
    ``lp-rb``, or an algorithm itself with none)."""
    base, preset = VARIANTS.get(algorithm, (algorithm, {}))
    return base, dict(preset)


def variant_of(algorithm: str, options: Mapping[str, Any]) -> str:
    """The name of ``algorithm`` run with ``options``: its variant where the options match
    one (lp with ``allreduce="reduce_broadcast"`` is ``lp-rb``), else ``algorithm``."""
    for name, (base, preset) in VARIANTS.items():
        if base == algorithm and all(options.get(k) == v for k, v in preset.items()):
            return name
    return algorithm


def module_of(algorithm: str) -> ModuleType:
    """The schedule module of ``algorithm`` or of its variant (``lp-rb`` is ``lp``)."""
    return MODULES[resolve(algorithm)[0]]


def option_names(algorithm: str) -> list[str]:
    """The options ``algorithm``'s schedules take: its module's (LP: block_size, allreduce)
    and the generic ones (order)."""
    return [*module_of(algorithm).OPTIONS.defaults, *GENERIC_OPTIONS]


def issue_orders(algorithm: str, options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """How the multi-process executor may overlap ``algorithm``'s steps, per op (each
    module's ``ISSUE_ORDER``; see ``lptrain.comm.program.ISSUE_POLICIES``), run with
    ``options`` over a variant's presets and the module's defaults: where a module's order
    depends on an option (LP's reduce-then-broadcast allreduce) it says so in
    ``issue_orders_for``."""
    base, preset = resolve(algorithm)
    module = MODULES[base]
    by_options = getattr(module, "issue_orders_for", None)
    if by_options is None:
        return module.ISSUE_ORDER
    return by_options({**module.OPTIONS.defaults, **preset, **(options or {})})


def issue_order(algorithm: str, op: str, options: Mapping[str, Any] | None = None) -> str:
    """``issue_orders(algorithm, options)`` for one op."""
    return issue_orders(algorithm, options)[op]


def message_rules(algorithm: str) -> dict[str, str]:
    """How ``algorithm``'s ops cut their messages on a slow link, per op (its module's
    ``MESSAGES``, ``link`` for an op it does not name; ``lptrain.comm.program.MESSAGE_RULES``)."""
    named = getattr(module_of(algorithm), "MESSAGES", {})
    return {op: named.get(op, "link") for op in OPS}


def message_rule_of(schedule: Schedule) -> str:
    """The message rule of the algorithm that built ``schedule`` (its label's first word: ``lp
    (block=...)``, ``be order=...``), for its op; ``link`` for a schedule of no module here."""
    base = resolve(re.split(r"[ (]", schedule.algorithm, maxsplit=1)[0])[0]
    return message_rules(base)[schedule.op] if base in MODULES else "link"


def check_options(algorithm: str, world_size: int, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``algorithm``'s options for ``world_size`` ranks: the variant's presets and the given
    ones over the module's defaults, checked and settled; an unknown one is refused."""
    if algorithm not in MODULES and algorithm not in VARIANTS:
        raise CollectiveInputError(f"unknown algorithm {algorithm!r}; valid algorithms: {', '.join(WITH_VARIANTS)}")
    base, preset = resolve(algorithm)
    spec = MODULES[base].OPTIONS
    given = {**preset, **(options or {})}
    unknown = sorted(set(given) - set(spec.defaults) - set(GENERIC_OPTIONS))
    if unknown:
        valid = ", ".join([*spec.defaults, *GENERIC_OPTIONS])
        raise CollectiveInputError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for {base}'s schedules; valid options: {valid}"
        )
    own = {k: v for k, v in given.items() if k not in GENERIC_OPTIONS}
    try:
        order = check_order(given.get("order"), world_size)
    except ValueError as err:
        raise CollectiveInputError(f"{base}: {err}") from None
    return {**spec.check({**spec.defaults, **own}, world_size), "order": order}


def follows_sizing(algorithm: str, options: dict[str, Any]) -> bool:
    """Whether ``algorithm`` with these settled options sizes anything from the link figures."""
    return module_of(algorithm).OPTIONS.follows_sizing(options)


def schedule_builders(
    algorithm: str, world_size: int, options: Mapping[str, Any] | None = None, sizing: Sizing = HOST
) -> tuple[dict[str, Builder], dict[str, Any]]:
    """Every algorithm's schedule builders, made the same way, and its settled options.

    ``algorithm`` is a module's name or a variant's, ``options`` its own options
    (``option_names``), checked now for ``world_size`` ranks; ``sizing`` gives the link
    figures an option sized per message follows (LP's automatic block).
    """
    settled = check_options(algorithm, world_size, options)
    module = module_of(algorithm)
    spec = module.OPTIONS
    own = {k: v for k, v in settled.items() if k not in GENERIC_OPTIONS}
    order = settled["order"]
    natural = is_identity(order)

    def builder(op: str) -> Builder:
        function = getattr(module, op)

        def build(p: int, count: int, root: int | None, itemsize: int) -> Schedule:
            if p != world_size:
                raise CollectiveInputError(f"{algorithm}'s builders are for {world_size} ranks, asked for {p}")
            keywords = spec.keywords(op, own, p, count * itemsize, itemsize, sizing)
            if op == "allreduce":
                schedule = function(p, count, **keywords)
            else:  # the root is a rank: the algorithm's root is its place
                schedule = function(p, count, root if natural else order.index(root), **keywords)
            return schedule if natural else relabel(schedule, order)

        return build

    return {op: builder(op) for op in OPS}, settled
