"""Run one command on every node of an emulated cluster, and end all of it, whatever happens.

Each node runs ``lptrain.cluster.node`` (torchrun's launcher) inside its namespace, in a
session of its own, so a Ctrl-C reaches ``lptrain-cluster`` alone and it decides. The
first Ctrl-C (or SIGTERM) is passed on once to every node's launcher, which passes it on
once to its workers: a training run finishes its step, rank 0 saves the checkpoint, and
every process ends by itself. They get ``stop_grace_s`` seconds for it (torchrun's own
shutdown timeout is set to the same); a second Ctrl-C, or the end of the grace, ends them
at once. Whatever is still inside the cluster's namespaces then is ended by pid (SIGTERM,
then SIGKILL) before the namespaces are deleted. Rank 0's output is printed as it comes;
every node's output is kept in ``LOGS/node<i>.log``.

When one node fails the others get ``grace_s`` seconds to notice and stop by
themselves (each names what it was waiting for), then they are stopped. A node's link
can be taken down on cue (``LinkDown``) to test exactly that.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from lptrain.cluster.netns import Cluster
from lptrain.exits import EXIT_INTERRUPTED, EXIT_PIPE_CLOSED, EXIT_TERMINATED, EXIT_TIMEOUT

MASTER_PORT = 29500
STOP_GRACE_S = 60.0  # what a stopped run gets to finish its step and save, by default


@dataclass(frozen=True)
class LinkDown:
    """Take ``node``'s link down ``after_s`` seconds after rank 0 prints ``cue`` (or after launch)."""

    node: int
    after_s: float
    cue: str | None = None


class Watch(Protocol):
    """Something that observes the cluster while its nodes run (``lptrain.cluster.usage.LinkSampler``)."""

    def start(self) -> None: ...

    def seen(self, line: str) -> None: ...  # each line rank 0 prints, as it comes

    def stop(self) -> None: ...


@dataclass
class Launch:
    command: list[str]
    log_dir: Path
    nproc_per_node: int = 1
    timeout_s: float | None = None
    grace_s: float = 30.0
    stop_grace_s: float = STOP_GRACE_S
    link_down: LinkDown | None = None
    env: dict[str, str] = field(default_factory=dict)
    echo: TextIO | None = sys.stdout
    say: Callable[[str], None] = print  # lptrain-cluster's own one-line notes, as they happen
    watch: Watch | None = None  # started once every node is, stopped before the namespaces go (link usage)


@dataclass
class Outcome:
    """How the run ended: ``code`` is lptrain-cluster's exit code, ``reason`` one line."""

    code: int
    reason: str
    node_codes: dict[int, int | None]
    first_failure: int | None = None
    elapsed_s: float = 0.0


def node_environment(extra: dict[str, str], stop_grace_s: float = STOP_GRACE_S) -> dict[str, str]:
    """The workers' environment: gloo and NCCL on the node's one interface, one thread per
    process unless the user chose (several processes share this machine's cores), and
    torchrun's wait for stopped workers before it kills them set to the stop grace."""
    env = dict(os.environ)
    env.update({"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"})
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(math.ceil(stop_grace_s))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def node_argv(cluster: Cluster, node: int, launch: Launch) -> list[str]:
    plan = cluster.plan
    return [
        *cluster.exec_prefix(node),
        sys.executable, "-m", "lptrain.cluster.node",
        "--nnodes", str(len(plan.nodes)),
        "--node-rank", str(node),
        "--nproc-per-node", str(launch.nproc_per_node),
        "--master-addr", plan.master_address,
        "--master-port", str(MASTER_PORT),
        "--no-python", *launch.command,
    ]  # fmt: skip


