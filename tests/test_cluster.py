"""``lptrain-cluster``: the emulated cluster's plan, its command line, and real runs in namespaces.

The plan and the command line's checks need no privilege. The runs make network
namespaces (root, or a user namespace) and skip with ``lptrain-cluster --check``'s reason
where that is not possible. Every run is watched: the namespaces it made and every
process seen inside them must be gone when it returns, whatever the ending.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lptrain.cluster import cli
from lptrain.cluster.netns import ClusterError, _alive, list_namespaces, pids_in, run_commands, tc_batches
from lptrain.cluster.plan import ClusterSpec, ClusterSpecError, build_plan, format_rate, parse_rate

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = [sys.executable, "-m", "lptrain.cluster.cli"]
FIDELITY_WINDOW_S = 0.3


# ---------------------------------------------------------------- the plan (no privilege)


def test_a_star_gives_every_node_one_shaped_port_each_way_and_nothing_on_the_host():
    plan = build_plan(ClusterSpec(nodes=4, link_bits=parse_rate("200mbit")), "lpc1")
    assert plan.namespaces == ("lpc1-sw", "lpc1-n0", "lpc1-n1", "lpc1-n2", "lpc1-n3")
    assert [n.address for n in plan.nodes] == ["10.213.0.1", "10.213.0.2", "10.213.0.3", "10.213.0.4"]
    assert plan.master_address == "10.213.0.1"
    shaped = {(s.namespace, s.device): s.bits for s in plan.shaping}
    for n in plan.nodes:  # the node's end limits what it sends, the switch's end what it receives
        assert shaped[(n.namespace, "eth0")] == 200_000_000
        assert shaped[(plan.switch, n.port)] == 200_000_000
    assert len(plan.shaping) == 8
    for command in plan.commands:  # every command names one of the cluster's namespaces
        inside = command[:3] == ("ip", "netns", "exec")  # the per-namespace sysctl
        assert command[0] in ("ip", "tc") and (inside or command[1] == "-n")
        assert command[3 if inside else 2] in plan.namespaces
    assert not any("route" in c for c in plan.commands), "no route is added anywhere"
    assert plan.describe() == "4 nodes, star, 200mbit per node port"


def test_racks_are_joined_by_shaped_uplinks_and_a_slow_node_has_its_own_rate():
    spec = ClusterSpec(nodes=6, link_bits=parse_rate("1gbit"), layout="racks", racks=2,
                       uplink_bits=parse_rate("100mbit"), slow={4: parse_rate("250mbit")})  # fmt: skip
    plan = build_plan(spec, "lpc2")
    assert [n.rack for n in plan.nodes] == [0, 0, 0, 1, 1, 1]
    shaped = {(s.namespace, s.device): s.bits for s in plan.shaping}
    assert shaped[("lpc2-sw", "up1a")] == shaped[("lpc2-sw", "up1b")] == 100_000_000
    assert shaped[("lpc2-n4", "eth0")] == shaped[("lpc2-sw", "p4")] == 250_000_000
    assert shaped[("lpc2-n5", "eth0")] == 1_000_000_000
    masters = {tuple(c) for c in plan.commands if "master" in c}
    assert ("ip", "-n", "lpc2-sw", "link", "set", "p4", "master", "br1", "up") in masters
    assert ("ip", "-n", "lpc2-sw", "link", "set", "up1b", "master", "br1", "up") in masters
    assert "2 racks joined by 100mbit uplinks" in plan.describe() and "node 4 at 250mbit" in plan.describe()


def test_rates_read_as_tc_writes_them():
    assert parse_rate("200mbit") == 200_000_000 and parse_rate("1.5gbit") == 1_500_000_000
    assert parse_rate("64kbit") == 64_000 and format_rate(200_000_000) == "200mbit"
    for bad in ("fast", "200", "200mb/s", "-1mbit", "1bit"):
        with pytest.raises(ClusterSpecError):
            parse_rate(bad)
    with pytest.raises(ClusterSpecError, match="--nodes"):
        ClusterSpec(nodes=1, link_bits=10**8)
    with pytest.raises(ClusterSpecError, match="--racks"):
        ClusterSpec(nodes=3, link_bits=10**8, layout="racks", racks=4)
    with pytest.raises(ClusterSpecError, match="prefix"):
        build_plan(ClusterSpec(nodes=2, link_bits=10**8), "Bad Prefix")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nodes", "1", "--", "true"], "--nodes must be a whole number from 2 to 64"),
        (["--link", "fast", "--", "true"], "--link must be a rate such as 200mbit"),
        (["--slow", "7=10mbit", "--", "true"], "--slow names node 7"),
        (["--slow", "x", "--", "true"], "--slow takes NODE=RATE"),
        (["--link-down", "2@soon", "--", "true"], "--link-down takes NODE@SECONDS"),
        (["--timeout", "0", "--", "true"], "--timeout must be a positive number"),
        (["--stop-grace", "nan", "--", "true"], "--stop-grace must be a number of seconds"),
        (["--congestion", "no_such_cc", "--", "true"], "--congestion no_such_cc: a namespace may choose only"),
        (["--layout", "ring", "--", "true"], "argument --layout: invalid choice: 'ring'"),
        (["--egress", "fair", "--", "true"], "argument --egress: invalid choice: 'fair'"),
        (["--no-such-option", "--", "true"], "unrecognized arguments: --no-such-option"),
        ([], "give the command to run after --"),
        (["--", "no-such-program-anywhere"], "command 'no-such-program-anywhere' was not found"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_code_2(args, says, tmp_path):
    run = subprocess.run([*CLUSTER, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain-cluster: error: ") and says in lines[0], run.stderr


def test_without_the_privilege_to_make_namespaces_it_refuses_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "has_net_admin", lambda: False)
    monkeypatch.setattr(cli, "can_unshare_user", lambda: False)
    monkeypatch.setattr("lptrain.cluster.netns.has_net_admin", lambda: False)
    monkeypatch.setattr("lptrain.cluster.netns.can_unshare_user", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--nodes", "2", "--", "true"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "needs CAP_NET_ADMIN" in lines[0]


# ---------------------------------------------------------------- real clusters


def _namespace_problem() -> str | None:
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    check = subprocess.run([*CLUSTER, "--check"], capture_output=True, text=True, timeout=60)
    return None if check.returncode == 0 else check.stderr.strip()


needs_namespaces = pytest.mark.skipif(bool(_namespace_problem()), reason=str(_namespace_problem()))


class Watched:
    """An lptrain-cluster run, with every namespace and process it made recorded while it ran."""

    def __init__(self, args: list[str], cwd: Path, stop_after_s: float | None = None) -> None:
        # The fidelity check in a fraction of a second (test_cluster_fidelity.py tests the check itself).
        argv = [*CLUSTER, "--fidelity-window", str(FIDELITY_WINDOW_S), *args]
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.prefix = f"lpc{self.proc.pid}-"
        self.namespaces: set[str] = set()
        self.pids: set[int] = set()
        self._watching = True
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while self._watching:
            for name in list_namespaces():
                if name.startswith(self.prefix):
                    self.namespaces.add(name)
                    self.pids.update(pids_in(name))
            time.sleep(0.1)

    def wait_for_nodes(self, nodes: int, timeout_s: float = 60) -> None:
        """Until every node's namespace holds a process (the nodes have started)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            names = [n for n in list_namespaces() if n.startswith(self.prefix) and not n.endswith("-sw")]
            if len(names) == nodes and all(pids_in(n) for n in names):
                time.sleep(0.5)  # let the watcher record them
                return
            time.sleep(0.1)
        raise AssertionError("the nodes did not start")

    def finish(self, timeout_s: float = 300) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout_s)
        self._watching = False
        self._thread.join()
        left = [n for n in list_namespaces() if n.startswith(self.prefix)]
        assert not left, f"namespaces left behind: {left}"
        alive = [p for p in self.pids if _alive(p)]
        assert not alive, f"processes left behind: {alive}"
        assert self.namespaces, "the run made no namespace"
        return self.proc.returncode, out, err


