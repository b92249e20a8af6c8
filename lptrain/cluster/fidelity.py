"""Does the host carry the cluster it emulates? Measured at every start, in seconds.

An emulated link is only as fast as the host's CPU can move its packets: past some number
of nodes and rate, the shaped ports no longer set the time and every figure measured on
the cluster is the host's. So before the command runs, every port sends and receives raw
TCP at once (``lptrain.cluster.probe`` on each node), along a ring in rack order: each
node sends to the next and receives from the one before, so every port is busy both ways
and, with racks, every uplink carries one flow each way too. Each flow's rate is held
against what its path allows (the slowest of its two ports and the uplinks it crosses),
and the host's softirq share of the CPU is read from /proc/stat over the same window.

With racks a second window loads the uplinks as the collectives do: BE's exchanges and a
tree's fan-out send several connections across one uplink direction at once, both ways,
which the ring's one flow per direction does not exercise. Every node sends one flow to a
node of another rack (``uplink_flows``), so each direction of each uplink carries as many
flows as a rack has nodes, and each direction is held, as a whole, against the uplink's
rate (``UplinkRate``): how TCP splits it between the flows is not the link's business.
What it holds is the steady rate. The start of an exchange it does not time: two raw TCP
exchanges of 1 MiB each way across a 10 Mbit/s uplink, both ways on each connection,
took 0.94x to 1.77x their ideal time from run to run, on uplinks this check found at 99%.

Below ``THRESHOLD`` (90%) on any flow or uplink direction, ``lptrain-cluster`` refuses in
one line that says what to lower, unless ``--accept-low-fidelity`` is given; the output
then says the figures are below fidelity. TCP's payload is 99.3% of what the shaper counts at MTU 9000, so a
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
    """What one flow carried: its rate from its first read in the window to its last, and
    the bits of every read inside the window (``window_bits``; None where not known)."""

    flow: Flow
    measured_bits: float
    window_bits: float | None = None

    @property
    def ratio(self) -> float:
        return self.measured_bits / self.flow.nominal_bits


def flow_rate(flow: Flow, report: dict) -> FlowRate:
    """A probe's report (``lptrain.cluster.probe``: bytes, seconds, window_bytes) as a FlowRate."""
    bits = 8 * report["bytes"] / report["seconds"] if report["seconds"] > 0 else 0.0
    window = report.get("window_bytes")
    return FlowRate(flow, bits, None if window is None else 8.0 * window)


def format_measured(bits: float) -> str:
    """A measured rate in tc's units, to a tenth (``198.3mbit``)."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.1f}{unit}"
    return f"{bits:.0f}bit"


def _flow(spec: ClusterSpec, src: int, dst: int) -> Flow:
    """The flow from ``src`` to ``dst``, with the uplinks it crosses and its path's slowest rate."""
    racks = (spec.rack_of(src), spec.rack_of(dst))
    uplinks = tuple(r for r in racks if r != 0) if racks[0] != racks[1] else ()
    rates = [spec.port_bits(src), spec.port_bits(dst), *(spec.uplink_rate() for _ in uplinks)]
    return Flow(src, dst, min(rates), uplinks)


def uplink_flows(spec: ClusterSpec) -> tuple[Flow, ...]:
    """The uplink check's flows (none on a star): the nodes in rack order, each sending to the
    node a rack's length further on, so that every node sends one flow and receives one, and
    each flow leaves its rack. With racks of equal size every direction of every uplink then
    carries a rack's worth of flows at once."""
    if spec.layout != "racks":
        return ()
    order = sorted(range(spec.nodes), key=lambda i: (spec.rack_of(i), i))
    largest = max(sum(1 for i in order if spec.rack_of(i) == r) for r in {spec.rack_of(i) for i in order})
    shift = largest if 2 * largest <= spec.nodes else spec.nodes // 2
    return tuple(_flow(spec, src, order[(k + shift) % spec.nodes]) for k, src in enumerate(order))


