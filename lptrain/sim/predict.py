"""Predictions for named algorithms: build the schedule, price it on a topology."""

from __future__ import annotations

from lptrain.comm.algorithms import MODULES, WITH_VARIANTS, lp
from lptrain.comm.schedule import Schedule
from lptrain.sim.simulator import Prediction, simulate
from lptrain.sim.topology import Topology

ALGOS = WITH_VARIANTS


def lp_block_bytes(topology: Topology, nbytes: int, op: str = "broadcast", mode: str = "overlapped") -> int:
    """The cost-model block size of ``op`` for this topology's first link (what ``block_size=auto`` does)."""
    if topology.world_size < 2:
        return lp.MAX_AUTO_BLOCK_BYTES
    link = topology.route(0, 1)[0]
    fill = lp.pipeline_fill(op, topology.world_size, mode)
    return lp.optimal_block_bytes(
        nbytes, topology.world_size, topology.overhead + link.latency, 1 / link.bandwidth, fill
    )


def schedule_for(
    algo: str, op: str, world_size: int, count: int, itemsize: int = 4, block_bytes: int | None = None, root: int = 0
) -> Schedule:
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: {', '.join(ALGOS)}")
    if algo.startswith("lp"):
        block = max(1, (block_bytes or lp.MAX_AUTO_BLOCK_BYTES) // itemsize)
        if op == "allreduce":
            return lp.allreduce(
                world_size, count, block=block, mode="reduce_broadcast" if algo == "lp-rb" else "overlapped"
            )
        return getattr(lp, op)(world_size, count, root, block=block)
    module = MODULES[algo]
    return module.allreduce(world_size, count) if op == "allreduce" else getattr(module, op)(world_size, count, root)


def predict(
    algo: str, op: str, topology: Topology, nbytes: int, itemsize: int = 4, block_bytes: int | None = None
) -> Prediction:
    """Predicted time of ``algo``'s ``op`` of ``nbytes`` on ``topology`` (auto LP block by default)."""
    count = nbytes // itemsize
    mode = "reduce_broadcast" if algo == "lp-rb" else "overlapped"
    block = block_bytes or lp_block_bytes(topology, nbytes, op, mode)
    return simulate(schedule_for(algo, op, topology.world_size, count, itemsize, block), topology, itemsize)
