"""Predictions for named algorithms: build the schedule, price it on a topology.

Schedules are built by the same adapter the executors use
(``lptrain.comm.algorithms.schedule_builders``), with the topology's link figures for any
option sized per message (LP's automatic block), so a prediction prices what would run.
"""

from __future__ import annotations

from collections.abc import Sequence

from lptrain.comm.algorithms import WITH_VARIANTS, lp, option_names, schedule_builders
from lptrain.comm.algorithms.options import PCIE, Sizing
from lptrain.comm.program import pipeline_block_bytes
from lptrain.comm.schedule import Schedule
from lptrain.sim.dataflow import measured_rate
from lptrain.sim.simulator import Prediction, simulate
from lptrain.sim.topology import Topology

ALGOS = WITH_VARIANTS


def sizing_of(topology: Topology) -> Sizing:
    """The link figures of ``topology``'s first link, what an automatic block is sized for."""
    if topology.world_size < 2:
        return PCIE  # one rank: nothing is sent, any figures do
    link = topology.route(0, 1)[0]
    sizing = Sizing(topology.overhead + link.latency, 1 / link.bandwidth)
    if not topology.overlapped:
        return sizing
    # measured across processes: a chain's blocks follow the link the executor measured
    return sizing.on_link(pipeline_block_bytes(topology.link_rate or measured_rate(topology)))


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
    order: Sequence[int] | None = None,
) -> Schedule:
    """``algo``'s schedule of ``op`` (an algorithm or a variant such as lp-rb) on ``count``
    elements: ``block_bytes`` sets the block of an algorithm that has one (``block_size``),
    else it follows the link figures of ``sizing``; ``order`` places the ranks (None: 0..P-1)."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: {', '.join(ALGOS)}")
    options: dict = {"block_size": block_bytes} if block_bytes and "block_size" in option_names(algo) else {}
    if order is not None:
        options["order"] = list(order)
    builders, _ = schedule_builders(algo, world_size, options, sizing)
    return builders[op](world_size, count, None if op == "allreduce" else root, itemsize)


def predict(
    algo: str,
    op: str,
    topology: Topology,
    nbytes: int,
    itemsize: int = 4,
    block_bytes: int | None = None,
    order: Sequence[int] | None = None,
) -> Prediction:
    """Predicted time of ``algo``'s ``op`` of ``nbytes`` on ``topology`` (auto LP block by
    default), its ranks placed in ``order`` (None: 0..P-1)."""
    schedule = schedule_for(
        algo,
        op,
        topology.world_size,
        nbytes // itemsize,
        itemsize,
        block_bytes,
        sizing=sizing_of(topology),
        order=order,
    )
    return simulate(schedule, topology, itemsize)


def rack_orders(topology: Topology) -> dict[str, list[int]]:
    """The rank orders worth pricing on ``topology``: the natural one, and where it has racks
    (``groups``), each rack contiguous (racks in the order of their first rank, and the one
    with rank 0 in the middle, which on a star of racks around rack 0 crosses each uplink
    fewer times) and the racks interleaved (BE's and MST's distant partners then in one rack)."""
    natural = list(range(topology.world_size))
    orders = {"natural": natural}
    groups = topology.groups
    if not groups or len(groups) < 2:
        return orders
    orders["racks"] = [r for g in groups for r in g]
    if len(groups) > 2:
        middle = [*groups[1 : 1 + len(groups) // 2], groups[0], *groups[1 + len(groups) // 2 :]]
        orders["racks, rack 0 in the middle"] = [r for g in middle for r in g]
    longest = max(len(g) for g in groups)
    orders["racks interleaved"] = [g[i] for i in range(longest) for g in groups if i < len(g)]
    unique: dict[str, list[int]] = {}
    for name, order in orders.items():
        if order not in unique.values():
            unique[name] = order
    return unique
