"""The failure policy (lptrain/exits.py): every failure ends promptly, in one line, with its code.

Each test is a failure a user met: an exception inside backward with overlap on, two
quick Ctrl-C's, one bad job of a sweep, a full disk while checkpointing, a run folder
lptrain did not create, two runs started in the same second, a checkpoint's temporary
file left by a killed save.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0"]


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lptrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# -- overlap: no thread left waiting ------------------------------------------------------------------

RAISE_IN_BACKWARD = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    import torch
    from lptrain.settings.locations import compose_config
    from lptrain.train.trainer import Trainer

    cfg = compose_config(["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0",
                          "trainer.checkpoint_every=0", "trainer.steps=6", "trainer.devices=2",
                          "trainer.batch_per_device=8", "trainer.bucket_mb=0.01", "trainer.overlap=true"])
    trainer = Trainer(cfg, Path(sys.argv[1]))
    calls = [0]

    def boom(grad):
        calls[0] += 1
        if calls[0] == 9:  # the second step, half-way through the second replica's backward
            raise RuntimeError("injected failure in backward")
        return grad

    for p in trainer.replicas.models[1].parameters():
        p.register_hook(boom)
    try:
        trainer.fit()
    except RuntimeError as err:
        print("raised:", err, flush=True)
    print("alive:", sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()), flush=True)
    """
)


def test_an_exception_inside_backward_with_overlap_on_leaves_no_thread_and_the_process_exits(tmp_path):
    script = tmp_path / "raise_in_backward.py"
    script.write_text(RAISE_IN_BACKWARD)
    # Before the fix the communication thread waited forever for backward_done() and the
    # interpreter joined it at exit: this timeout is what ended it.
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "raised: injected failure in backward" in result.stdout, result.stdout
    assert "alive: []" in result.stdout, result.stdout


def test_two_quick_ctrl_c_end_the_run_at_once_with_130(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lptrain", "trainer.steps=100000", "trainer.checkpoint_every=0",
         "trainer.bucket_mb=0.05", *QUIET, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "steps.jsonl").exists() or len((run_dir / "steps.jsonl").read_text().splitlines()) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)  # inside the same step: backward is most of it
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # before the fix: never (joined the waiting thread)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    # The second Ctrl-C aborts the step (the usual case) or, on a busy machine, arrives once the
    # first has finished the step and saved: either way one line and nothing after it.
    last = (err.strip().splitlines() or [""])[-1]
    assert last == "lptrain: interrupted" or "interrupted after step" in out, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]


# -- a sweep survives one failing job ------------------------------------------------------------------------


def tuning_file(path: Path, world_size: int) -> Path:
    rows = [{"op": "allreduce", "bytes": 1 << 20, "algo": algo, "options": {}, "time_us": t}
            for algo, t in (("ring", 900.0), ("lp", 1000.0))]  # fmt: skip
    path.write_text(json.dumps({"lptrain_tuning": 1, "executor": "in-process", "device_type": "cpu",
                                "world_size": world_size, "dtype": "float32", "rows": rows}))  # fmt: skip
    return path


