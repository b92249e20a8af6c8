"""Does the host carry the cluster it emulates? Measured at every start, in seconds.

An emulated link is only as fast as the host's CPU can move its packets: past some number
of nodes and rate, the shaped ports no longer set the time and every figure measured on
the cluster is the host's. So before the command runs, every port sends and receives raw
TCP at once (``lptrain.cluster.probe`` on each node), along a ring in rack order: each
node sends to the next and receives from the one before, so every port is busy both ways
and, with racks, every uplink carries one flow each way too. Each flow's rate is held
against what its path allows (the slowest of its two ports and the uplinks it crosses),
and the host's softirq share of the CPU is read from /proc/stat over the same window.

Below ``THRESHOLD`` (90%) on any flow, ``lptrain-cluster`` refuses in one line that says
what to lower, unless ``--accept-low-fidelity`` is given; the output then says the figures
are below fidelity. TCP's payload is 99.3% of what the shaper counts at MTU 9000, so a
faithful host measures about 99%.

The verdict (``Fidelity``) is plain data, built from measured figures or from figures a
test injects; ``measure`` is the part that needs the namespaces.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lptrain.cluster.netns import Cluster, ClusterError
from lptrain.cluster.plan import ClusterSpec, format_rate

THRESHOLD = 0.90  # each flow's share of its nominal rate, every port busy, for a faithful cluster
WARMUP_S = 0.5  # TCP finds its rate before the window opens
WINDOW_S = 1.5  # the window whose bytes are counted
PROBE_PORT = 29400  # beside torchrun's 29500; the probes have ended before the command starts
OPTION = "--accept-low-fidelity"


@dataclass(frozen=True)
class Flow:
    """One flow of the check: ``src`` sends to ``dst``; ``uplinks``: the racks whose uplink
    it crosses; ``nominal_bits``: the slowest rate on its path."""

    src: int
    dst: int
    nominal_bits: int
    uplinks: tuple[int, ...] = ()


@dataclass(frozen=True)
class FlowRate:
    flow: Flow
    measured_bits: float

    @property
    def ratio(self) -> float:
        return self.measured_bits / self.flow.nominal_bits


def format_measured(bits: float) -> str:
    """A measured rate in tc's units, to a tenth (``198.3mbit``)."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.1f}{unit}"
    return f"{bits:.0f}bit"


def check_flows(spec: ClusterSpec) -> tuple[Flow, ...]:
    """A ring over the nodes in rack order: every port sends one flow and receives one, and
    every uplink carries one flow each way (racks hang off rack 0, so a flow from rack r to
    rack r + 1 crosses both their uplinks, one each way)."""
    order = sorted(range(spec.nodes), key=lambda i: (spec.rack_of(i), i))
    flows = []
    for k, src in enumerate(order):
        dst = order[(k + 1) % len(order)]
        racks = (spec.rack_of(src), spec.rack_of(dst))
        uplinks = tuple(r for r in racks if r != 0) if racks[0] != racks[1] else ()
        rates = [spec.port_bits(src), spec.port_bits(dst), *(spec.uplink_rate() for _ in uplinks)]
        flows.append(Flow(src, dst, min(rates), uplinks))
    return tuple(flows)


