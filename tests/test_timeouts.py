"""Every wait across processes is bounded by the user's setting: a stalled or dead peer ends
the others with one line naming it and the operation, not a hang at the process group's own
(much longer) timeout. Ranks are started by hand from the environment, as a user's launcher
would (tests/timeout_workers.py); each stopped rank is resumed and killed by its pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HANG_BOUND_S = 60  # far past every timeout here: a process still waiting then is a hang


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(world: int, command: list[str], cwd: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    return [
        subprocess.Popen(
            command, cwd=cwd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for r in range(world)
    ]


def end(procs: list[subprocess.Popen]) -> list[str]:
    """Resume and kill whatever still runs, by pid; every rank's stderr."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
    return [proc.communicate()[1] for proc in procs]


def wait_until(done, bound_s: float, what: str) -> None:
    deadline = time.monotonic() + bound_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def survivors_end(procs: list[subprocess.Popen], ranks: list[int]) -> tuple[list[int], float]:
    """Wait up to HANG_BOUND_S for ``ranks`` to end: (those still running then, seconds waited)."""
    began = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: all(procs[r].poll() is not None for r in ranks), HANG_BOUND_S, "")
    return [r for r in ranks if procs[r].poll() is None], time.monotonic() - began


def stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.slow  # three processes start and one waits out the hook's timeout: some 20 s here
def test_the_ddp_hook_ends_on_a_stalled_peer_at_its_timeout_naming_it_and_the_desync_check(tmp_path):
    """Point 2 of the fault pass: three ranks with ``lptrain.ddp.state(algo="lp", timeout_s=5)``
    and a group whose own timeout is 600 s; rank 1 stops itself before a step, so ranks 0 and 2
    wait in that step's desync check. They must end at the hook's timeout (not the group's),
    each with one line naming rank 1 and the check."""
    procs = start_ranks(3, [sys.executable, str(HERE / "timeout_workers.py"), "hook", str(tmp_path)], tmp_path)
    still, took = [0, 2], None
    try:
        wait_until(lambda: stopped(procs[1].pid) or procs[1].poll() is not None, 120, "rank 1 never stopped itself")
        assert procs[1].poll() is None, procs[1].communicate()
        still, took = survivors_end(procs, [0, 2])
    finally:
        said = end(procs)
    assert not still, f"ranks {still} were still waiting {HANG_BOUND_S} s after rank 1 stopped (a hang)"
    print(f"ranks 0 and 2 ended {took:.1f} s after rank 1 stopped (timeout_s=5)")
    for r in (0, 2):
        lines = [line for line in said[r].splitlines() if line.strip()]
        print(f"rank {r}: {lines}")
        assert procs[r].returncode == 3 and len(lines) == 1, (procs[r].returncode, said[r][-3000:])
        line = lines[0]
        assert f"CollectiveError: rank {r}: the desync check before the allreduces of DDP step" in line, line
        assert "rank 1 stopped answering" in line, line


QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0", "trainer.checkpoint_every=0"]


