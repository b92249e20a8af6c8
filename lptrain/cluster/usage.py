"""What every shaped link of an emulated cluster carried while the command ran, and where it queued.

A schedule's time on the cluster is set by its busiest links, and a model of the links
(``lptrain.sim.dataflow``) says which those should be. ``lptrain-cluster --link-usage``
shows which they were: every ``interval_s`` it reads the switch namespace's queue
counters (one ``tc -s qdisc show``: bytes sent, drops and the bytes waiting in each data
FIFO), which hold every node's incoming port and, with racks, every uplink in both
directions (a node's outgoing port is shaped in its own namespace, not read here). Per
link it reports the share of its rate it carried while the cluster was busy, how often it
ran at its rate, how often data stood in its queue, the most that stood there, and its
drops: a link at its rate with a standing queue is a bottleneck, a link well below its rate
with an empty queue waits for something else (a sender's window, a dependency).

The counters are read by one process per interval, so the sampling costs the host one
``tc`` run every ``interval_s`` (0.25 s by default): off by default, not to move the times
it is asked to explain.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lptrain.cluster.plan import ClusterPlan

INTERVAL_S = 0.25  # between two readings, by default
AT_RATE = 0.9  # a link "at its rate" in an interval: at least this share of its nominal rate
BUSY_SHARE = 0.05  # the cluster is busy in an interval where any link carried this share of its rate

_FIFO = re.compile(r"^qdisc bfifo \S+ dev (\S+) ")
_SENT = re.compile(r"^\s*Sent (\d+) bytes \d+ pkt \(dropped (\d+),")
_BACKLOG = re.compile(r"^\s*backlog (\d+)b")


@dataclass(frozen=True)
class Counters:
    """One data FIFO's counters at one reading."""

    sent: int  # bytes, since the qdisc was made
    dropped: int  # packets
    backlog: int  # bytes waiting


def parse_qdisc_stats(text: str) -> dict[str, Counters]:
    """Each device's data FIFO counters from ``tc -s qdisc show``'s output (the ``bfifo``
    leaf ``lptrain.cluster.plan.Shaping`` puts behind each port's bucket, summed where a port
    keeps one per source or destination; ACKs, which go before them, are not counted)."""
    found: dict[str, Counters] = {}
    device, sent, dropped = None, 0, 0
    for line in text.splitlines():
        if m := _FIFO.match(line):
            device = m.group(1)
        elif device and (m := _SENT.match(line)):
            sent, dropped = int(m.group(1)), int(m.group(2))
        elif device and (m := _BACKLOG.match(line)):
            before = found.get(device, Counters(0, 0, 0))
            found[device] = Counters(before.sent + sent, before.dropped + dropped, before.backlog + int(m.group(1)))
            device = None
    return found


def link_names(plan: ClusterPlan) -> dict[str, tuple[str, int]]:
    """The switch namespace's shaped devices: each one's name for a reader and its rate in
    bits/s (``p3``: what node 3 receives; ``up2a``/``up2b``: rack 0 to rack 2 and back)."""
    node_of_port = {n.port: n.index for n in plan.nodes}
    names = {}
    for s in plan.shaping:
        if s.namespace != plan.switch:
            continue
        if s.device in node_of_port:
            names[s.device] = (f"node {node_of_port[s.device]} in", s.bits)
        elif s.device.startswith("up"):
            rack, end = s.device[2:-1], s.device[-1]
            names[s.device] = ((f"rack 0 to rack {rack}" if end == "a" else f"rack {rack} to rack 0"), s.bits)
    return names


@dataclass(frozen=True)
class LinkUsage:
    """One link over the busy part of the run (see the module docstring)."""

    name: str
    bits: int
    carried_bytes: int
    rate_share: float  # of its nominal rate, over the busy span
    at_rate_share: float  # of the busy intervals in which it ran at AT_RATE or more
    queued_share: float  # of the busy readings in which data stood in its FIFO
    max_backlog: int  # bytes
    drops: int  # packets

    def line(self) -> str:
        return (
            f"{self.name}: {self.rate_share:.0%} of {self.bits / 1e6:g} Mbit/s, at its rate {self.at_rate_share:.0%} "
            f"of the time, a queue {self.queued_share:.0%} (most {self.max_backlog // 1024} KiB), "
            f"{self.drops} drops"
        )


Reading = tuple[float, dict[str, Counters]]


def interval_share(before: Reading, after: Reading, device: str, bits: int) -> float | None:
    """What ``device`` carried between two readings, as a share of its nominal ``bits``/s
    (None where either reading lacks it)."""
    (t0, a), (t1, b) = before, after
    if device not in a or device not in b:
        return None
    return (b[device].sent - a[device].sent) * 8 / max(t1 - t0, 1e-9) / bits


def busy_span(readings: Sequence[Reading], names: dict[str, tuple[str, int]]) -> tuple[int, int] | None:
    """The first and last interval (index of its ending reading) in which any link carried
    ``BUSY_SHARE`` of its rate; None where none did."""
    busy = [
        i
        for i in range(1, len(readings))
        if any(
            (interval_share(readings[i - 1], readings[i], d, bits) or 0.0) >= BUSY_SHARE
            for d, (_, bits) in names.items()
        )
    ]
    return (busy[0], busy[-1]) if busy else None