class _Echo(threading.Thread):
    """Copies node 0's output to its log and to the console, and notices the link-down cue
    and a console whose reader has gone (``| head``: the run then stops, as on a signal);
    a ``Watch`` sees every line too."""

    def __init__(self, stream, log: Path, echo: TextIO | None, cue: str | None, watch: Watch | None = None) -> None:
        super().__init__(name="lptrain-cluster-echo", daemon=True)
        self.stream, self.log, self.echo, self.cue, self.watch = stream, log, echo, cue, watch
        self.cue_seen = threading.Event()
        self.reader_gone = threading.Event()

    def run(self) -> None:
        with open(self.log, "a", encoding="utf-8", errors="replace") as out:
            for line in iter(self.stream.readline, ""):
                out.write(line)
                out.flush()
                if self.echo is not None:
                    try:
                        self.echo.write(line)
                        self.echo.flush()
                    except BrokenPipeError:  # the log keeps every line; the console takes no more
                        self.echo = None
                        self.reader_gone.set()
                if self.cue is not None and self.cue in line:
                    self.cue_seen.set()
                if self.watch is not None:
                    self.watch.seen(line)


class Stop:
    """Signals turned into a request the run loop polls: the first asks the nodes to stop,
    a second skips the rest of the grace (``signum`` stays the first's)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0

    def __call__(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1

    def install(self) -> dict:
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, self)
        return previous


def run_on_cluster(cluster: Cluster, launch: Launch, stop: Stop | None = None) -> Outcome:
    """Start every node, wait for them (or the timeout, a failure, a signal), end them all."""
    stop = stop or Stop()
    env = node_environment(launch.env, launch.stop_grace_s)
    nodes = range(len(cluster.plan.nodes))
    procs: dict[int, subprocess.Popen] = {}
    files = []
    echo = None
    began = time.monotonic()
    outcome = Outcome(0, "", {i: None for i in nodes})
    try:
        for i in nodes:
            log = launch.log_dir / f"node{i}.log"
            if i == 0:
                proc = subprocess.Popen(
                    node_argv(cluster, i, launch), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
                )  # fmt: skip
                cue = launch.link_down.cue if launch.link_down else None
                echo = _Echo(proc.stdout, log, launch.echo, cue, launch.watch)
                echo.start()
            else:
                f = open(log, "w", encoding="utf-8")  # noqa: SIM115 - closed once the node has ended
                files.append(f)
                proc = subprocess.Popen(
                    node_argv(cluster, i, launch), env=env, stdout=f, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
            procs[i] = proc
        if launch.watch is not None:
            launch.watch.start()
        _wait(cluster, launch, procs, echo, stop, began, outcome)
    finally:
        if launch.watch is not None:
            launch.watch.stop()  # before the namespaces it reads are deleted
        for proc in procs.values():
            _stop_session(proc)
        cluster_pids = cluster.down()  # kills whatever is still inside, then deletes the namespaces
        for i, proc in procs.items():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process outside our namespaces
                proc.kill()
                proc.wait()
            if outcome.node_codes.get(i) is None:
                outcome.node_codes[i] = proc.returncode
        if echo is not None:
            echo.join(timeout=5)
        for f in files:
            f.close()
        if cluster_pids:
            launch.say(f"ended {len(cluster_pids)} process(es) left in the namespaces")
        outcome.elapsed_s = time.monotonic() - began
    return outcome


def _stop_session(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """``sig`` to the session the node was started in (its launcher, which passes it on to
    its workers: they run in sessions of their own), if it is still running."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def _passed_on(signum: int) -> int:
    """The signal the workers get for a stop: Ctrl-C as itself, anything else (SIGTERM,
    SIGHUP) as SIGTERM, the one other signal the trainer saves on."""
    return signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM


