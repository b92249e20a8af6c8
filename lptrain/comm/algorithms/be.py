"""Bidirectional exchange (BE), as MPICH does it for long messages.

Allreduce is Rabenseifner's algorithm: a recursive-halving reduce-scatter (partners at
distance 1, 2, 4, ... exchange halves of what they hold and each keeps the sum of one
half), then a recursive-doubling allgather that retraces the steps backwards. Broadcast
is a binomial scatter followed by the same allgather; reduce is the reduce-scatter
followed by a binomial gather to the root.

Any ``P`` works, as in MPICH: with ``p'`` the largest power of two not above ``P``, the
``P - p'`` extra ranks (odd relative ranks below ``2 (P - p')``) first hand their data to
their even neighbour, the ``p'`` core ranks run the exchange, and the extras receive the
result at the end.
"""

from __future__ import annotations

from lptrain.comm.algorithms.options import AlgorithmOptions
from lptrain.comm.schedule import Kind, Schedule, ScheduleBuilder, even_bounds

NAME = "be"
OPTIONS = AlgorithmOptions()  # none: the ranks and the message decide the schedule
# How the multi-process executor may overlap steps (lptrain.comm.program.ISSUE_POLICIES):
# its steps exchange with a new partner each time: a rank that starts the next step's
# exchange while the last one still runs shares its one port between them and slows the
# partner that waits for the last one (1.78 against 1.50 n/B for an allreduce over 4 on one
# port with receives posted far ahead, lptrain.sim.dataflow). A broadcast's allgather also
# needs each step's receives in first (``steps``: 1.50 against 1.95 n/B with ``ports``).
# ``steps`` also posts a step's receives only once the earlier steps' are in, so that a
# partner a step ahead cannot send into a port still receiving: with one rank late, BE
# shared ports (46 messages, 1.06x the model for an allreduce over 8) and now shares none
# (1.01x; scripts/be_model.py). On the emulated star with links shaped for GSO (MTU 9000,
# a 128 KiB bucket, bbr; 200 Mbit/s, 16 MiB) BE's allreduce took 1.52 n/B over 4 nodes
# (model 1.50; 3 rounds, 1.52-1.54) and 1.81 over 8 (model 1.75; 5 rounds, 1.80-1.87),
# the ring 1.51 and 1.77; posting ahead instead measured the same (1.53, 1.80), as no
# rank there came late enough to matter. With MTU 1500 and a 50 KB bucket the same code
# took 1.93 over 4 nodes and the ring 1.74 (one run): the emulator's cost, not BE's.
# (On that emulator ``steps`` measured 1.82 against 2.26 n/B with ``ports`` for allreduce over
# 4 nodes, and 1.69 against 1.93 for reduce.)
ISSUE_ORDER = {"broadcast": "steps", "reduce": "steps", "allreduce": "steps"}
# How large its messages are on a slow link (lptrain.comm.program.MESSAGE_RULES, where the
# figures are): the allreduce's steps are exchanges that each wait for the last, so every
# message's CPU cost falls between two transfers, and a rank's share per message (1..4 MiB)
# beats what the link carries in 10 ms; the broadcast and the reduce measured better, or the
# same, in the link's messages.
MESSAGES = {"broadcast": "link", "reduce": "link", "allreduce": "share"}


