"""Ring: the bandwidth-optimal algorithm of NCCL and of MPI for long messages.

The message is cut into ``P`` chunks. Allreduce is a reduce-scatter around the ring
(``P - 1`` steps, each rank adding the chunk it receives and passing it on) followed by
an allgather around the ring (``P - 1`` steps of copies): each rank sends
``2 (P - 1) / P`` of the message. Broadcast is a binomial scatter of the chunks followed
by the ring allgather (MPICH's long-message broadcast); reduce is the ring reduce-scatter
followed by a gather of the reduced chunks straight to the root.
"""

from __future__ import annotations

from lptrain.comm.algorithms.options import AlgorithmOptions
from lptrain.comm.schedule import Kind, Schedule, ScheduleBuilder, even_bounds

NAME = "ring"
OPTIONS = AlgorithmOptions()  # none: the ranks and the message decide the schedule
# How the multi-process executor may overlap steps (lptrain.comm.program.ISSUE_POLICIES):
# each step's chunk depends on the last one's; a broadcast's allgather started early
# shares the port with the scatter still running (1.77 against 1.51 n/B for P = 4 with
# ``eager``, lptrain.sim.dataflow). Waiting for every earlier receive too (``steps``) only
# adds a round trip per step (1.85 against 1.76 n/B for an allreduce over 8). The reduce's
# gather into the root takes two senders at a time (``gather``). All P - 1 at once, a call
# now and then lost segments to TCP incast: ring reduces of 4 MiB alternating call by call on
# the emulated star (200 Mbit/s ports, 2-core host, 2026-12-06) took 1.85 to 1.91 n/B in most
# calls either way, but with every sender at once 3 calls of 12 at P = 12 took 2.08 to 2.80,
# and 3 of 20 at P = 16 took 2.72 to 3.10; two at a time, the slowest took 1.95 and 2.18
# (medians 1.90 against 1.91 and 1.96 against 1.99; at 16 MiB, P = 16, 1.94 and 1.95).
ISSUE_ORDER = {"broadcast": "ports", "reduce": "gather", "allreduce": "ports"}


class _Ring:
    """Chunk arithmetic in ranks relative to the root (relative rank 0 is the root)."""

    def __init__(self, world_size: int, count: int, root: int) -> None:
        self.p, self.root, self.count = world_size, root, count
        self.bounds = even_bounds(count, world_size)

    def real(self, vr: int) -> int:
        return (vr % self.p + self.root) % self.p

    def chunk(self, c: int) -> tuple[int, int]:
        c %= self.p
        return self.bounds[c], self.bounds[c + 1]

    def reduce_scatter(self, b: ScheduleBuilder) -> None:
        """After it, relative rank ``vr`` holds the reduced chunk ``vr + 1``."""
        for s in range(self.p - 1):
            b.step([(self.real(v), self.real(v + 1), *self.chunk(v - s), Kind.REDUCE) for v in range(self.p)])

    def allgather(self, b: ScheduleBuilder, first_chunk_offset: int) -> None:
        """Rank ``vr`` starts holding chunk ``vr + first_chunk_offset`` and ends with all."""
        for s in range(self.p - 1):
            b.step(
                [
                    (self.real(v), self.real(v + 1), *self.chunk(v + first_chunk_offset - s), Kind.COPY)
                    for v in range(self.p)
                ]
            )

    def scatter(self, b: ScheduleBuilder) -> None:
        """Binomial scatter from the root: relative rank ``vr`` ends with chunk ``vr``."""
        masks, m = [], 1
        while m < self.p:
            masks.append(m)
            m *= 2
        for mask in reversed(masks):
            b.step(
                [
                    (
                        self.real(v),
                        self.real(v + mask),
                        self.bounds[v + mask],
                        self.bounds[min(v + 2 * mask, self.p)],
                        Kind.COPY,
                    )
                    for v in range(0, self.p - mask, 2 * mask)
                ]
            )

    def gather_to_root(self, b: ScheduleBuilder) -> None:
        """Every other rank sends its reduced chunk (``vr + 1``) straight to the root."""
        b.step([(self.real(v), self.root, *self.chunk(v + 1), Kind.COPY) for v in range(1, self.p)])


def broadcast(world_size: int, count: int, root: int = 0) -> Schedule:
    ring, b = _Ring(world_size, count, root), ScheduleBuilder(skip_dst=root)
    ring.scatter(b)
    ring.allgather(b, first_chunk_offset=0)
    return b.build("broadcast", NAME, world_size, count, root)


def reduce(world_size: int, count: int, root: int = 0) -> Schedule:
    ring, b = _Ring(world_size, count, root), ScheduleBuilder()
    ring.reduce_scatter(b)
    ring.gather_to_root(b)
    return b.build("reduce", NAME, world_size, count, root)


def allreduce(world_size: int, count: int) -> Schedule:
    ring, b = _Ring(world_size, count, 0), ScheduleBuilder()
    ring.reduce_scatter(b)
    ring.allgather(b, first_chunk_offset=1)
    return b.build("allreduce", NAME, world_size, count, None)