@pytest.mark.slow  # three trainers start by hand: some 30 s on the 2-core machine
def test_the_store_hosts_death_is_one_line_naming_rank_0_with_no_cpp_stack(tmp_path):
    """Point 8 of the fault pass: ranks started by hand from the environment (no torchrun), so
    rank 0's process hosts the group's store; rank 0 is killed mid-training. Each survivor must
    end with exit code 3 and one line on stderr naming rank 0 as the store's host and the
    operation, with none of the C++ stack PyTorch's store client writes when its host is gone."""
    command = [sys.executable, "-m", "lptrain", "trainer.devices=cpu*1", "trainer.batch_per_device=8",
               "trainer.steps=100000", "trainer.log_every=1", "trainer.comm_timeout_s=20", *QUIET]  # fmt: skip
    runs = [tmp_path / f"run{r}" for r in range(3)]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="3")
    procs = [
        subprocess.Popen([*command, f"hydra.run.dir={runs[r]}"], cwd=tmp_path, env=dict(env, RANK=str(r)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(3)
    ]  # fmt: skip
    still, took = [1, 2], None
    try:
        steps = runs[0] / "steps.jsonl"
        wait_until(lambda: steps.exists() and len(steps.read_text().splitlines()) >= 3, 240, "no steps logged")
        os.kill(procs[0].pid, signal.SIGKILL)
        still, took = survivors_end(procs, [1, 2])
    finally:
        said = end(procs)
    assert not still, f"ranks {still} were still running {HANG_BOUND_S} s after rank 0 was killed"
    print(f"ranks 1 and 2 ended {took:.1f} s after rank 0 was killed")
    for r in (1, 2):
        lines = [line for line in said[r].splitlines() if line.strip()]
        print(f"rank {r}: {lines}")
        assert procs[r].returncode == 3, (procs[r].returncode, said[r][-3000:])
        assert len(lines) == 1, said[r][-3000:]
        assert lines[0].startswith(f"lptrain: error: rank {r}: "), lines[0]
        assert "rank 0 (the store's host) stopped answering" in lines[0], lines[0]


@pytest.mark.slow  # two processes start, and three operations each wait out 3 s and the heartbeats: some 30 s
def test_the_trainers_own_collectives_end_at_its_timeout_not_the_groups(tmp_path):
    """The stop agreement, the end-of-run comparison of the replicas and the barrier before
    leaving, on a group whose own timeout is 600 s with the trainer's bound at 3 s, and the
    other rank stopped: each ends with the error naming rank 1 and the operation, well before
    the group's timeout."""
    procs = start_ranks(2, [sys.executable, str(HERE / "timeout_workers.py"), "helpers", str(tmp_path)], tmp_path)
    try:
        wait_until(lambda: stopped(procs[1].pid) or procs[1].poll() is not None, 120, "rank 1 never stopped itself")
        with contextlib.suppress(AssertionError):
            wait_until(lambda: procs[0].poll() is not None, 2 * HANG_BOUND_S, "")
        ended = procs[0].poll() is not None
        out = procs[0].communicate(timeout=5)[0] if ended else ""
    finally:
        end(procs)
    assert ended, f"rank 0 was still waiting {2 * HANG_BOUND_S} s after rank 1 stopped (a hang)"
    print(out)
    said = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    for name, what in (("stop", "the stop check of step 2"), ("end", "the comparison of the replicas' weights"),
                       ("leave", "the barrier before leaving the process group")):  # fmt: skip
        line = said.get(name, "")
        assert f"rank 0: {what} failed: rank 1 stopped answering" in line, out
        assert float(line.split(" s: ", 1)[0]) < 30, line  # against the group's 600 s, not a timing


def test_the_store_clients_cpp_warnings_are_silenced_inside_the_quiet_block_only(capfd):
    """A store call that times out writes PyTorch's C++ warning lines to stderr; inside
    ``quiet_cpp_warnings`` the same call writes none, and still raises."""
    import datetime

    import torch.distributed as dist

    from lptrain.comm.cpp_log import quiet_cpp_warnings

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=0.2))
    said = {}
    for quiet in (False, True):
        capfd.readouterr()
        with pytest.raises(dist.DistStoreError), quiet_cpp_warnings() if quiet else contextlib.nullcontext():
            client.get("never-set")
        said[quiet] = capfd.readouterr().err
    assert "[W" in said[False], said  # the control: the client's warning is there
    assert "[W" not in said[True], said


def test_the_stores_host_is_rank_0_for_a_tcp_store_and_none_for_a_file_store_or_under_torchrun(tmp_path, monkeypatch):
    import torch.distributed as dist

    from lptrain.comm.liveness import store_host

    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert store_host(dist.PrefixStore("default_pg", server)) == 0
    assert store_host(dist.FileStore(str(tmp_path / "store"), 1)) is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # torchrun's agent hosts it
    assert store_host(dist.PrefixStore("default_pg", server)) is None
