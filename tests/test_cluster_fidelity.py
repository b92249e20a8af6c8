"""The emulated cluster's fidelity: links shaped so the host's CPU does not set the times,
the check at every start, and the refusal where the host cannot carry what was asked.

The shaping and the verdict are plain data, tested anywhere with injected figures; the
refusal runs ``lptrain-cluster`` end to end with the measurement injected; one real check
on a small cluster skips with the reason where network namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from lptrain.cluster import cli, fidelity
from lptrain.cluster.fidelity import Fidelity, FlowRate, check_flows, uplink_flows, uplink_loads
from lptrain.cluster.launch import Outcome
from lptrain.cluster.netns import allowed_congestion, list_namespaces
from lptrain.cluster.plan import (
    ACK_BYTES,
    EGRESS,
    GSO_BYTES,
    MTU,
    ClusterSpec,
    ClusterSpecError,
    Shaping,
    build_plan,
    parse_rate,
)
from lptrain.exits import EXIT_LOW_FIDELITY

CLUSTER = [sys.executable, "-m", "lptrain.cluster.cli"]
MBIT = 1_000_000


def _spec(**kw) -> ClusterSpec:
    return ClusterSpec(**{"nodes": 4, "link_bits": 200 * MBIT, **kw})


def _shaping_commands(plan, shaping: Shaping) -> list[tuple[str, ...]]:
    return [c for c in plan.commands if c[:3] == ("tc", "-n", shaping.namespace) and shaping.device in c]


def _value_after(command: tuple[str, ...], word: str) -> str:
    return command[command.index(word) + 1]


# ---------------------------------------------------------------- the links (no privilege)


def test_every_veth_end_and_bridge_has_the_large_mtu():
    """MTU 9000 everywhere: with one interface at 1500 the path falls back to 1500-byte packets."""
    plan = build_plan(_spec(layout="racks", racks=2), "lpc1")
    made = [c for c in plan.commands if "add" in c and c[c.index("add") - 1] == "link"]
    veths = [c for c in made if "veth" in c]
    bridges = [c for c in made if "bridge" in c]
    assert len(veths) == 4 + 1 and len(bridges) == 2  # a veth per node and per uplink, a bridge per rack
    for c in veths:  # both ends: the one made and its peer
        assert [c[i + 1] for i, w in enumerate(c) if w == "mtu"] == [str(MTU), str(MTU)], c
    for c in bridges:
        assert _value_after(c, "mtu") == str(MTU), c


def test_the_bucket_holds_two_gso_packets_and_a_fifo_queues_behind_each_data_class():
    """A bucket under one GSO packet makes the shaper cut every super-packet to the MTU: the
    host's softirq, not the link, then sets the time (50 KB at 200 Mbit/s did). Under either
    egress: ``shared`` has one data FIFO per port, ``per-peer`` one per destination at a
    node's own port (and one at the switch's end), ``per-pair`` also one per source at the
    switch's end."""
    for egress in EGRESS:
        for rate in ("10mbit", "200mbit", "1gbit", "10gbit"):
            plan = build_plan(_spec(link_bits=parse_rate(rate)), "lpc1", egress=egress)
            for shaping in plan.shaping:
                commands = _shaping_commands(plan, shaping)
                classes = [c for c in commands if "class" in c]
                assert len(classes) == 3 + len(shaping.peers), commands  # root, ACKs, a FIFO per data class
                for c in classes:
                    for bucket in ("burst", "cburst"):
                        assert int(_value_after(c, bucket)) >= 2 * GSO_BYTES
                    assert int(_value_after(c, "burst")) >= shaping.bits / 8 * 0.002  # 2 ms of a fast link
                root = [c for c in classes if _value_after(c, "parent") == "1:"]
                assert len(root) == 1
                assert _value_after(root[0], "rate") == _value_after(root[0], "ceil") == f"{shaping.bits}bit"
                fifos = [c for c in commands if "bfifo" in c]
                data = ["1:20", *shaping.peer_classes]
                assert sorted(_value_after(c, "parent") for c in fifos) == sorted(data)
                for fifo in fifos:
                    assert int(_value_after(fifo, "limit")) >= max(16 * GSO_BYTES, shaping.bits / 8 * 0.05)
                assert not any(w in c for c in commands for w in ("netem", "tbf", "fq", "sfq"))
            assert any(s.peers for s in plan.shaping) == (egress != "shared")
            switch_ends = [s for s in plan.shaping if s.namespace == plan.switch and not s.device.startswith("up")]
            assert all(bool(s.peers) == (egress == "per-pair") for s in switch_ends)


