"""A rank order for every algorithm: the same schedule run over a permutation of the ranks.

An algorithm's schedule places its ranks on a line (LP's chain, the ring, BE's and MST's
partners at distance 1, 2, 4 ...) and numbers them ``0..P-1``. Where the machine's links
are not all alike (ranks in racks joined by thin uplinks), which rank takes which place
decides which transfers cross the thin links: a ring or chain whose racks are contiguous
crosses each uplink once each way. ``order`` says it: ``order[i]`` is the rank that takes
place ``i``. The schedule is built over the places and relabelled (``relabel``), so every
algorithm takes an order the same way, it is proved like any other schedule
(``lptrain.comm.verify``), and LP's chain is exactly ``order`` (as its own ``order``
argument always said). Roots are ranks, not places: a broadcast from rank ``r`` is the
algorithm's broadcast from place ``order.index(r)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from lptrain.comm.schedule import Schedule, Transfer


def check_order(order: Sequence[int] | None, world_size: int) -> list[int]:
    """The order as a list, defaulting to ``0, 1, ..., P-1``; anything but a permutation of
    the ranks is refused in one line."""
    if order is None:
        return list(range(world_size))
    try:
        places = [int(r) for r in order]
    except (TypeError, ValueError):
        places = None
    if places is None or sorted(places) != list(range(world_size)):
        raise ValueError(
            f"order must be a permutation of 0..{world_size - 1}, the ranks (one entry per rank), got {order!r}"
        )
    return places


def is_identity(order: Sequence[int]) -> bool:
    return all(rank == place for place, rank in enumerate(order))


def relabel(schedule: Schedule, order: Sequence[int]) -> Schedule:
    """``schedule`` built over places, with each place ``i`` replaced by rank ``order[i]``;
    its root (a place) becomes that place's rank."""
    steps = tuple(
        tuple(Transfer(order[t.src], order[t.dst], t.start, t.stop, t.kind) for t in step) for step in schedule.steps
    )
    root = None if schedule.root is None else order[schedule.root]
    label = schedule.algorithm if is_identity(order) else f"{schedule.algorithm} order={format_order(order)}"
    return Schedule(schedule.op, label, schedule.world_size, schedule.count, root, steps)


def format_order(order: Sequence[int]) -> str:
    """``0-2-1-3``: the ranks place by place, short enough for a table's note."""
    return "-".join(str(r) for r in order)
