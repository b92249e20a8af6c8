"""Price a schedule on a topology, step by step.

A step's transfers run together. Each link carries the bytes of every transfer routed
over it, at its bandwidth, so transfers that share a link slow each other down; the step
ends when its busiest link has drained:

    T_step = overhead + max_t latency(route_t) + max_l bytes_l / bandwidth_l
             + max_d reduced_bytes_d * gamma

On a topology of private links every link carries one transfer per step and this is the
alpha-beta-gamma model of the paper's closed forms (``alpha = overhead + latency``,
``beta = 1 / bandwidth``). On a ``serial`` topology (one engine doing every transfer in
turn, like the in-process CPU executor) the transfers' costs add up instead. On an
``overlapped`` one (processes measured across a network: ``lptrain.auto.probed``) a
step's endpoint cost is paid while its links drain, ``max(overhead, drain)``: the
multi-process executor posts its receives ahead and issues each segment as soon as its
data is in, so a rank's CPU works on the next message while the link carries this one.
Added instead, the cost measured at start for a lone message (1.6 ms at P = 16 on two
shared cores) priced the ring's 30 steps above BE's 8 and LP's 64 KiB pipeline above
either, where the ring and LP measured as fast or faster.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from lptrain.comm.schedule import Kind, Schedule
from lptrain.sim.topology import Topology


@dataclass(frozen=True)
class Prediction:
    seconds: float
    step_seconds: tuple[float, ...]
    bytes_moved: int

    @property
    def busiest_step(self) -> int:
        return max(range(len(self.step_seconds)), key=self.step_seconds.__getitem__) if self.step_seconds else -1


def simulate(schedule: Schedule, topology: Topology, itemsize: int = 4) -> Prediction:
    """Predicted time of ``schedule`` on ``topology`` for elements of ``itemsize`` bytes."""
    if schedule.world_size != topology.world_size:
        raise ValueError(
            f"the schedule has P={schedule.world_size} but topology {topology.name} has {topology.world_size} devices"
        )
    steps = [
        _serial_step(step, topology, itemsize) if topology.serial else _parallel_step(step, topology, itemsize)
        for step in schedule.steps
    ]
    total = (topology.call_overhead if schedule.steps else 0.0) + sum(steps)
    return Prediction(total, tuple(steps), schedule.elements_moved() * itemsize)


def _parallel_step(step, topology: Topology, itemsize: int) -> float:
    load: dict = defaultdict(float)
    reduced: dict[int, float] = defaultdict(float)
    latency = 0.0
    for t in step:
        nbytes = t.count * itemsize
        route = topology.route(t.src, t.dst)
        for link in route:
            load[link] += nbytes
        latency = max(latency, sum(link.latency for link in route))
        if t.kind is Kind.REDUCE:
            reduced[t.dst] += nbytes
    drain = max((b / link.bandwidth for link, b in load.items()), default=0.0)
    reduce = max(reduced.values(), default=0.0) * topology.gamma
    endpoints = max(topology.overhead, drain) if topology.overlapped else topology.overhead + drain
    return latency + endpoints + reduce


def _serial_step(step, topology: Topology, itemsize: int) -> float:
    total = 0.0
    for t in step:
        nbytes = t.count * itemsize
        route = topology.route(t.src, t.dst)
        total += topology.overhead + sum(link.latency for link in route)
        total += nbytes / min(link.bandwidth for link in route)
        if t.kind is Kind.REDUCE:
            total += nbytes * topology.gamma
    return total
