"""``lptrain-cluster --link-usage``: what each shaped link carried and where data queued.

The counters' parsing, the summary and the sampler's thread need no privilege (a reader
stands in for ``tc``); one run in real namespaces checks the files, and skips with
``lptrain-cluster --check``'s reason where namespaces cannot be made.
"""

from __future__ import annotations

import subprocess
import threading

import pytest
from test_cluster import CLUSTER, Watched, needs_namespaces

from lptrain.cluster.plan import ClusterSpec, build_plan
from lptrain.cluster.usage import (
    Counters,
    LinkSampler,
    link_names,
    parse_qdisc_stats,
    summarize,
    write_figure,
)

# ``tc -s qdisc show`` in a switch namespace of 4 racks (trimmed): an htb root and its data FIFO per device.
TC_OUTPUT = """\
qdisc noqueue 0: dev lo root refcnt 2
 Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
qdisc htb 1: dev up1b root refcnt 3 r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000
 Sent 31307258 bytes 4153 pkt (dropped 0, overlimits 713 requeues 0)
 backlog 144224b 4p requeues 0
qdisc bfifo 9680: dev up1b parent 1:20 limit 1Mb
 Sent 31263390 bytes 3489 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 144224b 4p requeues 0
qdisc htb 1: dev p2 root refcnt 3 r2q 10 default 0x20 direct_packets_stat 0 direct_qlen 1000
 Sent 31313140 bytes 4232 pkt (dropped 3, overlimits 4 requeues 0)
 backlog 0b 0p requeues 0
qdisc bfifo 968a: dev p2 parent 1:20 limit 1250000b
 Sent 31266680 bytes 3528 pkt (dropped 3, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
"""


def test_the_data_fifos_counters_are_read_from_tcs_output():
    assert parse_qdisc_stats(TC_OUTPUT) == {
        "up1b": Counters(31263390, 0, 144224),
        "p2": Counters(31266680, 3, 0),
    }
    assert parse_qdisc_stats("") == {}


def test_a_port_with_a_fifo_per_source_counts_them_all():
    """``--egress per-pair`` gives the switch's port toward a node a FIFO per source: the
    port carried, dropped and held what all of them did."""
    second = """\
qdisc bfifo 968b: dev p2 parent 1:100 limit 1250000b
 Sent 1000 bytes 3 pkt (dropped 2, overlimits 0 requeues 0)
 backlog 9000b 1p requeues 0
"""
    assert parse_qdisc_stats(TC_OUTPUT + second)["p2"] == Counters(31267680, 5, 9000)


def test_links_are_named_by_what_they_carry():
    plan = build_plan(ClusterSpec(nodes=4, link_bits=200 * 10**6, layout="racks", racks=2, uplink_bits=50 * 10**6), "t")
    names = link_names(plan)
    assert names["p3"] == ("node 3 in", 200 * 10**6)
    assert names["up1a"] == ("rack 0 to rack 1", 50 * 10**6)
    assert names["up1b"] == ("rack 1 to rack 0", 50 * 10**6)
    assert len(names) == 4 + 2  # every node's incoming port, the one uplink both ways: all the switch shapes


def _readings(per_interval: list[dict[str, tuple[int, int]]], seconds: float = 1.0):
    """Readings one second apart from each interval's (bytes carried, backlog) per device."""
    sent: dict[str, int] = {}
    out = [(0.0, {d: Counters(0, 0, 0) for d in per_interval[0]})]
    for i, interval in enumerate(per_interval, 1):
        counters = {}
        for device, (carried, backlog) in interval.items():
            sent[device] = sent.get(device, 0) + carried
            counters[device] = Counters(sent[device], 0, backlog)
        out.append((i * seconds, counters))
    return out


def test_a_bottleneck_shows_at_its_rate_with_a_queue_and_a_waiting_link_below_it_with_none():
    rate = 8 * 10**6  # bits/s: a million bytes a second
    names = {"a": ("bottleneck", rate), "b": ("waiting", rate)}
    idle = {"a": (0, 0), "b": (0, 0)}
    busy = {"a": (10**6, 300_000), "b": (500_000, 0)}
    usage = {u.name: u for u in summarize(_readings([idle, idle, busy, busy, busy, busy, idle]), names)}
    a, b = usage["bottleneck"], usage["waiting"]
    # The span is the busy intervals alone: the idle ones before and after do not dilute it.
    assert a.rate_share == pytest.approx(1.0) and a.at_rate_share == 1.0 and a.queued_share == 1.0
    assert a.max_backlog == 300_000 and a.carried_bytes == 4 * 10**6
    assert b.rate_share == pytest.approx(0.5) and b.at_rate_share == 0.0 and b.queued_share == 0.0
    assert "bottleneck: 100% of 8 Mbit/s, at its rate 100% of the time, a queue 100% (most 292 KiB)" in a.line()
    assert summarize(_readings([idle, idle]), names) == []  # nothing moved: nothing to say