def test_a_sweep_runs_every_job_when_one_fails_at_run_time_and_exits_non_zero_with_a_count(tmp_path):
    """Job 0 (four replicas) is refused at run time, its tuning file being for two ranks;
    job 1 (two replicas) is valid and must still run. Before the fix it never started."""
    tuning = tuning_file(tmp_path / "two.json", 2)
    sweep = tmp_path / "sweep"
    result = cli("-m", "trainer.devices=4,2", "comm=auto", f"comm.options.tuning={tuning}", "trainer.steps=2",
                 "trainer.checkpoint_every=0", *QUIET, f"hydra.sweep.dir={sweep}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    said = error_lines(result.stderr)
    assert len(said) == 2, result.stderr
    assert said[0].startswith("lptrain: error: job 0 (trainer.devices=4 ") and "does not describe this run" in said[0]
    assert said[1] == "lptrain: error: 1 of 2 jobs failed (job 0); the others ran"
    assert "Traceback" not in result.stderr
    assert (sweep / "1" / "summary.json").exists(), "the valid job did not run"
    failed = json.loads((sweep / "0" / "failed.json").read_text())
    assert failed["exit_code"] == 2 and "does not describe this run" in failed["error"]
    report = subprocess.run([sys.executable, "-m", "lptrain.report", str(sweep)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    failed_rows = [line for line in report.stdout.splitlines() if "FAILED" in line]
    assert len(failed_rows) == 1 and "trainer.devices=4" in failed_rows[0], report.stdout


# -- run folders: claimed atomically, never removed unless lptrain made them ----------------------------------


def test_a_refused_run_leaves_a_folder_the_user_made(tmp_path):
    """Refused at run time (an image folder with no classes, found once the data is read):
    the folder the user made stays; the default one lptrain made for it goes (a named one
    lptrain made goes too: tests/test_cli.py, the empty image folder)."""
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "images" / "val").mkdir()
    bad = ["data=imagefolder", f"data.root={tmp_path / 'images'}"]
    mine = tmp_path / "mine"
    mine.mkdir()
    result = cli(*bad, f"hydra.run.dir={mine}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(error_lines(result.stderr)) == 1 and "holds no class folders" in result.stderr
    assert mine.is_dir(), "lptrain removed a folder it did not create"
    result = cli(*bad, cwd=tmp_path)  # the default folder, claimed by lptrain: removed with its parents
    assert result.returncode == 2 and not (tmp_path / "outputs").exists()


def test_two_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    from lptrain.settings.rundirs import plan

    now = __import__("datetime").datetime(2026, 12, 4, 14, 30, 0)
    os.chdir(tmp_path)
    first, second = plan(["trainer.steps=1"], now), plan(["trainer.steps=1"], now)
    assert first.overrides == ["hydra.run.dir=outputs/2026-12-04/14-30-00"]
    assert second.overrides == ["hydra.run.dir=outputs/2026-12-04/14-30-00_1"]
    assert plan(["-m", "comm=lp,ring"], now).overrides == ["hydra.sweep.dir=multirun/2026-12-04/14-30-00"]
    # and for real: two lptrain processes at once, each with its own folder and steps
    procs = [subprocess.Popen([sys.executable, "-m", "lptrain", "trainer.steps=2", "trainer.checkpoint_every=2",
                               *QUIET], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").rglob("steps.jsonl"))
    assert len(runs) == 2, runs
    for run in runs:
        assert [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()] == [1, 2]


# -- checkpoints: a failed write says what it needed and where to resume; no temporary file left ---------------


def trainer_for(run_dir: Path, *overrides: str):
    from lptrain.settings.locations import compose_config
    from lptrain.train.trainer import Trainer

    return Trainer(compose_config([*QUIET, "trainer.devices=2", "trainer.batch_per_device=8", *overrides]), run_dir)


def test_a_temporary_file_of_a_killed_save_is_gone_after_the_resume(tmp_path):
    run_dir = tmp_path / "run"
    trainer_for(run_dir, "trainer.steps=4", "trainer.stop_at=2", "trainer.checkpoint_every=2").fit()
    left = run_dir / "checkpoints" / ".last.pt.k1ll3d.tmp"  # what a SIGKILL during torch.save leaves
    left.write_bytes(os.urandom(1 << 16))
    trainer_for(run_dir, "trainer.steps=4", "trainer.checkpoint_every=0", f"trainer.resume={run_dir}").fit()
    assert not left.exists()
    assert (run_dir / "checkpoints" / "last.pt").exists()


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    return made.returncode == 0


def test_a_full_disk_while_checkpointing_is_one_line_with_the_resume_line(tmp_path):
    """A 3 MiB file system: the first checkpoint (1.7 MiB) fits, the second cannot be written
    beside it. The first must stay, no temporary file, one line, exit code 4."""
    import torch

    from lptrain.cli import classify
    from lptrain.train.checkpoint import CheckpointWriteError

    small = tmp_path / "small"
    if not _can_mount_tmpfs(small):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        run_dir = small / "run"
        with pytest.raises(CheckpointWriteError) as caught:  # before the fix: torch's RuntimeError
            trainer_for(run_dir, "trainer.steps=4", "trainer.checkpoint_every=2").fit()
        last = run_dir / "checkpoints" / "last.pt"
        code, said = classify(caught.value)
        assert code == 4 and "\n" not in said
        assert said.startswith(f"could not write checkpoint {last}: No space left on device"), said
        assert "MiB free there" in said and "it needs about" in said
        assert f"the last good checkpoint is {last} (step 2): resume with trainer.resume={last}" in said
        assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt"]
        assert torch.load(last, weights_only=True)["step"] == 2
    finally:
        subprocess.run(["umount", str(small)], check=False)


# -- a dead or stopped peer under torchrun: every survivor names it and the operation ----------------------


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [item[5:] for item in env if item.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_every_survivor_names_the_peer_that_died_or_stopped_and_the_operation(tmp_path, how):
    """Three processes under torchrun; rank 1 is SIGKILLed (or SIGSTOPped) mid-training.
    Ranks 0 and 2 must each print one line naming rank 1 and the operation, and exit 3."""
    timeout_s = 5
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lptrain.cluster.node", "--standalone", "--nproc-per-node", "3", "-m", "lptrain",
         "trainer.devices=cpu*1", "trainer.batch_per_device=8", "trainer.steps=100000", "trainer.log_every=1",
         "trainer.checkpoint_every=0", f"trainer.comm_timeout_s={timeout_s}", *QUIET, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    victim = None
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "steps.jsonl").exists() or len((run_dir / "steps.jsonl").read_text().splitlines()) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        workers = {_rank_of(p): p for agent in _children(proc.pid) for p in [agent, *_children(agent)]}
        workers = {r: p for r, p in workers.items() if r is not None}
        assert set(workers) == {0, 1, 2}, workers
        victim = workers[1]
        began = time.monotonic()
        os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        while any(_running(workers[r]) for r in (0, 2)) and time.monotonic() - began < timeout_s + 60:
            time.sleep(0.1)
        took = time.monotonic() - began
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)  # the stopped one: torchrun would only SIGTERM it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(f"rank 1 {how}: the survivors ended {took:.1f} s later (comm_timeout_s={timeout_s})")
    said = [line for line in err.splitlines() if line.startswith("lptrain: error:")]
    print("\n".join(said))
    assert len(said) == 2, err[-4000:]
    for rank in (0, 2):
        line = next((s for s in said if s.startswith(f"lptrain: error: rank {rank}: ")), None)
        assert line is not None, said
        assert "rank 1 stopped answering (last heartbeat" in line, line
        assert any(op in line for op in ("allreduce #", "broadcast #", "the loss sum", "the stop check")), line
    assert "Traceback" not in err and "Error executing job" not in err, err[-4000:]
    assert took < timeout_s + 30, f"the survivors took {took:.0f} s"  # a bound against a hang, not a timing


def test_a_second_ctrl_c_during_the_checkpoint_write_is_an_interrupt_not_a_write_failure(tmp_path, monkeypatch):
    """The first Ctrl-C asks for a checkpoint; a second one arriving while torch.save writes it
    must abort (130, "lptrain: interrupted"), not read as a disk failure (4). Depending on
    where in torch's writer the handler's KeyboardInterrupt lands, it surfaces as itself or as
    the writer's RuntimeError (seen: "[enforce fail at inline_container.cc:672] . unexpected
    pos 2816 vs 2710"); the write below reproduces the second case."""
    import signal
    from types import SimpleNamespace

    from lptrain.train import checkpoint

    trainer = trainer_for(tmp_path / "run", "trainer.steps=6", "trainer.checkpoint_every=0")
    real_fdopen = checkpoint.os.fdopen

    class SecondCtrlC:
        def __init__(self, f):
            self.f, self.sent = f, False

        def write(self, data):
            if not self.sent:
                self.sent = True
                try:
                    signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, in the middle of the write
                except KeyboardInterrupt:
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from None
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, mode: SecondCtrlC(real_fdopen(fd, mode)))
    trainer._stop_signal = signal.SIGINT  # the first Ctrl-C: the step finishes, then the save
    previous = trainer._install_signal_handlers(SimpleNamespace(message=print))
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.save(3)
    finally:
        trainer._restore_signal_handlers(previous)
    assert checkpoint.temporary_files(trainer.checkpoint_path) == []
    assert not trainer.checkpoint_path.exists()


class _Writes(io.BytesIO):
    """A byte stream that records each write it is given (a pipe's write calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []

    def write(self, data) -> int:
        self.calls.append(bytes(data))
        return super().write(data)


def test_an_error_line_is_one_write_even_on_an_unbuffered_stderr(monkeypatch):
    """Under torchrun the workers' stderr is unbuffered (PYTHONUNBUFFERED): a line written as
    text, then its newline, lets another rank's line land between the two on the shared pipe
    (seen: two survivors' lines run together). One write of the whole line cannot be split."""
    from lptrain import cli

    raw = _Writes()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, write_through=True))
    cli._say("rank 0: the desync check failed")
    assert raw.calls == [b"lptrain: error: rank 0: the desync check failed\n"]
