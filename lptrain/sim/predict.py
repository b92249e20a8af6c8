"""Predictions for named algorithms: build the schedule, price it on a topology.

Schedules are built by the same adapter the executors use
(``lptrain.comm.algorithms.schedule_builders``), with the topology's link figures for any
option sized per message (LP's automatic block), so a prediction prices what would run.
"""

from __future__ import annotations

from lptrain.comm.algorithms import WITH_VARIANTS, lp, option_names, schedule_builders
from lptrain.comm.algorithms.options import PCIE, Sizing
from lptrain.comm.schedule import Schedule
from lptrain.sim.simulator import Prediction, simulate
from lptrain.sim.topology import Topology

ALGOS = WITH_VARIANTS


def sizing_of(topology: Topology) -> Sizing:
    """The link figures of ``topology``'s first link, what an automatic block is sized for."""
    if topology.world_size < 2:
        return PCIE  # one rank: nothing is sent, any figures do
    link = topology.route(0, 1)[0]
    return Sizing(topology.overhead + link.latency, 1 / link.bandwidth)


def lp_block_bytes(topology: Topology, nbytes: int, op: str = "broadcast", mode: str = "overlapped") -> int:
    """The cost-model block size of ``op`` for this topology's first link (what ``block_size=auto`` does)."""
    if topology.world_size < 2:
        return lp.MAX_AUTO_BLOCK_BYTES
    return lp.auto_block_bytes(op, topology.world_size, nbytes, mode, sizing_of(topology))


def schedule_for(
    algo: str,
    op: str,
    world_size: int,
    count: int,
    itemsize: int = 4,
    block_bytes: int | None = None,
    root: int = 0,
    sizing: Sizing = PCIE,
) -> Schedule:
    """``algo``'s schedule of ``op`` (an algorithm or a variant such as lp-rb) on ``count``
    elements: ``block_bytes`` sets the block of an algorithm that has one (``block_size``),
    else it follows the link figures of ``sizing``."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: {', '.join(ALGOS)}")
    options = {"block_size": block_bytes} if block_bytes and "block_size" in option_names(algo) else {}
    builders, _ = schedule_builders(algo, world_size, options, sizing)
    return builders[op](world_size, count, None if op == "allreduce" else root, itemsize)


def predict(
    algo: str, op: str, topology: Topology, nbytes: int, itemsize: int = 4, block_bytes: int | None = None
) -> Prediction:
    """Predicted time of ``algo``'s ``op`` of ``nbytes`` on ``topology`` (auto LP block by default)."""
    schedule = schedule_for(
        algo, op, topology.world_size, nbytes // itemsize, itemsize, block_bytes, sizing=sizing_of(topology)
    )
    return simulate(schedule, topology, itemsize)
