"""What timing a collective needs, for the benchmark and the simulator alike: the three
collectives by name, a no-argument call of one for the timer, and nccl-tests' bus factor
that turns a time into busbw.

``lptrain-bench`` (in one process and across processes), ``lptrain-sim predict`` (its
busbw column) and ``lptrain-sim calibrate`` (its measured runs) use them.
"""

from __future__ import annotations

OPS = ("allreduce", "broadcast", "reduce")


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw factor: how much of the message each rank's busiest link carries."""
    return 2 * (world_size - 1) / world_size if op == "allreduce" else 1.0


def collective_call(comm, op: str, tensors, root: int):
    """A no-argument call of ``op`` for the timer: any communicator (in-process, distributed,
    MPI) with ``allreduce``, ``reduce`` and ``broadcast``, on its tensors or its one tensor."""
    if op == "allreduce":
        return lambda: comm.allreduce(tensors)
    if op == "reduce":
        return lambda: comm.reduce(tensors, root=root)
    return lambda: comm.broadcast(tensors, root=root)