@dataclass(frozen=True)
class UplinkRate:
    """One direction of one rack's uplink in the uplink check: from rack ``rack`` to rack 0
    (``toward_rack`` 0) or back (``toward_rack`` = ``rack``); what its ``flows`` carried in all,
    against the uplink's rate (or what the flows' ports allow, where that is less)."""

    rack: int
    toward_rack: int
    flows: int
    nominal_bits: int
    measured_bits: float

    @property
    def ratio(self) -> float:
        return self.measured_bits / self.nominal_bits

    def describe(self) -> str:
        source = self.rack if self.toward_rack == 0 else 0
        return f"rack {source} to rack {self.toward_rack}"


def uplink_loads(spec: ClusterSpec, rates: tuple[FlowRate, ...], window_s: float) -> tuple[UplinkRate, ...]:
    """Each uplink direction that the measured flows crossed, with what they carried together
    over the ``window_s`` window."""
    loads = []
    for rack in sorted({spec.rack_of(i) for i in range(spec.nodes)} - {0}):
        for toward in (0, rack):
            end = (lambda f: f.dst) if toward else (lambda f: f.src)  # the end of the flow in this rack
            crossing = [r for r in rates if rack in r.flow.uplinks and spec.rack_of(end(r.flow)) == rack]
            if not crossing:
                continue
            ports = sum(min(spec.port_bits(r.flow.src), spec.port_bits(r.flow.dst)) for r in crossing)
            nominal = min(spec.uplink_rate(), ports)
            loads.append(UplinkRate(rack, toward, len(crossing), nominal, _together(crossing, window_s)))
    return tuple(loads)


def _together(rates: list[FlowRate], window_s: float) -> float:
    """What flows sharing a link carried together: the bits all of them read inside the
    window, over the window. Flows take turns on a shared link, and a flow's own rate, timed
    from its first read to its last, counts a short burst as if it had lasted (the sum of the
    rates read 193% of a 5 Mbit/s uplink); timing the sum from the first read of any to the
    last drops each flow's first read, a quarter of what a flow carries in 1.5 s at
    1.25 Mbit/s. The sum of the rates where a flow's window is not known."""
    if any(r.window_bits is None for r in rates):
        return sum(r.measured_bits for r in rates)
    return sum(r.window_bits or 0.0 for r in rates) / window_s


def check_flows(spec: ClusterSpec) -> tuple[Flow, ...]:
    """A ring over the nodes in rack order: every port sends one flow and receives one, and
    every uplink carries one flow each way (racks hang off rack 0, so a flow from rack r to
    rack r + 1 crosses both their uplinks, one each way)."""
    order = sorted(range(spec.nodes), key=lambda i: (spec.rack_of(i), i))
    return tuple(_flow(spec, src, order[(k + 1) % len(order)]) for k, src in enumerate(order))