class _Stopping:
    """A stop in progress: passed on to every node once, then watched until they have all
    ended, the grace is over, or a second signal comes."""

    def __init__(self, launch: Launch, procs, stop: Stop, now: float) -> None:
        self.launch, self.stop, self.began = launch, stop, now
        self.name = signal.Signals(stop.signum).name
        passed = _passed_on(stop.signum)
        for proc in procs.values():
            _stop_session(proc, passed)
        launch.say(
            f"{self.name}: passed on to every node; the workers get {launch.stop_grace_s:g} s to finish "
            f"their step and save (--stop-grace), a second Ctrl-C ends them at once"
        )

    def over(self, outcome: Outcome, now: float) -> bool:
        """Whether to stop waiting; ``outcome`` then says how the stop went."""
        outcome.code = EXIT_INTERRUPTED if self.stop.signum == signal.SIGINT else EXIT_TERMINATED
        left = [i for i, code in outcome.node_codes.items() if code is None]
        how = None
        if not left:
            how = "every node ended by itself"
        elif self.stop.count > 1:
            how = f"a second signal ended node(s) {', '.join(map(str, left))} at once"
        elif now - self.began > self.launch.stop_grace_s:
            grace = self.launch.stop_grace_s
            how = f"node(s) {', '.join(map(str, left))} still running after the {grace:g} s grace were ended"
        if how is None:
            return False
        outcome.reason = f"stopped by {self.name}: {how}, and the namespaces removed"
        return True


def _poll_nodes(procs, outcome: Outcome, count_failures: bool) -> bool:
    """Record the nodes that have ended; whether one of them is the first to fail (a node
    ending while a stop is under way is the stop, not a failure)."""
    first = False
    for i, proc in procs.items():
        code = proc.poll()
        if code is not None and outcome.node_codes[i] is None:
            outcome.node_codes[i] = code
            if code != 0 and outcome.first_failure is None and count_failures:
                outcome.first_failure, first = i, True
    return first


def _wait(cluster: Cluster, launch: Launch, procs, echo, stop: Stop, began: float, outcome: Outcome) -> None:
    down = launch.link_down
    cue_time = None if (down and down.cue) else began
    failed_at = None
    stopping = None
    while True:
        now = time.monotonic()
        failed = _poll_nodes(procs, outcome, count_failures=stopping is None)
        if failed and failed_at is None:
            failed_at = now
        if stopping is None and stop.signum is not None:
            stopping = _Stopping(launch, procs, stop, now)
        if stopping is not None:
            if stopping.over(outcome, now):
                return
            time.sleep(0.05)
            continue
        if all(c is not None for c in outcome.node_codes.values()):
            break
        if down is not None:
            if cue_time is None and echo is not None and echo.cue_seen.is_set():
                cue_time = now
            if cue_time is not None and now - cue_time >= down.after_s:
                cluster.set_link(down.node, up=False)
                launch.say(f"took node {down.node}'s link down at {now - began:.1f} s")
                down = None
        if echo is not None and echo.reader_gone.is_set():
            outcome.code = EXIT_PIPE_CLOSED
            outcome.reason = "the console's reader closed it: every node was ended and the namespaces removed"
            return
        if launch.timeout_s is not None and now - began > launch.timeout_s:
            outcome.code = EXIT_TIMEOUT
            outcome.reason = f"timed out after {launch.timeout_s:g} s: every node was ended and the namespaces removed"
            return
        if failed_at is not None and now - failed_at > launch.grace_s:
            break
        time.sleep(0.05)
    failure = outcome.first_failure
    if failure is None:
        outcome.code, outcome.reason = 0, "every node finished"
        return
    outcome.code = outcome.node_codes[failure] or 1
    log = launch.log_dir / f"node{failure}.log"
    said = _last_line(log)
    outcome.reason = f"node {failure} failed first (exit code {outcome.code})" + (f": {said}" if said else "")


# torchrun's own log lines (glog style: "E1203 20:34:02.828000 6337 .../torch/distributed/elastic/...")
_LAUNCHER_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/elastic/")


def _last_line(path: Path) -> str:
    """The last line the node's command printed (not torchrun's own report of its exit)."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    said = [line for line in lines if not _LAUNCHER_LINE.match(line)]
    return said[-1] if said else ""