class _Exchange:
    """The recursive-halving bookkeeping of the ``p'`` core ranks.

    ``kept[s][r]`` is the chunk interval core rank ``r`` is responsible for after halving
    step ``s`` (``kept[-1]`` is the whole message); partners at step ``s`` are
    ``r ^ masks[s]`` and the lower one keeps the lower half.
    """

    def __init__(self, world_size: int, count: int, root: int) -> None:
        self.world_size, self.root = world_size, root
        self.pof2 = 1 << (world_size.bit_length() - 1)
        self.rem = world_size - self.pof2
        self.masks = [1 << i for i in range(self.pof2.bit_length() - 1)]
        self.bounds = even_bounds(count, self.pof2)
        self.count = count
        kept = [[(0, self.pof2)] * self.pof2]
        for mask in self.masks:
            now = []
            for r in range(self.pof2):
                lo, hi = kept[-1][r]
                mid = (lo + hi) // 2
                now.append((lo, mid) if r < r ^ mask else (mid, hi))
            kept.append(now)
        self.kept = kept[1:] + [kept[0]]  # so that kept[-1] is the whole message

    def real(self, newrank: int) -> int:
        """The real rank of core rank ``newrank`` (relative ranks start at the root)."""
        vr = 2 * newrank if newrank < self.rem else newrank + self.rem
        return (vr + self.root) % self.world_size

    def elements(self, step: int, newrank: int) -> tuple[int, int]:
        lo, hi = self.kept[step][newrank]
        return self.bounds[lo], self.bounds[hi]

    def _pairs(self, kind: Kind) -> list[tuple[int, int, int, int, Kind]]:
        """Whole-message transfers between each extra rank and its even neighbour."""
        out = []
        for i in range(self.rem):
            even = (2 * i + self.root) % self.world_size
            odd = (2 * i + 1 + self.root) % self.world_size
            src, dst = (odd, even) if kind is Kind.REDUCE else (even, odd)
            out.append((src, dst, 0, self.count, kind))
        return out

    def fold_in(self, b: ScheduleBuilder) -> None:
        b.step(self._pairs(Kind.REDUCE))

    def fold_out(self, b: ScheduleBuilder) -> None:
        b.step(self._pairs(Kind.COPY))

    def reduce_scatter(self, b: ScheduleBuilder) -> None:
        for s, mask in enumerate(self.masks):
            b.step(
                [
                    (self.real(r), self.real(r ^ mask), *self.elements(s, r ^ mask), Kind.REDUCE)
                    for r in range(self.pof2)
                ]
            )

    def allgather(self, b: ScheduleBuilder) -> None:
        for s in reversed(range(len(self.masks))):
            mask = self.masks[s]
            b.step([(self.real(r), self.real(r ^ mask), *self.elements(s, r), Kind.COPY) for r in range(self.pof2)])

    def scatter(self, b: ScheduleBuilder) -> None:
        for s, mask in enumerate(self.masks):
            b.step([(self.real(r), self.real(r + mask), *self.elements(s, r + mask), Kind.COPY) for r in range(mask)])

    def gather(self, b: ScheduleBuilder) -> None:
        for s in reversed(range(len(self.masks))):
            mask = self.masks[s]
            b.step([(self.real(r + mask), self.real(r), *self.elements(s, r + mask), Kind.COPY) for r in range(mask)])


def broadcast(world_size: int, count: int, root: int = 0) -> Schedule:
    """Binomial scatter from ``root``, recursive-doubling allgather, then the extras."""
    ex, b = _Exchange(world_size, count, root), ScheduleBuilder(skip_dst=root)
    ex.scatter(b)
    ex.allgather(b)
    ex.fold_out(b)
    return b.build("broadcast", NAME, world_size, count, root)


def reduce(world_size: int, count: int, root: int = 0) -> Schedule:
    """Extras fold in, recursive-halving reduce-scatter, binomial gather to ``root``."""
    ex, b = _Exchange(world_size, count, root), ScheduleBuilder()
    ex.fold_in(b)
    ex.reduce_scatter(b)
    ex.gather(b)
    return b.build("reduce", NAME, world_size, count, root)


def allreduce(world_size: int, count: int) -> Schedule:
    """Rabenseifner: fold in, reduce-scatter, allgather, fold out."""
    ex, b = _Exchange(world_size, count, 0), ScheduleBuilder()
    ex.fold_in(b)
    ex.reduce_scatter(b)
    ex.allgather(b)
    ex.fold_out(b)
    return b.build("allreduce", NAME, world_size, count, None)
