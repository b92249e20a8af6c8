"""Fit the simulator's constants to collectives measured on this machine.

The in-process CPU executor is modelled by the ``host`` topology: one memory system
runs every transfer in turn, so a call costs

    T = c0 + alpha * transfers + beta * bytes + gamma * reduced_bytes

(``c0`` per call, ``alpha`` per transfer, ``beta`` per byte copied, ``gamma`` per byte
added). The four constants come from a least-squares fit, weighted so that every
measurement counts by its relative error, over runs of every algorithm and operation
at several sizes; the fitted topology then predicts each run, side by side with what
was measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lptrain.bench import collective_call
from lptrain.comm import build_communicator
from lptrain.comm.schedule import Kind, Schedule
from lptrain.sim.simulator import simulate
from lptrain.sim.topology import Topology, host


@dataclass(frozen=True)
class Measurement:
    algo: str
    op: str
    nbytes: int
    seconds: float
    schedule: Schedule
    itemsize: int = 4


@dataclass(frozen=True)
class HostFit:
    call_overhead: float
    transfer_overhead: float
    bandwidth: float
    gamma: float

    def topology(self, world_size: int) -> Topology:
        return host(
            world_size,
            bandwidth=self.bandwidth,
            overhead=self.transfer_overhead,
            gamma=self.gamma,
            call_overhead=self.call_overhead,
        )

    def describe(self) -> str:
        return (
            f"c0 = {self.call_overhead * 1e6:.1f} us per call, alpha = {self.transfer_overhead * 1e6:.2f} us per "
            f"transfer, bandwidth = {self.bandwidth / 1e9:.2f} GB/s, gamma = {self.gamma * 1e12:.1f} ps/B "
            f"(= {1 / self.gamma / 1e9 if self.gamma else float('inf'):.1f} GB/s of additions)"
        )


def features(m: Measurement) -> list[float]:
    transfers = m.schedule.transfers
    moved = sum(t.count for t in transfers) * m.itemsize
    reduced = sum(t.count for t in transfers if t.kind is Kind.REDUCE) * m.itemsize
    return [1.0, float(len(transfers)), float(moved), float(reduced)]


def fit(measurements: Sequence[Measurement]) -> HostFit:
    """Least squares on relative error; constants that come out negative are pinned to 0."""
    x = np.array([features(m) for m in measurements])
    y = np.array([m.seconds for m in measurements])
    w = 1 / y
    free = list(range(4))
    coef = np.zeros(4)
    while free:
        sol, *_ = np.linalg.lstsq(x[:, free] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    c0, alpha, beta, gamma = coef
    return HostFit(float(c0), float(alpha), float(1 / beta) if beta > 0 else float("inf"), float(gamma))


def measure(
    world_size: int,
    sizes: Sequence[int],
    algos: Sequence[str] = ("lp", "mst", "be", "ring"),
    ops: Sequence[str] = ("allreduce", "broadcast", "reduce"),
    trials: int = 3,
    target_s: float = 0.05,
) -> list[Measurement]:
    """Median time of each (algorithm, op, size) on ``world_size`` CPU devices."""
    comms = {a: build_communicator(a, ["cpu"] * world_size) for a in algos}
    out = []
    for size in sizes:
        count = size // 4
        tensors = [torch.zeros(count) for _ in range(world_size)]
        for op in ops:
            for algo, comm in comms.items():
                call = collective_call(comm, op, tensors, 0)
                call()
                t0 = time.perf_counter()
                call()
                one = time.perf_counter() - t0
                calls = max(1, int(target_s / max(one, 1e-9)))
                times = []
                for _ in range(trials):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        call()
                    times.append((time.perf_counter() - t0) / calls)
                schedule = comm.schedule(op, count, None if op == "allreduce" else 0, torch.float32)
                out.append(Measurement(algo, op, count * 4, statistics.median(times), schedule))
    return out


def compare(measurements: Sequence[Measurement], model: HostFit) -> list[dict]:
    """Each measurement beside the fitted model's prediction, with the relative error."""
    rows = []
    for m in measurements:
        predicted = simulate(m.schedule, model.topology(m.schedule.world_size), m.itemsize).seconds
        rows.append(
            {
                "algo": m.algo,
                "op": m.op,
                "bytes": m.nbytes,
                "measured_s": m.seconds,
                "predicted_s": predicted,
                "error": predicted / m.seconds - 1,
            }
        )
    return rows