@dataclass(frozen=True)
class Fidelity:
    """What the check measured: each flow's rate, and the host's CPU over the same window."""

    spec: ClusterSpec
    rates: tuple[FlowRate, ...]
    window_s: float
    softirq: float  # softirq's share of the host's CPU time over the window
    busy: float  # the share not idle (any work, the machine's other work included)
    threshold: float = THRESHOLD
    uplinks: tuple[UplinkRate, ...] = ()  # the uplink check's directions (racks only)

    @property
    def worst(self) -> FlowRate:
        return min(self.rates, key=lambda r: r.ratio)

    @property
    def worst_uplink(self) -> UplinkRate | None:
        return min(self.uplinks, key=lambda u: u.ratio, default=None)

    @property
    def passed(self) -> bool:
        up = self.worst_uplink
        return self.worst.ratio >= self.threshold and (up is None or up.ratio >= self.threshold)

    def _uplink_part(self) -> str:
        crossing = [r.ratio for r in self.rates if r.flow.uplinks]
        if not crossing:
            return ""
        uplinks = len({u for r in self.rates for u in r.flow.uplinks})
        return f"; the flows across the {uplinks} uplink(s) {min(crossing):.1%} at the slowest"

    def _uplink_check_part(self) -> str:
        up = self.worst_uplink
        if up is None:
            return ""
        counts = sorted({u.flows for u in self.uplinks})
        flows = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        return (
            f"; every uplink loaded both ways at once ({flows} flows each way): the slowest direction carried "
            f"{up.ratio:.1%} of {format_rate(up.nominal_bits)} ({up.describe()})"
        )

    def summary(self) -> str:
        """One line: the slowest flow against its nominal rate, the median, the CPU."""
        w = self.worst
        verdict = "faithful" if self.passed else "BELOW FIDELITY"
        return (
            f"fidelity: with all {self.spec.nodes} ports sending and receiving at once for {self.window_s:.1f} s, "
            f"the slowest carried {w.ratio:.1%} of {format_rate(w.flow.nominal_bits)} (node {w.flow.dst} receiving "
            f"from node {w.flow.src}), the median {statistics.median(r.ratio for r in self.rates):.1%}"
            f"{self._uplink_part()}{self._uplink_check_part()}; softirq {self.softirq:.1%} of the CPU, "
            f"busy {self.busy:.0%}: {verdict} "
            f"(at least {self.threshold:.0%} of nominal is)"
        )

    def refusal(self) -> str:
        """The one line that refuses a cluster the host cannot carry, and says what to lower."""
        w, up = self.worst, self.worst_uplink
        if w.ratio >= self.threshold and up is not None:
            return (
                f"this host cannot emulate the cluster asked for: with every uplink loaded both ways at once, the "
                f"uplink from {up.describe()} carried {up.ratio:.0%} of {format_rate(up.nominal_bits)} with "
                f"{up.flows} flows ({format_measured(up.measured_bits)}; softirq {self.softirq:.0%} of the CPU), "
                f"below {self.threshold:.0%}: lower --uplink, --link or --nodes, or pass {OPTION} to run anyway "
                f"with figures below fidelity"
            )
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
        ] + [
            f"  uplink from {u.describe()}: {format_measured(u.measured_bits)} of {format_rate(u.nominal_bits)} "
            f"({u.ratio:.1%}), {u.flows} flows"
            for u in self.uplinks
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
            "worst_uplink_ratio": self.worst_uplink.ratio if self.uplinks else None,
            "uplinks": [{**asdict(u), "ratio": u.ratio} for u in self.uplinks],
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


def _start_probes(
    cluster: Cluster, flows: tuple[Flow, ...], timeout_s: float, port: int = PROBE_PORT
) -> dict[int, subprocess.Popen]:
    probes = {}
    nodes = cluster.plan.nodes
    for flow in flows:
        argv = [*cluster.exec_prefix(flow.src), sys.executable, "-m", "lptrain.cluster.probe",
                "--to", nodes[flow.dst].address, "--port", str(port), "--timeout", f"{timeout_s:g}"]  # fmt: skip
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


def _run_flows(
    cluster: Cluster, flows: tuple[Flow, ...], port: int, warmup_s: float, window_s: float, timeout_s: float
) -> tuple[tuple[FlowRate, ...], float, float]:
    """Every flow of ``flows`` at once (each node one out, one in): each flow's rate over the
    window, and the host's softirq and busy shares over it. A probe that fails is a
    ClusterError naming its node; every probe has ended on return."""
    probes = _start_probes(cluster, flows, timeout_s, port)
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
    return tuple(flow_rate(f, received[f.dst]) for f in flows), softirq, busy


def measure(
    cluster: Cluster, warmup_s: float = WARMUP_S, window_s: float = WINDOW_S, timeout_s: float = 30.0
) -> Fidelity:
    """Run the check on ``cluster`` (which is up): every flow of ``check_flows`` at once, then
    (racks) every flow of ``uplink_flows`` at once, on a port of its own."""
    spec = cluster.plan.spec
    rates, softirq, busy = _run_flows(cluster, check_flows(spec), PROBE_PORT, warmup_s, window_s, timeout_s)
    uplinks: tuple[UplinkRate, ...] = ()
    if spec.layout == "racks":
        loaded, _, _ = _run_flows(cluster, uplink_flows(spec), PROBE_PORT + 1, warmup_s, window_s, timeout_s)
        uplinks = uplink_loads(spec, loaded, window_s)
    return Fidelity(spec, rates, window_s, softirq, busy, uplinks=uplinks)