def test_the_sampler_reads_until_stopped_and_ends_on_a_failing_reader(tmp_path):
    plan = build_plan(ClusterSpec(nodes=2, link_bits=8 * 10**6), "t")
    calls = []
    carried = threading.Event()

    def read(_plan) -> str:
        calls.append(1)
        if len(calls) >= 3:
            carried.set()
        sent = 10**6 * len(calls)
        return "".join(
            f"qdisc bfifo 1: dev {d} parent 1:20 limit 1Mb\n Sent {sent} bytes 1 pkt (dropped 0, overlimits 0)\n"
            f" backlog {1000 * len(calls)}b 1p requeues 0\n"
            for d in ("p0", "p1")
        )

    sampler = LinkSampler(plan, 0.01, read=read)
    sampler.stop()  # before start: nothing to wait for
    sampler = LinkSampler(plan, 0.01, read=read)
    sampler.start()
    assert carried.wait(10)
    sampler.stop()
    assert not sampler._thread.is_alive() and sampler.error is None
    assert len(sampler.readings) >= 3
    assert {u.name for u in sampler.usage()} == {"node 0 in", "node 1 in"}
    csv = sampler.csv_text().splitlines()
    assert csv[0] == "seconds,link,device,rate_share,backlog_bytes,drops"
    assert len(csv) == 1 + 2 * (len(sampler.readings) - 1)
    assert write_figure(sampler, tmp_path / "links.png")
    assert (tmp_path / "links.png").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["links.png"]  # nothing half-written left

    def gone(_plan) -> str:  # the namespace went away under it
        raise subprocess.CalledProcessError(1, ["tc"])

    failing = LinkSampler(plan, 0.01, read=gone)
    failing.start()
    failing._thread.join(10)
    assert not failing._thread.is_alive() and "reading the switch's queue counters failed" in failing.error
    failing.stop()
    assert not write_figure(failing, tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_the_summary_counts_from_the_cue_when_one_is_given():
    plan = build_plan(ClusterSpec(nodes=2, link_bits=8 * 10**6), "t")
    sampler = LinkSampler(plan, cue="lptrain-bench allreduce")
    sampler.readings = [(float(t), {}) for t in range(5)]
    assert sampler.counted() == []  # asked for, never printed: nothing counted
    sampler.seen("# the transport as measured: 441 us per message")
    assert sampler.cue_at is None
    sampler.cue_at = 2.5  # as seen() would set it, between the third and the fourth reading
    sampler.seen("# lptrain-bench allreduce: again")  # only the first time counts
    assert sampler.cue_at == 2.5
    assert [t for t, _ in sampler.counted()] == [2.0, 3.0, 4.0]  # the interval the cue fell in, and on
    assert LinkSampler(plan).counted() is not None and LinkSampler(plan).cue is None


@pytest.mark.parametrize(
    "args, says",
    [
        (["--link-usage", "0"], "--link-usage must be a positive number of seconds, got 0.0"),
        (["--link-usage-from", "x"], "--link-usage-from counts the link usage from a cue: give --link-usage too"),
    ],
)
def test_bad_link_usage_arguments_are_one_line_and_exit_code_2(args, says, tmp_path):
    run = subprocess.run([*CLUSTER, *args, "--", "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], run.stderr


@needs_namespaces
def test_a_run_reports_what_each_link_carried(tmp_path):
    logs = tmp_path / "logs"
    run = Watched(["--nodes", "2", "--link", "100mbit", "--accept-low-fidelity", "--link-usage", "0.1",
                   "--link-usage-from", "lptrain-bench allreduce", "--logs", str(logs), "--",
                   "lptrain-bench", "--op", "allreduce", "--algo", "ring", "-b", "4M", "-e", "4M", "-n", "1",
                   "--trials", "2"], cwd=tmp_path)  # fmt: skip
    code, out, err = run.finish()
    assert code == 0, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("lptrain-cluster: link usage: ")]
    assert [line.split(": ")[2] for line in said] == ["node 0 in", "node 1 in"], err
    summary = (logs / "links.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["node 0 in", "node 1 in"]
    rows = (logs / "links.csv").read_text().splitlines()[1:]
    moved = {row.split(",")[2]: 0.0 for row in rows}
    for row in rows:
        moved[row.split(",")[2]] = max(moved[row.split(",")[2]], float(row.split(",")[3]))
    assert moved.keys() == {"p0", "p1"} and all(share > 0.5 for share in moved.values()), moved  # the ring's bytes
    assert (logs / "links.png").stat().st_size > 1000
    assert not [p for p in logs.iterdir() if p.name.endswith(".part") or ".part." in p.name]