def test_acks_go_first_and_only_small_packets_are_taken_for_acks_by_the_shared_shaper():
    """``--egress shared`` takes every IP packet under ``ACK_BYTES`` for an ACK
    (tests/test_cluster_queues.py: ``per-peer``'s pure ACKs)."""
    plan = build_plan(_spec(), "lpc1", egress="shared")
    for shaping in plan.shaping:
        commands = _shaping_commands(plan, shaping)
        (root,) = [c for c in commands if "qdisc" in c and "root" in c]
        assert _value_after(root, "default") == "20"  # what no filter takes is data, in the FIFO
        (ack,) = [c for c in commands if "class" in c and _value_after(c, "classid") == "1:10"]
        (data,) = [c for c in commands if "class" in c and _value_after(c, "classid") == "1:20"]
        assert int(_value_after(ack, "prio")) < int(_value_after(data, "prio"))
        assert _value_after(ack, "ceil") == f"{shaping.bits}bit"  # ACKs may use the whole port
        (rule,) = [c for c in commands if "filter" in c]
        assert _value_after(rule, "flowid") == "1:10" and _value_after(rule, "at") == "2"  # IP's total length
        value, mask = int(rule[rule.index("u16") + 1], 0), int(rule[rule.index("u16") + 2], 0)
        for length in (40, 52, 64, ACK_BYTES - 1, ACK_BYTES, 1500, MTU, 65535):
            assert ((length & mask) == value) == (length < ACK_BYTES), length


def test_tcp_congestion_control_is_set_in_every_node_namespace_only_when_allowed():
    plan = build_plan(_spec(), "lpc1", "bbr")
    sysctls = [c for c in plan.commands if "sysctl" in c]
    assert sorted(c[3] for c in sysctls) == sorted(n.namespace for n in plan.nodes)
    for c in sysctls:
        assert c[:3] == ("ip", "netns", "exec") and c[-1] == "net.ipv4.tcp_congestion_control=bbr"
    assert "TCP bbr in every namespace" in plan.describe_links()
    plain = build_plan(_spec(), "lpc1", None)
    assert not any("sysctl" in c for c in plain.commands)
    assert "the host's default congestion control" in plain.describe_links()
    with pytest.raises(ClusterSpecError, match="congestion"):
        build_plan(_spec(), "lpc1", "bbr; rm -rf /")


