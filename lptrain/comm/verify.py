"""Symbolic execution of schedules: proof that a schedule computes its collective.

Every element range of every rank carries the *set* of ranks whose inputs it holds (a
bitmask) and an identifier of the value it holds. A ``REDUCE`` unions the sets (and
fails if they overlap: a contribution counted twice) and creates a new value; a ``COPY``
carries set and value over. At the end a broadcast must leave the root's input on every
rank, a reduce every contribution exactly once at the root, and an allreduce every
contribution exactly once everywhere, with the *same value identifier* on every rank:
the replicas hold copies of one computed sum, so they are bitwise identical.

Transfers in one step may run concurrently, so within a step no range may be written
by one transfer and read or written by another.
"""

from __future__ import annotations

from lptrain.comm.schedule import Kind, Schedule, segment_bounds, segments_in


class ScheduleError(AssertionError):
    """A schedule does not compute its collective, or races within a step."""


def execute_symbolically(schedule: Schedule) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Run ``schedule`` on symbols; returns ``(bounds, masks, values)`` per rank and segment."""
    p = schedule.world_size
    bounds = segment_bounds(schedule)
    nseg = len(bounds) - 1
    masks = [[1 << r] * nseg for r in range(p)]
    values = [[r] * nseg for r in range(p)]
    next_value = p
    for index, step in enumerate(schedule.steps):
        _check_race(index, step, bounds)
        # Concurrent transfers read the state before the step: snapshot what they read.
        reads = [[(masks[t.src][s], values[t.src][s]) for s in segments_in(bounds, t.start, t.stop)] for t in step]
        for t, src_state in zip(step, reads):
            for s, (mask, value) in zip(segments_in(bounds, t.start, t.stop), src_state):
                if t.kind is Kind.COPY:
                    masks[t.dst][s], values[t.dst][s] = mask, value
                else:
                    overlap = masks[t.dst][s] & mask
                    if overlap:
                        twice = [r for r in range(p) if overlap >> r & 1]
                        raise ScheduleError(
                            f"step {index}: {t} adds the contribution of rank(s) {twice} a second time "
                            f"on elements [{bounds[s]}, {bounds[s + 1]})"
                        )
                    masks[t.dst][s] |= mask
                    values[t.dst][s] = next_value
                    next_value += 1
    return bounds, masks, values


def _check_race(index: int, step: tuple, bounds: list[int]) -> None:
    writes: dict[tuple[int, int], object] = {}
    reads: dict[tuple[int, int], list] = {}
    for t in step:
        for s in segments_in(bounds, t.start, t.stop):
            if (t.dst, s) in writes:
                raise ScheduleError(f"step {index}: {t} and {writes[(t.dst, s)]} write the same range")
            writes[(t.dst, s)] = t
            reads.setdefault((t.src, s), []).append(t)
    for key, readers in reads.items():
        if key in writes:
            raise ScheduleError(f"step {index}: {writes[key]} writes a range that {readers[0]} reads in the same step")


def verify(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` computes its collective exactly."""
    p, root = schedule.world_size, schedule.root
    bounds, masks, values = execute_symbolically(schedule)
    full = (1 << p) - 1

    def where(r: int, s: int) -> str:
        return f"rank {r} elements [{bounds[s]}, {bounds[s + 1]})"

    def contributors(mask: int) -> list[int]:
        return [r for r in range(p) if mask >> r & 1]

    nseg = len(bounds) - 1
    if schedule.op == "broadcast":
        for r in range(p):
            for s in range(nseg):
                if values[r][s] != root:
                    raise ScheduleError(
                        f"broadcast from {root}: {where(r, s)} holds {contributors(masks[r][s])}, not the root's input"
                    )
    elif schedule.op == "reduce":
        for s in range(nseg):
            if masks[root][s] != full:
                raise ScheduleError(f"reduce to {root}: {where(root, s)} holds only {contributors(masks[root][s])}")
    else:
        for s in range(nseg):
            for r in range(p):
                if masks[r][s] != full:
                    raise ScheduleError(f"allreduce: {where(r, s)} holds only {contributors(masks[r][s])}")
                if values[r][s] != values[0][s]:
                    raise ScheduleError(
                        f"allreduce: {where(r, s)} holds a different computation of the sum than rank 0, "
                        "so the replicas would not be bitwise identical"
                    )
