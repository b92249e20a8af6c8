"""Schedules: what a collective algorithm *is*, as plain data.

A schedule is an ordered list of steps; each step is a set of transfers that may run
at the same time. A transfer moves the element range ``[start, stop)`` of the flat
message from rank ``src`` to rank ``dst`` and either overwrites the destination
(``COPY``) or adds into it (``REDUCE``). Schedules know nothing of torch, devices or
processes, so they can be built, printed and checked exhaustively without tensors
(see :mod:`lptrain.comm.verify`), priced by a cost model, or run by any executor.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field


class Kind(enum.Enum):
    """What a transfer does at its destination."""

    COPY = "copy"  # dst[range] = src[range]
    REDUCE = "reduce"  # dst[range] += src[range]


@dataclass(frozen=True, slots=True)
class Transfer:
    """One message of one step: ``src`` sends ``[start, stop)`` to ``dst``."""

    src: int
    dst: int
    start: int
    stop: int
    kind: Kind

    @property
    def count(self) -> int:
        """Number of elements moved."""
        return self.stop - self.start

    def __str__(self) -> str:
        arrow = "+=" if self.kind is Kind.REDUCE else "<-"
        return f"{self.dst}[{self.start}:{self.stop}] {arrow} {self.src}"


OPS = ("broadcast", "reduce", "allreduce")


@dataclass(frozen=True)
class Schedule:
    """A complete collective: ``steps[t]`` holds the transfers of step ``t``.

    ``root`` is the source of a broadcast or the destination of a reduce, and ``None``
    for an allreduce. ``count`` is the number of elements of the message.
    """

    op: str
    algorithm: str
    world_size: int
    count: int
    root: int | None
    steps: tuple[tuple[Transfer, ...], ...]
    _flat: tuple[Transfer, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; valid ops: {', '.join(OPS)}")
        flat = tuple(t for step in self.steps for t in step)
        for t in flat:
            if not (0 <= t.src < self.world_size and 0 <= t.dst < self.world_size):
                raise ValueError(f"transfer {t} names a rank outside 0..{self.world_size - 1}")
            if t.src == t.dst:
                raise ValueError(f"transfer {t} sends a rank to itself")
            if not 0 <= t.start < t.stop <= self.count:
                raise ValueError(f"transfer {t} has an empty or out-of-range block (count {self.count})")
        object.__setattr__(self, "_flat", flat)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """All transfers in step order."""
        return self._flat

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def elements_moved(self) -> int:
        """Total elements crossing links, summed over transfers."""
        return sum(t.count for t in self._flat)

    def __str__(self) -> str:
        head = (
            f"{self.algorithm} {self.op} P={self.world_size} count={self.count}"
            + (f" root={self.root}" if self.root is not None else "")
            + f": {self.num_steps} steps, {len(self._flat)} transfers"
        )
        lines = [head]
        for i, step in enumerate(self.steps):
            lines.append(f"  step {i}: " + ", ".join(str(t) for t in step))
        return "\n".join(lines)


class ScheduleBuilder:
    """Collects steps, dropping empty transfers and empty steps.

    Algorithms describe their steps over ranges that may be empty for tiny messages
    (fewer elements than ranks); the builder keeps the schedule itself free of them.
    ``skip_dst`` names a rank that already holds the final result (the root of a
    broadcast), so symmetric phases such as an allgather need not send to it.
    """

    def __init__(self, skip_dst: int | None = None) -> None:
        self._steps: list[tuple[Transfer, ...]] = []
        self._skip_dst = skip_dst

    def step(self, transfers: list[tuple[int, int, int, int, Kind]]) -> None:
        kept = tuple(Transfer(s, d, a, b, k) for s, d, a, b, k in transfers if b > a and d != self._skip_dst)
        if kept:
            self._steps.append(kept)

    def build(self, op: str, algorithm: str, world_size: int, count: int, root: int | None) -> Schedule:
        return Schedule(op, algorithm, world_size, count, root, tuple(self._steps))


def even_bounds(count: int, parts: int) -> list[int]:
    """Boundaries splitting ``count`` elements into ``parts`` near-equal chunks.

    Chunk ``i`` is ``[bounds[i], bounds[i+1])``; the first ``count % parts`` chunks get
    one extra element, so sizes differ by at most one (chunks may be empty).
    """
    base, extra = divmod(count, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def block_bounds(count: int, block: int) -> list[int]:
    """Boundaries of consecutive blocks of ``block`` elements (the last may be short)."""
    if block < 1:
        raise ValueError(f"block size must be at least 1 element, got {block}")
    return list(range(0, count, block)) + [count] if count else [0]


def segment_bounds(schedule: Schedule) -> list[int]:
    """The coarsest partition of ``[0, count)`` on which every transfer is aligned."""
    points = {0, schedule.count}
    for t in schedule.transfers:
        points.add(t.start)
        points.add(t.stop)
    return sorted(points) if schedule.count else [0]


def segments_in(bounds: list[int], start: int, stop: int) -> range:
    """Indices of the segments of ``bounds`` covering ``[start, stop)`` (aligned ends)."""
    return range(bisect.bisect_left(bounds, start), bisect.bisect_left(bounds, stop))