def test_interleaved_placement_puts_node_i_in_rack_i_mod_racks():
    contiguous = _spec(nodes=8, layout="racks", racks=2)
    interleaved = _spec(nodes=8, layout="racks", racks=2, placement="interleaved")
    assert [contiguous.rack_of(i) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [interleaved.rack_of(i) for i in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert [_spec(nodes=7, layout="racks", racks=3, placement="interleaved").rack_of(i) for i in range(7)] == [
        0, 1, 2, 0, 1, 2, 0]  # fmt: skip
    plan = build_plan(interleaved, "lpc1")
    assert [n.rack for n in plan.nodes] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert ("ip", "-n", "lpc1-sw", "link", "set", "p3", "master", "br1", "up") in plan.commands
    assert "node i in rack i % 2" in plan.describe()
    with pytest.raises(ClusterSpecError, match="needs --layout racks"):
        _spec(placement="interleaved")
    with pytest.raises(ClusterSpecError, match="--placement"):
        _spec(layout="racks", placement="random")


# ---------------------------------------------------------------- the check's flows and verdict


def test_the_check_busies_every_port_both_ways_and_every_uplink():
    specs = (
        _spec(nodes=8),
        _spec(nodes=8, layout="racks", racks=4, uplink_bits=50 * MBIT),
        _spec(nodes=8, layout="racks", racks=2, placement="interleaved"),
        _spec(slow={2: 50 * MBIT}),
    )
    for spec in specs:
        flows = check_flows(spec)
        assert sorted(f.src for f in flows) == sorted(f.dst for f in flows) == list(range(spec.nodes))
        assert all(f.src != f.dst for f in flows)
        racks = {spec.rack_of(i) for i in range(spec.nodes)} - {0}
        each_way = [(f.uplinks, spec.rack_of(f.src)) for f in flows if f.uplinks]
        for rack in racks:  # one flow up and one down across each rack's uplink
            assert sum(rack in u and src == rack for u, src in each_way) == 1, (spec, flows)
            assert sum(rack in u and src != rack for u, src in each_way) == 1, (spec, flows)
        for f in flows:
            path = [spec.port_bits(f.src), spec.port_bits(f.dst)] + [spec.uplink_rate()] * len(f.uplinks)
            assert f.nominal_bits == min(path)
    assert {f.nominal_bits for f in check_flows(_spec(slow={2: 50 * MBIT})) if 2 in (f.src, f.dst)} == {50 * MBIT}


def _measured(spec: ClusterSpec, ratios: dict[int, float], softirq: float = 0.02) -> Fidelity:
    """Figures as the check would measure them: flow k carries ``ratios[k]`` (0.99 otherwise)."""
    flows = check_flows(spec)
    rates = tuple(FlowRate(f, ratios.get(k, 0.99) * f.nominal_bits) for k, f in enumerate(flows))
    return Fidelity(spec, rates, window_s=1.5, softirq=softirq, busy=0.5)


def test_the_verdict_passes_at_ninety_percent_and_refuses_below_saying_what_to_lower():
    spec = _spec(nodes=8)
    faithful = _measured(spec, {3: 0.90})
    assert faithful.passed and "faithful" in faithful.summary() and "90.0% of 200mbit" in faithful.summary()
    below = _measured(spec, {3: 0.85}, softirq=0.4)
    flow = check_flows(spec)[3]
    assert not below.passed and "BELOW FIDELITY" in below.summary()
    line = below.refusal()
    assert "\n" not in line
    assert f"node {flow.dst} received 85% of 200mbit from node {flow.src}" in line
    assert "softirq 40% of the CPU" in line and "lower --link or --nodes" in line and "--accept-low-fidelity" in line
    racks = _spec(nodes=8, layout="racks", racks=2, uplink_bits=100 * MBIT)
    across = next(k for k, f in enumerate(check_flows(racks)) if f.uplinks)
    refusal = _measured(racks, {across: 0.7}).refusal()
    assert "lower --link, --uplink or --nodes" in refusal and "70% of 100mbit" in refusal
    record = _measured(racks, {across: 0.7}).to_json(accepted=True)
    assert record["passed"] is False and record["accepted_below"] is True
    assert record["worst_ratio"] == pytest.approx(0.7) and len(record["flows"]) == 8
    assert json.loads(json.dumps(record)) == record


def test_the_uplink_check_loads_every_uplink_both_ways_with_several_flows_at_once():
    """The ring above puts one flow on each uplink direction; BE's exchanges and a tree's
    fan-out put several there, both ways at once. The uplink check sends every node's one
    flow to a node in another rack, so that each direction of each uplink carries as many
    flows as a rack has nodes (a permutation: every port sends one and receives one)."""
    specs = (
        (_spec(nodes=4, layout="racks", racks=2, uplink_bits=50 * MBIT), 2),
        (_spec(nodes=8, layout="racks", racks=2, uplink_bits=50 * MBIT), 4),
        (_spec(nodes=8, layout="racks", racks=4, uplink_bits=50 * MBIT), 2),
        (_spec(nodes=8, layout="racks", racks=2, placement="interleaved"), 4),
    )
    for spec, per_rack in specs:
        flows = uplink_flows(spec)
        assert sorted(f.src for f in flows) == sorted(f.dst for f in flows) == list(range(spec.nodes))
        assert all(spec.rack_of(f.src) != spec.rack_of(f.dst) for f in flows), (spec, flows)
        for rack in range(1, spec.racks):
            up = [f for f in flows if spec.rack_of(f.src) == rack]
            down = [f for f in flows if spec.rack_of(f.dst) == rack]
            assert len(up) == len(down) == per_rack, (spec, flows)
            assert all(rack in f.uplinks for f in up + down)
    assert uplink_flows(_spec(nodes=8)) == ()  # a star has no uplink


def _uplinks_measured(spec: ClusterSpec, bits: dict[tuple[int, int], float]) -> Fidelity:
    """A faithful ring, and the uplink check's flow (src, dst) at ``bits`` (its share otherwise)."""
    flows = uplink_flows(spec)
    share = spec.uplink_rate() / (spec.nodes // spec.racks)
    rates = [bits.get((f.src, f.dst), 0.99 * share) for f in flows]
    loads = uplink_loads(spec, tuple(FlowRate(f, b, window_bits=1.5 * b) for f, b in zip(flows, rates)), 1.5)
    ring = _measured(spec, {})
    return Fidelity(spec, ring.rates, window_s=1.5, softirq=0.02, busy=0.5, uplinks=loads)


def test_the_verdict_holds_each_uplink_direction_to_its_rate_whatever_the_split_between_flows():
    spec = _spec(nodes=4, layout="racks", racks=2, uplink_bits=100 * MBIT)
    uneven = _uplinks_measured(spec, {(2, 0): 70e6, (3, 1): 28e6})  # TCP splits unevenly: 98% in all
    assert uneven.passed and {(u.rack, u.toward_rack) for u in uneven.uplinks} == {(1, 0), (1, 1)}
    assert all(u.flows == 2 and u.nominal_bits == 100 * MBIT for u in uneven.uplinks)
    assert "every uplink loaded both ways at once (2 flows each way)" in uneven.summary()
    assert "the slowest direction carried 98.0% of 100mbit (rack 1 to rack 0)" in uneven.summary()
    below = _uplinks_measured(spec, {(0, 2): 40e6, (1, 3): 35e6})  # rack 0 to rack 1: 75% of the uplink
    assert not below.passed and below.worst.ratio >= 0.9 and "BELOW FIDELITY" in below.summary()
    line = below.refusal()
    assert "\n" not in line
    assert "the uplink from rack 0 to rack 1 carried 75% of 100mbit with 2 flows" in line, line
    assert "lower --uplink, --link or --nodes" in line and "--accept-low-fidelity" in line
    record = below.to_json()
    assert record["passed"] is False and record["worst_uplink_ratio"] == pytest.approx(0.75)
    assert {(u["rack"], u["toward_rack"], u["flows"]) for u in record["uplinks"]} == {(1, 0, 2), (1, 1, 2)}
    assert json.loads(json.dumps(record)) == record
    assert any("uplink from rack 0 to rack 1: 75.0mbit of 100mbit (75.0%), 2 flows" in x for x in below.lines())
    star = _measured(_spec(nodes=4), {})
    assert "uplink" not in star.summary() and star.to_json()["uplinks"] == []


def test_an_uplink_direction_is_what_its_flows_read_inside_the_window_not_the_sum_of_their_rates():
    """Flows that share an uplink take turns: one may get the link for a tenth of the window
    and read at ten times its share there. Each flow's rate is timed from its first read to its
    last, so the sum of the rates would count that burst as if it had lasted the whole window
    (the check read 193% of a 5 Mbit/s uplink that way); a direction is the bits that all its
    flows read inside the window, over the window."""
    spec = _spec(nodes=4, layout="racks", racks=2, uplink_bits=10 * MBIT)
    flows = {(f.src, f.dst): f for f in uplink_flows(spec)}
    burst = FlowRate(flows[(0, 2)], 20e6, window_bits=3e6)  # 2 Mbit in 0.1 s, and its first read's 1 Mbit
    steady = FlowRate(flows[(1, 3)], 7e6, window_bits=12e6)
    (down,) = [u for u in uplink_loads(spec, (burst, steady), 1.5) if u.toward_rack == 1]
    assert down.measured_bits == pytest.approx(10e6) and down.ratio == pytest.approx(1.0)
    report = {"bytes": 250_000, "seconds": 0.1, "window_bytes": 375_000}
    assert fidelity.flow_rate(flows[(0, 2)], report) == FlowRate(flows[(0, 2)], 20e6, window_bits=3e6)
    assert fidelity.flow_rate(flows[(0, 2)], {"bytes": 0, "seconds": 0.0}) == FlowRate(flows[(0, 2)], 0.0)


def test_the_probe_counts_every_read_inside_the_window_and_times_the_first_to_the_last(monkeypatch):
    from lptrain.cluster import probe

    class Reads:
        """A connection whose reads come at the given times with the given bytes."""

        def __init__(self, reads):
            self.reads = list(reads)

        def recv_into(self, buffer):
            if not self.reads:
                return 0
            at, n = self.reads.pop(0)
            clock[0] = at
            return n

    clock = [0.0]
    monkeypatch.setattr(probe.time, "monotonic", lambda: clock[0])
    got = probe.receive(Reads([(0.5, 100), (1.0, 300), (1.5, 500), (2.0, 700), (3.5, 900)]), (0.8, 2.2), 10.0)
    one = probe.receive(Reads([(0.5, 100), (1.0, 300), (3.5, 900)]), (0.8, 2.2), 10.0)
    assert got == {"bytes": 1200, "seconds": 1.0, "window_bytes": 1500}
    assert one == {"bytes": 0, "seconds": 0.0, "window_bytes": 300}


# ---------------------------------------------------------------- the refusal, end to end


class FakeCluster:
    """Stands for ``netns.Cluster`` where the test needs no namespaces: it records up and down."""

    made: list[FakeCluster] = []

    def __init__(self, plan) -> None:
        self.plan = plan
        self.calls: list[str] = []
        FakeCluster.made.append(self)

    def up(self) -> None:
        self.calls.append("up")

    def down(self) -> list[int]:
        self.calls.append("down")
        return []


@pytest.fixture
def handlers():
    """lptrain-cluster installs its signal handlers in this process: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _inject(monkeypatch, ratio: float, ran: list) -> None:
    monkeypatch.setattr(fidelity, "measure", lambda cluster, **kw: _measured(cluster.plan.spec, {1: ratio}))

    def run_on_cluster(cluster, launch, stop):
        ran.append(launch.command)
        return Outcome(0, "every node finished", {}, elapsed_s=0.1)

    monkeypatch.setattr(cli, "run_on_cluster", run_on_cluster)


def _no_privilege_needed(monkeypatch) -> None:
    monkeypatch.setattr(cli, "has_net_admin", lambda: True)
    monkeypatch.setattr(cli, "stale_prefixes", lambda: [])
    monkeypatch.setattr(cli, "Cluster", FakeCluster)
    FakeCluster.made.clear()


def test_a_host_below_fidelity_is_refused_with_exit_5_and_one_line(monkeypatch, capsys, tmp_path, handlers):
    _no_privilege_needed(monkeypatch)
    ran: list = []
    _inject(monkeypatch, 0.62, ran)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--nodes", "4", "--link", "1gbit", "--logs", str(tmp_path), "--", "true"])
    assert exit_.value.code == EXIT_LOW_FIDELITY == 5
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("lptrain-cluster: error: this host cannot emulate")
    assert "62% of 1gbit" in errors[0] and "lower --link or --nodes" in errors[0]
    assert not ran, "the command ran on a cluster the host cannot carry"
    (cluster,) = FakeCluster.made
    assert cluster.calls == ["up", "down"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.txt", "fidelity.json"]  # whole, no .part
    assert json.loads((tmp_path / "fidelity.json").read_text())["passed"] is False
    assert "BELOW FIDELITY" in (tmp_path / "cluster.txt").read_text()


def test_accept_low_fidelity_runs_on_and_says_the_figures_are_below_fidelity(monkeypatch, capsys, tmp_path, handlers):
    _no_privilege_needed(monkeypatch)
    ran: list = []
    _inject(monkeypatch, 0.62, ran)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--nodes", "4", "--accept-low-fidelity", "--logs", str(tmp_path), "--", "true"])
    assert exit_.value.code == 0 and len(ran) == 1
    err = capsys.readouterr().err
    assert "warning: below fidelity" in err and "every node finished (0.1 s; the figures are below fidelity)" in err
    assert "error" not in err
    assert json.loads((tmp_path / "fidelity.json").read_text())["accepted_below"] is True


def test_a_faithful_host_prints_the_check_first_and_runs_the_command(monkeypatch, capsys, tmp_path, handlers):
    _no_privilege_needed(monkeypatch)
    ran: list = []
    _inject(monkeypatch, 0.97, ran)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--nodes", "4", "--layout", "racks", "--placement", "interleaved", "--logs", str(tmp_path), "--",
                  "true"])  # fmt: skip
    assert exit_.value.code == 0 and len(ran) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("lptrain-cluster: 4 nodes, racks") and "MTU 9000" in lines[0]
    assert lines[1].startswith("lptrain-cluster: fidelity: with all 4 ports") and "faithful" in lines[1]
    text = (tmp_path / "cluster.txt").read_text()
    assert "placement: interleaved (node i in rack i % racks)" in text
    assert "node 1: lpc" in text and " rack 1\n" in text.split("node 1: ")[1].split("node 2")[0]
    assert "fidelity: " in text and text.count(" -> node ") == 4


def test_a_bad_fidelity_window_is_a_usage_error(tmp_path):
    run = subprocess.run(
        [*CLUSTER, "--fidelity-window", "0", "--", "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert run.returncode == 2 and "--fidelity-window must be a positive number" in run.stderr


# ---------------------------------------------------------------- real namespaces


def _namespace_problem() -> str | None:
    check = subprocess.run([*CLUSTER, "--check"], capture_output=True, text=True, timeout=60)
    if check.returncode != 0:
        return check.stderr.strip()
    if not cli.has_net_admin():
        return "needs CAP_NET_ADMIN in this process (root) to watch the namespaces"
    return None


needs_namespaces = pytest.mark.skipif(bool(_namespace_problem()), reason=str(_namespace_problem()))


@needs_namespaces
def test_a_refusal_on_a_real_cluster_leaves_no_namespace(monkeypatch, capsys, tmp_path, handlers):
    ran: list = []
    _inject(monkeypatch, 0.5, ran)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--nodes", "2", "--logs", str(tmp_path), "--", "true"])
    assert exit_.value.code == EXIT_LOW_FIDELITY and not ran
    assert "this host cannot emulate" in capsys.readouterr().err
    prefix = f"lpc{os.getpid()}-"
    assert not [n for n in list_namespaces() if n.startswith(prefix)]


@needs_namespaces
def test_the_real_check_on_three_nodes_in_interleaved_racks(tmp_path):
    """Every port and the uplink busy at once for half a second: each flow near its rate and
    never above it (the shaping holds), and the verdict in the first lines and the log folder."""
    proc = subprocess.Popen([*CLUSTER, "--nodes", "3", "--link", "100mbit", "--layout", "racks", "--placement",
                             "interleaved", "--fidelity-only", "--fidelity-window", "0.5", "--logs", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert lines[1].startswith("lptrain-cluster: fidelity: with all 3 ports") and "faithful" in lines[1], err
    record = json.loads((tmp_path / "fidelity.json").read_text())
    assert record["passed"] and len(record["flows"]) == 3 and 0 <= record["softirq"] <= 1
    assert sum(1 for f in record["flows"] if f["uplinks"]) == 2  # the uplink busy both ways
    assert len(record["uplinks"]) == 2 and "every uplink loaded both ways at once" in lines[1], err
    for uplink in record["uplinks"]:  # the uplink check: its rate each way (a sum of flows, each timed
        assert 0.9 <= uplink["ratio"] <= 1.05, uplink  # from its own first read to its last)
    for flow in record["flows"]:
        assert 0.9 <= flow["ratio"] <= 1.02, flow
    assert not [n for n in list_namespaces() if n.startswith(f"lpc{proc.pid}-")]


@needs_namespaces
@pytest.mark.skipif("reno" not in (allowed_congestion() or []), reason="the kernel lets no namespace choose reno")
def test_the_congestion_control_asked_for_is_the_one_every_node_gets(tmp_path):
    proc = subprocess.run([*CLUSTER, "--nodes", "2", "--congestion", "reno", "--fidelity-only", "--fidelity-window",
                           "0.3", "--logs", str(tmp_path)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "TCP reno in every namespace" in proc.stderr.splitlines()[0], proc.stderr
    assert "TCP reno in every namespace" in (tmp_path / "cluster.txt").read_text()