@dataclass(frozen=True)
class Fidelity:
    """What the check measured: each flow's rate, and the host's CPU over the same window."""

    spec: ClusterSpec
    rates: tuple[FlowRate, ...]
    window_s: float
    softirq: float  # softirq's share of the host's CPU time over the window
    busy: float  # the share not idle (any work, the machine's other work included)
    threshold: float = THRESHOLD

    @property
    def worst(self) -> FlowRate:
        return min(self.rates, key=lambda r: r.ratio)

    @property
    def passed(self) -> bool:
        return self.worst.ratio >= self.threshold

    def _uplink_part(self) -> str:
        crossing = [r.ratio for r in self.rates if r.flow.uplinks]
        if not crossing:
            return ""
        uplinks = len({u for r in self.rates for u in r.flow.uplinks})
        return f"; the flows across the {uplinks} uplink(s) {min(crossing):.1%} at the slowest"

    def summary(self) -> str:
        """One line: the slowest flow against its nominal rate, the median, the CPU."""
        w = self.worst
        verdict = "faithful" if self.passed else "BELOW FIDELITY"
        return (
            f"fidelity: with all {self.spec.nodes} ports sending and receiving at once for {self.window_s:.1f} s, "
            f"the slowest carried {w.ratio:.1%} of {format_rate(w.flow.nominal_bits)} (node {w.flow.dst} receiving "
            f"from node {w.flow.src}), the median {statistics.median(r.ratio for r in self.rates):.1%}"
            f"{self._uplink_part()}; softirq {self.softirq:.1%} of the CPU, busy {self.busy:.0%}: {verdict} "
            f"(at least {self.threshold:.0%} of nominal is)"
        )

    def refusal(self) -> str:
        """The one line that refuses a cluster the host cannot carry, and says what to lower."""
        w = self.worst
        lower = "--link, --uplink or --nodes" if w.flow.uplinks else "--link or --nodes"
        carried = format_measured(w.measured_bits)
        return (
            f"this host cannot emulate the cluster asked for: with all {self.spec.nodes} ports busy, node "
            f"{w.flow.dst} received {w.ratio:.0%} of {format_rate(w.flow.nominal_bits)} from node {w.flow.src} "
            f"({carried}; softirq {self.softirq:.0%} of the CPU), below {self.threshold:.0%}: lower {lower}, "
            f"or pass {OPTION} to run anyway with figures below fidelity"
        )

    def lines(self) -> list[str]:
        """Every flow, for cluster.txt."""
        return [
            f"  node {r.flow.src} -> node {r.flow.dst}: {format_measured(r.measured_bits)} of "
            f"{format_rate(r.flow.nominal_bits)} ({r.ratio:.1%})"
            + (f", across the uplink(s) of rack {', '.join(map(str, r.flow.uplinks))}" if r.flow.uplinks else "")
            for r in self.rates
        ]

    def to_json(self, accepted: bool = False) -> dict:
        """fidelity.json: the verdict, the CPU and every flow (rates in bits per second)."""
        return {
            "passed": self.passed,
            "accepted_below": accepted and not self.passed,
            "threshold": self.threshold,
            "worst_ratio": self.worst.ratio,
            "median_ratio": statistics.median(r.ratio for r in self.rates),
            "softirq": self.softirq,
            "busy": self.busy,
            "window_s": self.window_s,
            "nodes": self.spec.nodes,
            "layout": self.spec.layout,
            "link_bits": self.spec.link_bits,
            "flows": [
                {**asdict(r.flow), "uplinks": list(r.flow.uplinks), "measured_bits": r.measured_bits, "ratio": r.ratio}
                for r in self.rates
            ],
        }


def cpu_times() -> tuple[int, int, int]:
    """The host's CPU time so far, in ticks: (softirq, idle + iowait, total), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return fields[6], fields[3] + fields[4], sum(fields)


def _shares(before: tuple[int, int, int], after: tuple[int, int, int]) -> tuple[float, float]:
    softirq, idle, total = (a - b for a, b in zip(after, before))
    total = max(total, 1)
    return softirq / total, 1 - idle / total


def _start_probes(cluster: Cluster, flows: tuple[Flow, ...], timeout_s: float) -> dict[int, subprocess.Popen]:
    probes = {}
    nodes = cluster.plan.nodes
    for flow in flows:
        argv = [*cluster.exec_prefix(flow.src), sys.executable, "-m", "lptrain.cluster.probe",
                "--to", nodes[flow.dst].address, "--port", str(PROBE_PORT), "--timeout", f"{timeout_s:g}"]  # fmt: skip
        probes[flow.src] = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
    return probes


def _failure(node: int, probe: subprocess.Popen, what: str) -> ClusterError:
    probe.kill()
    _, err = probe.communicate()
    said = (err or "").strip().splitlines()
    return ClusterError(f"the fidelity check failed: node {node}'s probe {what}" + (f": {said[-1]}" if said else ""))


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def measure(
    cluster: Cluster, warmup_s: float = WARMUP_S, window_s: float = WINDOW_S, timeout_s: float = 30.0
) -> Fidelity:
    """Run the check on ``cluster`` (which is up): every flow of ``check_flows`` at once. A
    probe that fails is a ClusterError naming its node; every probe has ended on return."""
    spec = cluster.plan.spec
    flows = check_flows(spec)
    probes = _start_probes(cluster, flows, timeout_s)
    try:
        for node, probe in probes.items():
            if probe.stdout.readline().strip() != "ready":
                raise _failure(node, probe, "did not connect")
        start = time.monotonic() + 0.05
        for probe in probes.values():
            probe.stdin.write(f"go {start!r} {warmup_s!r} {window_s!r}\n")
            probe.stdin.flush()
        _sleep_until(start + warmup_s)
        before = cpu_times()
        _sleep_until(start + warmup_s + window_s)
        softirq, busy = _shares(before, cpu_times())
        received = {}
        for node, probe in probes.items():  # each probe reports what it received
            line = probe.stdout.readline()
            if not line.strip() or probe.wait(timeout=timeout_s) != 0:
                raise _failure(node, probe, "did not report")
            received[node] = json.loads(line)
    finally:
        for probe in probes.values():
            if probe.poll() is None:
                probe.kill()
            probe.wait()
            for stream in (probe.stdin, probe.stdout, probe.stderr):
                stream.close()
    rates = tuple(FlowRate(f, _bits_per_s(received[f.dst])) for f in flows)
    return Fidelity(spec, rates, window_s, softirq, busy)


def _bits_per_s(report: dict) -> float:
    return 8 * report["bytes"] / report["seconds"] if report["seconds"] > 0 else 0.0
