"""Where no tuning file answers: the schedule, block and rank order the simulator prices cheapest.

Every schedule (for an allreduce, every variant too: LP's two constructions) is priced on
a model of the machine (``lptrain.sim``): a shipped model, declared racks, or the racks the
probe measured (``lptrain.sim.declared``). Where the machine has racks, each schedule is
priced in every order worth trying (``rack_orders``: the natural one, each rack contiguous,
the racks interleaved), because on racks joined by thin uplinks the order decides what
crosses them: LP's chain with its racks contiguous crosses each uplink once, the ring in
the natural order of interleaved racks at every hop. LP is priced at its cost-model block
and at a few fixed ones. The cheapest wins; ties go to the earlier candidate (the natural
order, the automatic block), so a star or a single rack keeps what it ran before.

On a model measured across processes (``overlapped``: ``lptrain.auto.probed``) a block
above the executor's segment for the link it measured (``auto_segment_bytes``: what the
link carries in 10 ms) is priced as the executor runs it: each segment goes on as soon as it
is in, so the pipeline fills in segments (``_priced_block``). Priced in whole blocks,
LP's automatic block (256 KiB, 128 KiB messages) on 8 nodes in 2 racks with uplinks at
half a port looked a third dearer than 64 KiB blocks at 4 MiB, where the two measured 483 and
469 ms; at 16 MiB they measured 1522 and 1647 ms, and priced in segments the smaller
block's gain stays under the 5% margin there (2026-12-05, lptrain-cluster, 2 cores). On such
a model no fixed block below LP's automatic one on that link is priced (what the link carries
in 5 ms, ``lptrain.comm.program.pipeline_block_bytes``): priced from the lone exchange
measured at start, 64 KiB blocks looked cheapest on the 200mbit star at 4 MiB and measured
1.40 n/B against LP's own 1.10 for a broadcast over 16 nodes, 1.71 against 1.25 for a reduce.
"""

from __future__ import annotations

from typing import Any

from lptrain.auto.tuning import Choice
from lptrain.comm.algorithms import SCHEDULES, WITH_VARIANTS, option_names, resolve
from lptrain.comm.algorithms.order import format_order
from lptrain.comm.program import auto_segment_bytes
from lptrain.comm.sizes import format_size
from lptrain.sim.dataflow import measured_rate
from lptrain.sim.declared import topology_of
from lptrain.sim.predict import lp_block_bytes, predict, rack_orders, sizing_of
from lptrain.sim.topology import Topology

SIMULATED = WITH_VARIANTS
BLOCKS = (64 << 10, 256 << 10, 1 << 20)  # fixed LP blocks priced beside the cost model's
MARGIN = 0.05  # relative: how much cheaper a later candidate must be to displace the best so far


def _candidates(op: str, topology: Topology, nbytes: int) -> list[tuple[str, Any, str, list[int] | None]]:
    """(algorithm, block or "auto", order's name, order or None) for every candidate."""
    algos = sorted(SIMULATED if op == "allreduce" else SCHEDULES, key=lambda a: a != "ring")
    orders = rack_orders(topology)
    # On a slow link measured across processes, no block below the one the link sets: the model
    # prices a message's cost as the lone exchange measured at start, where with many processes
    # per core each costs more, the reason the link floors the block (pipeline_block_bytes).
    floor = sizing_of(topology).link_block or 0
    out = []
    for algo in algos:
        blocks: list[Any] = ["auto"]
        if "block_size" in option_names(algo):
            blocks += [b for b in BLOCKS if b < nbytes and b >= floor]
        for name, order in orders.items():
            for block in blocks:
                out.append((algo, block, name, None if name == "natural" else order))
    return out


def _segment(topology: Topology, nbytes: int) -> int | None:
    """The executor's bytes per message on a model measured across processes, else None."""
    if not topology.overlapped or topology.world_size < 2:
        return None
    return auto_segment_bytes(nbytes, topology.world_size, topology.link_rate or measured_rate(topology))


def _priced_block(algo: str, op: str, topology: Topology, nbytes: int, block: Any) -> int | None:
    """The block to price ``algo`` at (None: its automatic one, as the model sizes it): on a
    model measured across processes, no larger than the executor's segment."""
    segment = _segment(topology, nbytes)
    if segment is None or "block_size" not in option_names(algo):
        return None if block == "auto" else block
    if block == "auto":
        block = lp_block_bytes(topology, nbytes, op, "reduce_broadcast" if algo == "lp-rb" else "overlapped")
    return min(block, segment)


def simulated_choice(op: str, nbytes: int, world_size: int, topology: str | Topology) -> Choice:
    """The cheapest (schedule, LP block, rank order) by the simulator on ``topology`` (a
    model's name, a declaration such as ``racks:2@1/2``, or a built ``Topology``)."""
    topo = topology if isinstance(topology, Topology) else topology_of(topology, world_size)
    nbytes = max(nbytes, 4)
    priced = []
    for algo, block, order_name, order in _candidates(op, topo, nbytes):
        block_bytes = _priced_block(algo, op, topo, nbytes, block)
        seconds = predict(algo, op, topo, nbytes, block_bytes=block_bytes, order=order).seconds
        priced.append((seconds, algo, block, order_name, order))
    best = priced[0]
    for candidate in priced[1:]:
        if candidate[0] < best[0] * (1 - MARGIN):
            best = candidate
    seconds, algo, block, order_name, order = best
    base, options = resolve(algo)
    if "block_size" in option_names(algo):
        options["block_size"] = block
    if order is not None:
        options["order"] = list(order)
    ranked = sorted(priced, key=lambda c: c[0])
    shown = ", ".join(f"{_name(c, topo, nbytes, op)} {c[0] * 1e6:.0f} us" for c in _firsts(ranked)[:5])
    detail = f"{format_size(nbytes)} {op} on {_model_name(topo)}: {shown}"
    return Choice(base, options, "simulated", detail)


def _firsts(ranked: list[tuple]) -> list[tuple]:
    """The cheapest candidate of each algorithm, cheapest first."""
    seen, out = set(), []
    for c in ranked:
        if c[1] not in seen:
            seen.add(c[1])
            out.append(c)
    return out


def _name(candidate: tuple, topo: Topology, nbytes: int, op: str) -> str:
    _, algo, block, order_name, order = candidate
    text = algo
    if block != "auto":
        text += f"@{format_size(block)}"
    elif "block_size" in option_names(algo):
        mode = "reduce_broadcast" if algo == "lp-rb" else "overlapped"
        text += f"@auto({format_size(lp_block_bytes(topo, nbytes, op, mode))})"
    return text + (f" order {format_order(order)}" if order is not None else "")


def _model_name(topo: Topology) -> str:
    return f"the {topo.name} model" + (f" ({topo.layout})" if topo.layout else "")