def summarize(readings: Sequence[Reading], names: dict[str, tuple[str, int]]) -> list[LinkUsage]:
    """Every link's usage over the busy span of ``readings`` (none where nothing moved)."""
    span = busy_span(readings, names)
    if span is None:
        return []
    first, last = span
    out = []
    for device, (name, bits) in names.items():
        window = [r for r in readings[first - 1 : last + 1] if device in r[1]]
        if len(window) < 2:
            continue
        shares = [interval_share(x, y, device, bits) or 0.0 for x, y in zip(window, window[1:])]
        counters = [c[device] for _, c in window]
        out.append(
            LinkUsage(
                name,
                bits,
                counters[-1].sent - counters[0].sent,
                interval_share(window[0], window[-1], device, bits) or 0.0,
                sum(r >= AT_RATE for r in shares) / len(shares),
                sum(c.backlog > 0 for c in counters[1:]) / len(shares),
                max(c.backlog for c in counters),
                counters[-1].dropped - counters[0].dropped,
            )
        )
    return out


def read_switch(plan: ClusterPlan) -> str:
    """The switch namespace's queue counters, as ``tc`` prints them."""
    return subprocess.run(
        ["tc", "-n", plan.switch, "-s", "qdisc", "show"], capture_output=True, text=True, check=True, timeout=10
    ).stdout


class LinkSampler:
    """Reads the switch's counters every ``interval_s`` in a thread, from ``start`` to
    ``stop`` (which wakes the thread and waits for it: at most the reading in progress)."""

    def __init__(self, plan: ClusterPlan, interval_s: float = INTERVAL_S, cue: str | None = None,
                 read: Callable[[ClusterPlan], str] = read_switch) -> None:  # fmt: skip
        self.plan, self.interval_s, self.cue, self.read = plan, interval_s, cue, read
        self.names = link_names(plan)
        self.readings: list[Reading] = []
        self.cue_at: float | None = None  # when rank 0 first printed ``cue``
        self.error: str | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lptrain-link-usage", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=15)

    def seen(self, line: str) -> None:
        """Rank 0 printed ``line``: the summary counts from the first time it holds ``cue``."""
        if self.cue is not None and self.cue_at is None and self.cue in line:
            self.cue_at = time.monotonic()

    def counted(self) -> list[Reading]:
        """The readings the summary covers: all of them, or from the last one before the cue
        (none where the cue was asked for and never printed)."""
        if self.cue is None:
            return self.readings
        if self.cue_at is None:
            return []
        before = [i for i, (t, _) in enumerate(self.readings) if t <= self.cue_at]
        return self.readings[before[-1] if before else 0 :]

    def _run(self) -> None:
        while True:
            try:
                counters = parse_qdisc_stats(self.read(self.plan))
            except (OSError, subprocess.SubprocessError) as err:
                self.error = f"reading the switch's queue counters failed: {err}"
                return
            self.readings.append((time.monotonic(), counters))
            if self._stopped.wait(self.interval_s):
                return

    def usage(self) -> list[LinkUsage]:
        return summarize(self.counted(), self.names)

    def csv_text(self) -> str:
        """Every reading, a row per link: seconds from the first reading, the link, its
        rate in the interval before as a share of nominal, bytes waiting, drops so far."""
        rows = ["seconds,link,device,rate_share,backlog_bytes,drops"]
        t_first = self.readings[0][0] if self.readings else 0.0
        for before, after in zip(self.readings, self.readings[1:]):
            for device, (name, bits) in self.names.items():
                share = interval_share(before, after, device, bits)
                if share is not None:
                    c = after[1][device]
                    rows.append(f"{after[0] - t_first:.3f},{name},{device},{share:.4f},{c.backlog},{c.dropped}")
        return "\n".join(rows) + "\n"


def write_figure(sampler: LinkSampler, path: Path) -> bool:
    """A picture of the run: every link's share of its rate over time (a row per link), and
    where data stood in its queue. False where there is nothing to draw."""
    if len(sampler.readings) < 2 or not sampler.names:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(sampler.names)
    t_first = sampler.readings[0][0]
    times, shares, queued = [], [], []
    for before, after in zip(sampler.readings, sampler.readings[1:]):
        times.append(after[0] - t_first)
        shares.append([interval_share(before, after, d, sampler.names[d][1]) or 0.0 for d in devices])
        queued.append([after[1][d].backlog / 1024 if d in after[1] else 0.0 for d in devices])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 1.5 + 0.5 * len(devices)), sharex=True, layout="constrained")
    columns = list(zip(*shares))
    extent = (0, times[-1], -0.5, len(devices) - 0.5)
    image = top.imshow(
        columns, aspect="auto", origin="lower", vmin=0, vmax=1.05, interpolation="nearest", extent=extent
    )
    top.set_yticks(range(len(devices)), [sampler.names[d][0] for d in devices])
    top.set_title("share of each link's rate")
    if sampler.cue_at is not None:
        for axes in (top, bottom):
            axes.axvline(sampler.cue_at - t_first, color="red", linewidth=1)
    fig.colorbar(image, ax=[top, bottom])  # both axes narrowed alike, so their seconds line up
    for i, d in enumerate(devices):
        bottom.plot(times, [q[i] for q in queued], label=sampler.names[d][0])
    bottom.set_ylabel("KiB in the FIFO")
    bottom.set_xlabel("seconds")
    bottom.legend(fontsize="small", ncol=4)
    part = path.with_name(path.name + ".part.png")
    try:
        fig.savefig(part, dpi=90)
        part.replace(path)
    finally:
        plt.close(fig)
        part.unlink(missing_ok=True)
    return True