@needs_namespaces
def test_the_benchmark_and_a_training_run_across_four_namespaces(tmp_path):
    rows_file = tmp_path / "rows.json"
    # Correctness, not figures: on a loaded host the fidelity check may find 1gbit out of
    # reach and refuse (tests/test_cluster_fidelity.py tests that); here the runs go on anyway.
    run = Watched(["--nodes", "4", "--link", "1gbit", "--accept-low-fidelity", "--logs", str(tmp_path / "bench"), "--",
                   "lptrain-bench", "--op", "all", "--algo", "lp,mst,be,ring,nccl", "-b", "64K", "-e", "256K",
                   "-n", "1", "--trials", "1", "--json", str(rows_file)], cwd=tmp_path)  # fmt: skip
    code, out, err = run.finish()
    assert code == 0, err[-3000:]
    assert len(run.namespaces) == 5  # four nodes and the switch
    rows = json.loads(rows_file.read_text())
    assert {r["algo"] for r in rows} == {"lp", "mst", "be", "ring", "gloo"}
    assert {r["op"] for r in rows} == {"allreduce", "broadcast", "reduce"}
    assert all(r["wrong"] == 0 and r["devices"] == 4 for r in rows)
    assert "# lptrain-bench allreduce: 4 x gloo process" in out  # rank 0's output, printed
    assert sorted(p.name for p in (tmp_path / "bench").iterdir()) == [
        "cluster.txt", "fidelity.json", "node0.log", "node1.log", "node2.log", "node3.log"]  # fmt: skip
    assert "every node finished" in err

    run = Watched(["--nodes", "4", "--link", "1gbit", "--accept-low-fidelity", "--logs", str(tmp_path / "train"), "--",
                   "lptrain", "comm=lp", "trainer.devices=cpu*1", "trainer.steps=3", "trainer.batch_per_device=8",
                   "trainer.eval_every=0", "trainer.progress=false", "trainer.tensorboard=false",
                   f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)  # fmt: skip
    code, out, err = run.finish()
    assert code == 0, err[-3000:]
    assert "4 processes" in out and "replicas        identical" in out, out[-2000:]
    assert (tmp_path / "run" / "steps.jsonl").exists()


@needs_namespaces
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_every_node_and_removes_every_namespace(tmp_path, sig, code):
    run = Watched(["--nodes", "3", "--logs", str(tmp_path / "logs"), "--", "sleep", "600"], cwd=tmp_path)
    run.wait_for_nodes(3)
    assert run.pids, "no process was seen inside the namespaces"
    began = time.monotonic()
    run.proc.send_signal(sig)
    returned, _, err = run.finish(timeout_s=60)
    assert returned == code, err
    assert time.monotonic() - began < 30
    assert f"stopped by {signal.Signals(sig).name}" in err


def _wait_for_steps(run: Watched, steps_file: Path, steps: int, timeout_s: float = 240) -> None:
    """Until the training run has logged ``steps`` steps (it is a few steps in)."""
    deadline = time.monotonic() + timeout_s
    while not steps_file.exists() or len(steps_file.read_text().splitlines()) < steps:
        assert run.proc.poll() is None, run.proc.communicate()
        assert time.monotonic() < deadline, f"{steps} steps were not logged in {timeout_s} s"
        time.sleep(0.1)


@needs_namespaces
@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_training_run_saves_its_checkpoint_before_the_cluster_ends(tmp_path, sig, code):
    """The first stop reaches every worker once: each finishes its step, rank 0 saves, and
    only then are the nodes ended and the namespaces removed."""
    run_dir = tmp_path / "run"
    run = Watched(["--nodes", "2", "--accept-low-fidelity", "--logs", str(tmp_path / "logs"), "--",
                   "lptrain", "trainer.devices=cpu*1", "trainer.steps=100000", "trainer.batch_per_device=16",
                   "trainer.checkpoint_every=0", "trainer.eval_every=0", "trainer.progress=false",
                   "trainer.tensorboard=false", f"hydra.run.dir={run_dir}"], cwd=tmp_path)  # fmt: skip
    try:
        _wait_for_steps(run, run_dir / "steps.jsonl", 3)
    except BaseException:
        for _ in range(2):  # a stop, then the escalation: the cluster ends and removes all it made
            run.proc.send_signal(signal.SIGINT)
        run.finish(timeout_s=120)
        raise
    run.proc.send_signal(sig)
    returned, out, err = run.finish(timeout_s=180)
    assert returned == code, err[-3000:]
    checkpoint = run_dir / "checkpoints" / "last.pt"
    assert checkpoint.is_file(), f"no checkpoint; rank 0 said: {out[-2000:]} {err[-2000:]}"
    assert "interrupted after step" in out and "resume with trainer.resume=" in out, out[-2000:]
    assert torch.load(checkpoint, weights_only=True)["step"] >= 3


@needs_namespaces
def test_a_failing_node_and_a_timeout_end_the_run_with_their_codes(tmp_path):
    script = '[ "$RANK" = 1 ] && { echo "node one gives up" >&2; exit 3; }; sleep 600'
    run = Watched(["--nodes", "3", "--grace", "1", "--logs", str(tmp_path / "a"), "--", "bash", "-c", script],
                  cwd=tmp_path)  # fmt: skip
    returned, _, err = run.finish(timeout_s=120)
    assert returned == 3, err
    assert "node 1 failed first (exit code 3): node one gives up" in err

    run = Watched(["--nodes", "2", "--timeout", "3", "--logs", str(tmp_path / "b"), "--", "sleep", "600"],
                  cwd=tmp_path)  # fmt: skip
    returned, _, err = run.finish(timeout_s=120)
    assert returned == 124 and "timed out after 3 s" in err, err


@needs_namespaces
def test_a_link_taken_down_mid_collective_is_named_by_every_other_rank(tmp_path):
    """Node 2's cable pulled while a ring allreduce runs: each other rank stops with one line
    naming the operation, the step, the peer it waited for and the rank that stopped
    answering, within the bench's --timeout and a few seconds of watching the heartbeats."""
    timeout_s = 5
    run = Watched(["--nodes", "4", "--grace", "30", "--logs", str(tmp_path / "logs"),
                   "--link-down", "2@1", "--link-down-cue", "# lptrain-bench allreduce", "--",
                   "lptrain-bench", "--op", "allreduce", "--algo", "ring", "-b", "4M", "-e", "4M", "-n", "100",
                   "--trials", "1", "--no-check", "--timeout", str(timeout_s)], cwd=tmp_path)  # fmt: skip
    returned, _, err = run.finish(timeout_s=180)
    assert returned == 3, err
    assert "took node 2's link down" in err
    for node in (0, 1, 3):
        log = (tmp_path / "logs" / f"node{node}.log").read_text()
        said = [line for line in log.splitlines() if line.startswith("lptrain-bench: error:")]
        assert len(said) == 1, log[-2000:]
        assert f"rank {node}: allreduce #" in said[0] and "(ring) step " in said[0], said[0]
        assert "rank " in said[0].split("step ")[1] and f"after at most {timeout_s:g} s" in said[0], said[0]
        assert "Traceback" not in log, log[-2000:]
        # Every survivor names the node whose link went down, whichever peer it waited for
        # (heartbeats in the store: lptrain.comm.liveness), not only the rank after it.
        assert "rank 2 stopped answering (last heartbeat" in said[0], said[0]
    node3 = (tmp_path / "logs" / "node3.log").read_text()
    assert "receiving from rank 2" in node3, "the rank after the dead node names it"


@needs_namespaces
def test_the_profile_names_a_node_on_a_quarter_rate_link(tmp_path):
    run = Watched(["--nodes", "4", "--link", "200mbit", "--slow", "2=50mbit", "--logs", str(tmp_path / "logs"), "--",
                   "python3", str(ROOT / "scripts" / "profile_dist.py"), "--links", "--size", "1M", "--iters", "1",
                   "--algo", "ring"], cwd=tmp_path)  # fmt: skip
    returned, out, err = run.finish(timeout_s=180)
    assert returned == 0, err[-3000:]
    assert "slow: rank 2's port" in out, out
    ports = [line.split() for line in out.splitlines() if line.startswith("port of")]
    # A neighbour's port is slow one way (it sends to or receives from rank 2); only rank 2's is slow both ways.
    best_way = {int(words[3].rstrip(":")): max(float(words[5]), float(words[8])) for words in ports}
    assert best_way[2] < 0.5 * min(best_way[r] for r in (0, 1, 3)), out


def test_the_environment_names_the_node_interface_for_gloo():
    from lptrain.cluster.launch import node_environment

    env = node_environment({"EXTRA": "1"})
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["EXTRA"] == "1"
    assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")


def test_each_namespaces_tc_commands_run_together_in_order_and_the_rest_alone():
    """A namespace's consecutive ``tc`` commands make one ``tc -batch``; an ``ip`` command, a
    change of namespace, or an argument a batch line would read otherwise starts a new group."""
    a = [
        ["tc", "-n", "a", "qdisc", "add", "dev", "x", "root", "handle", "1:", "htb"],
        ["tc", "-n", "a", "class", "add", "dev", "x", "parent", "1:", "classid", "1:1", "htb", "rate", "8kbit"],
    ]
    b = [["tc", "-n", "b", "qdisc", "del", "dev", "y", "root"]]
    odd = [["tc", "-n", "a", "filter", "add", "dev", "x", "match", "u32 0 0"]]  # a blank inside an argument
    ip = [["ip", "-n", "a", "link", "set", "x", "up"]]
    groups = tc_batches([*ip, *a, *b, *odd, *a, *ip])
    assert groups == [ip, a, b, odd, a, ip]  # fmt: skip
    plan = build_plan(ClusterSpec(nodes=16, link_bits=200_000_000), "lpcx")
    grouped = tc_batches(plan.commands)
    assert [c for g in grouped for c in g] == list(plan.commands)  # every command, in order
    assert len(grouped) < len(plan.commands) / 10  # per-pair's 1,632 tc commands in a few dozen batches


@pytest.mark.skipif(os.geteuid() != 0, reason="adding a network namespace needs root")
def test_a_failing_command_in_a_batch_is_named_and_the_rest_not_run():
    """The third of four ``tc`` commands fails (its parent does not exist): the error names it
    and what the kernel said, and the fourth never ran."""
    ns = f"lpt-batch{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        tc = ["tc", "-n", ns]
        commands = [
            ["ip", "-n", ns, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb"],
            [*tc, "qdisc", "add", "dev", "va", "root", "handle", "1:", "htb", "default", "20"],
            [*tc, "class", "add", "dev", "va", "parent", "1:", "classid", "1:1", "htb", "rate", "100mbit"],
            [*tc, "class", "add", "dev", "va", "parent", "9:", "classid", "1:2", "htb", "rate", "1mbit"],
            [*tc, "class", "add", "dev", "va", "parent", "1:1", "classid", "1:3", "htb", "rate", "1mbit"],
        ]
        with pytest.raises(ClusterError) as err:
            run_commands(commands)
        assert str(err.value).startswith(f"`tc -n {ns} class add dev va parent 9: classid 1:2 htb rate 1mbit` failed: ")
        assert "Command failed" not in str(err.value) and "\n" not in str(err.value)
        shown = subprocess.run([*tc, "class", "show", "dev", "va"], capture_output=True, text=True).stdout
        assert "1:1 " in shown and "1:3 " not in shown, shown
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)
