"""Fit the simulator's constants to collectives measured on this machine.

The in-process CPU executor is modelled by the ``host`` topology: one memory system
runs every transfer in turn, so a call costs

    T = c0 + alpha * transfers + beta * bytes + gamma * reduced_bytes

(``c0`` per call, ``alpha`` per transfer, ``beta`` per byte copied, ``gamma`` per byte
added), where ``beta`` takes one of two values: copies are faster while all the devices'
buffers fit in the last-level cache than when they stream from memory. The five
constants come from a least-squares fit, weighted so that every measurement counts by
its relative error, over runs of every algorithm and operation at several sizes; the
fitted topology then predicts each run, side by side with what was measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lptrain.comm.algorithms import SCHEDULES
from lptrain.comm.build import build_in_process
from lptrain.comm.measure import OPS, collective_call
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


def last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """The largest CPU cache this machine reports (Linux sysfs), else ``default``."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or default


@dataclass(frozen=True)
class HostFit:
    """The host model's constants. Copies run at ``cached_bandwidth`` while the devices'
    buffers (P times the message) fit in the last-level cache, else at ``memory_bandwidth``."""

    call_overhead: float
    transfer_overhead: float
    cached_bandwidth: float
    memory_bandwidth: float
    gamma: float
    cache_bytes: int

    def bandwidth_for(self, world_size: int, message_bytes: int) -> float:
        return self.cached_bandwidth if world_size * message_bytes <= self.cache_bytes else self.memory_bandwidth

    def topology(self, world_size: int, message_bytes: int) -> Topology:
        return host(
            world_size,
            bandwidth=self.bandwidth_for(world_size, message_bytes),
            overhead=self.transfer_overhead,
            gamma=self.gamma,
            call_overhead=self.call_overhead,
        )

    def describe(self) -> str:
        """The constants in one line. A constant the fit pinned to 0 (its free value came out
        negative: the measurements cannot tell that cost apart from the others) is said to
        be pinned, not printed as an infinite rate."""
        if self.gamma:
            gamma = f"gamma = {self.gamma * 1e12:.1f} ps/B (= {1 / self.gamma / 1e9:.1f} GB/s of additions)"
        else:
            gamma = "gamma = 0 (pinned by the fit: the additions' cost could not be told apart from the copies')"
        return (
            f"c0 = {self.call_overhead * 1e6:.1f} us per call, alpha = {self.transfer_overhead * 1e6:.2f} us per "
            f"transfer, copies at {_rate(self.cached_bandwidth)} while P x message fits the "
            f"{self.cache_bytes // 2**20} MiB cache and {_rate(self.memory_bandwidth)} beyond, {gamma}"
        )


def _rate(bytes_per_s: float) -> str:
    """A fitted copy bandwidth; an infinite one is a beta the fit pinned to 0."""
    return f"{bytes_per_s / 1e9:.1f} GB/s" if bytes_per_s != float("inf") else "no measurable cost (pinned by the fit)"


def features(m: Measurement, cache_bytes: int) -> list[float]:
    """Regressors of ``c0, alpha, 1/cached_bw, 1/memory_bw, gamma`` for one measurement."""
    transfers = m.schedule.transfers
    moved = sum(t.count for t in transfers) * m.itemsize
    reduced = sum(t.count for t in transfers if t.kind is Kind.REDUCE) * m.itemsize
    cached = m.schedule.world_size * m.nbytes <= cache_bytes
    return [
        1.0,
        float(len(transfers)),
        float(moved) if cached else 0.0,
        0.0 if cached else float(moved),
        float(reduced),
    ]


def fit(measurements: Sequence[Measurement], cache_bytes: int | None = None) -> HostFit:
    """Least squares on relative error; constants that come out negative are pinned to 0."""
    cache = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    x = np.array([features(m, cache) for m in measurements])
    y = np.array([m.seconds for m in measurements])
    w = 1 / y
    free = [i for i in range(5) if x[:, i].any()]  # a regime with no measurement stays unfitted
    coef = np.zeros(5)
    while free:
        sol, *_ = np.linalg.lstsq(x[:, free] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    c0, alpha, beta_cached, beta_memory, gamma = coef
    # An unmeasured regime borrows the other's figure rather than claiming infinite speed.
    beta_cached = beta_cached or beta_memory
    beta_memory = beta_memory or beta_cached
    inf = float("inf")
    return HostFit(
        float(c0),
        float(alpha),
        1 / beta_cached if beta_cached else inf,
        1 / beta_memory if beta_memory else inf,
        float(gamma),
        cache,
    )


def measure(
    world_size: int,
    sizes: Sequence[int],
    algos: Sequence[str] = SCHEDULES,
    ops: Sequence[str] = OPS,
    trials: int = 3,
    target_s: float = 0.05,
) -> list[Measurement]:
    """Median time of each (algorithm, op, size) on ``world_size`` CPU devices."""
    comms = {a: build_in_process(a, ["cpu"] * world_size) for a in algos}
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
        topology = model.topology(m.schedule.world_size, m.nbytes)
        predicted = simulate(m.schedule, topology, m.itemsize).seconds
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
