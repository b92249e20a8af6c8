"""Minimum spanning tree (MST): the binomial tree.

Each of the ``ceil(log2 P)`` rounds sends the whole message, so the time grows as
``log2(P) * (alpha + n beta)``. The pairing is Caffe's multi-GPU one: a reduce pairs
0:1 and 2:3 first, then 0:2; a broadcast runs the same tree the other way.
"""

from __future__ import annotations

from lptrain.comm.algorithms.options import AlgorithmOptions
from lptrain.comm.schedule import Kind, Schedule, ScheduleBuilder

NAME = "mst"
OPTIONS = AlgorithmOptions()  # none: the ranks and the message decide the schedule
# How the multi-process executor may overlap steps (lptrain.comm.program.ISSUE_POLICIES):
# a tree forwards segments as they arrive, but a parent serves one child at a time: all
# children at once share its port and every subtree starts late (3.99 against 3.00 n/B for a
# broadcast over 8 on one port, lptrain.sim.dataflow).
ISSUE_ORDER = {"broadcast": "ports", "reduce": "ports", "allreduce": "ports"}


def _masks(world_size: int) -> list[int]:
    masks, m = [], 1
    while m < world_size:
        masks.append(m)
        m *= 2
    return masks


def _real(vr: int, root: int, world_size: int) -> int:
    return (vr + root) % world_size


def _reduce_rounds(builder: ScheduleBuilder, world_size: int, count: int, root: int) -> None:
    for mask in _masks(world_size):
        builder.step(
            [
                (_real(vr, root, world_size), _real(vr - mask, root, world_size), 0, count, Kind.REDUCE)
                for vr in range(mask, world_size, 2 * mask)
            ]
        )


def _broadcast_rounds(builder: ScheduleBuilder, world_size: int, count: int, root: int) -> None:
    for mask in reversed(_masks(world_size)):
        builder.step(
            [
                (_real(vr, root, world_size), _real(vr + mask, root, world_size), 0, count, Kind.COPY)
                for vr in range(0, world_size - mask, 2 * mask)
            ]
        )


def broadcast(world_size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree broadcast from ``root``: the farthest subtree is served first."""
    builder = ScheduleBuilder()
    _broadcast_rounds(builder, world_size, count, root)
    return builder.build("broadcast", NAME, world_size, count, root)


def reduce(world_size: int, count: int, root: int = 0) -> Schedule:
    """Binomial-tree reduce to ``root``: neighbours pair first, then pairs of pairs."""
    builder = ScheduleBuilder()
    _reduce_rounds(builder, world_size, count, root)
    return builder.build("reduce", NAME, world_size, count, root)


def allreduce(world_size: int, count: int) -> Schedule:
    """Reduce to rank 0, then broadcast from it."""
    builder = ScheduleBuilder()
    _reduce_rounds(builder, world_size, count, 0)
    _broadcast_rounds(builder, world_size, count, 0)
    return builder.build("allreduce", NAME, world_size, count, None)
