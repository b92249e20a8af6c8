"""Errors that once ended in a traceback with exit code 1 end in one line and their code.

Each test is a command a user typed: a run folder on a read-only mount, a batch that no
machine's memory holds, a benchmark of 100 GB messages, a disk that fills while the steps
and TensorBoard's events are written. None of them allocates what it refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

QUIET = ["trainer.progress=false", "trainer.eval_every=0", "trainer.checkpoint_every=0"]


def command(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def mount_tmpfs(where: Path, options: str) -> bool:
    """A tmpfs at ``where`` (root only); False where it cannot be made."""
    where.mkdir(exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    return made.returncode == 0


def umount(where: Path) -> None:
    subprocess.run(["umount", str(where)], check=False, capture_output=True)


# -- a run folder lptrain cannot make ------------------------------------------------------------------


def test_a_run_folder_on_a_read_only_mount_is_one_line_naming_it_and_code_4(tmp_path):
    mount = tmp_path / "ro"
    if not mount_tmpfs(mount, "ro,size=1m"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        done = command("-m", "lptrain", f"hydra.run.dir={mount}/run", "trainer.steps=1", *QUIET, cwd=tmp_path)
    finally:
        umount(mount)
    said = lines(done.stderr)
    assert done.returncode == 4, done.stderr
    assert len(said) == 1, done.stderr  # before the fix: Hydra's traceback of its mkdir, exit code 1
    assert said[0].startswith("lptrain: error: cannot write") and f"{mount}/run" in said[0], said
    assert "Read-only file system" in said[0]


def test_a_default_run_folder_under_a_read_only_working_folder_is_one_line(tmp_path):
    mount = tmp_path / "ro"
    if not mount_tmpfs(mount, "ro,size=1m"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        done = command("-m", "lptrain", "trainer.steps=1", *QUIET, cwd=mount)
    finally:
        umount(mount)
    said = lines(done.stderr)
    assert done.returncode == 4 and len(said) == 1, done.stderr
    assert f"{mount}/outputs" in said[0] or "outputs" in said[0], said


# -- memory: refused before allocating, or caught -------------------------------------------------------

HUGE_BATCH = [
    "data=synthetic",
    "trainer.batch_per_device=1000000",
    "data.image_size=224",
    "model.image_size=224",
    "data.train_samples=4000000",  # so that the training set's size is not what refuses it
]


def test_a_batch_no_memory_holds_is_refused_in_one_line_before_anything_is_made(tmp_path):
    done = command("-m", "lptrain", *HUGE_BATCH, f"hydra.run.dir={tmp_path}/run", *QUIET, cwd=tmp_path)
    said = lines(done.stderr)
    assert done.returncode == 2, done.stderr  # before the fix: the allocator's RuntimeError, exit code 1
    assert len(said) == 1, done.stderr
    assert "trainer.batch_per_device" in said[0] and "memory" in said[0], said
    assert not (tmp_path / "run").exists()


def test_an_allocation_failure_at_run_time_is_one_line_naming_the_batch():
    from lptrain.cli import classify

    err = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 2408448000000 bytes. Error code 12 (Cannot allocate memory)"
    )
    said = classify(err)
    assert said is not None, "an allocation failure read as a bug"
    code, line = said
    assert code == 2 and "\n" not in line
    assert "2.2 TiB" in line and "trainer.batch_per_device" in line, line


def test_the_benchmark_refuses_messages_no_memory_holds_in_one_line(tmp_path):
    done = command("-m", "lptrain.bench.cli", "-b", "100G", "-e", "100G", "--devices", "2", cwd=tmp_path)
    said = lines(done.stderr)
    assert done.returncode == 2, done.stderr  # before the fix: the allocator's RuntimeError, exit code 1
    assert len(said) == 1 and said[0].startswith("lptrain-bench: error:"), done.stderr
    assert "-e 100.0 GiB" in said[0] and "memory" in said[0], said


def test_the_benchmark_turns_an_allocation_failure_into_one_line(monkeypatch, capsys):
    from lptrain.bench import cli

    def fails(args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes.")

    monkeypatch.setattr(cli, "run", fails)
    with pytest.raises(SystemExit) as ended:
        cli.main(["-b", "1K", "-e", "1K", "--devices", "2"])
    assert ended.value.code == 2
    said = lines(capsys.readouterr().err)
    assert len(said) == 1 and "1.0 GiB" in said[0], said


# -- a disk that fills while the run's logs are written ---------------------------------------------------


def test_a_full_disk_while_logging_is_one_line_naming_the_file_and_no_empty_failed_json(tmp_path):
    mount = tmp_path / "small"
    if not mount_tmpfs(mount, "size=40k"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    run_dir = mount / "run"
    try:
        args = ["trainer.steps=2000", "trainer.devices=1", "trainer.batch_per_device=2", "trainer.log_every=1"]
        done = command("-m", "lptrain", f"hydra.run.dir={run_dir}", *args, *QUIET, cwd=tmp_path)
        said = lines(done.stderr)
        assert done.returncode == 4, done.stderr
        assert len(said) == 1, done.stderr  # before the fix: TensorBoard's thread's traceback among them
        assert said[0].startswith(f"lptrain: error: cannot write {run_dir}/"), said
        assert "No space left on device" in said[0]
        failed = run_dir / "failed.json"
        if failed.exists():  # written whole, or not at all (before the fix: 0 bytes)
            assert json.loads(failed.read_text())["exit_code"] == 4
        assert not list(run_dir.glob(".*.tmp")), list(run_dir.iterdir())
    finally:
        umount(mount)


TENSORBOARD_FILLS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from lptrain.train.log import RunLog

    log = RunLog(Path(sys.argv[1]), tensorboard=True)
    try:
        for i in range(50):
            log.text(f"note{i}", "x" * 20000)  # TensorBoard's file only
        log.close()
    except OSError as err:
        print("raised:", err.filename, err.strerror, flush=True)
    """
)


def test_tensorboard_s_full_disk_is_raised_naming_its_file_and_its_thread_prints_nothing(tmp_path):
    mount = tmp_path / "small"
    if not mount_tmpfs(mount, "size=64k"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        done = command("-c", TENSORBOARD_FILLS, str(mount / "run"), cwd=tmp_path)
    finally:
        umount(mount)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, done.stderr
    assert f"raised: {mount}/run/tb/events.out.tfevents." in done.stdout, done.stdout
    assert "No space left on device" in done.stdout


# -- failed.json for every failure after the run folder is claimed -------------------------------------------

FAILS_IN_A_STEP = textwrap.dedent(
    """
    import sys
    from lptrain import cli
    from lptrain.comm.distributed import CollectiveError
    from lptrain.train.trainer import Trainer

    kind, run_dir = sys.argv[1:3]  # cli.main rewrites sys.argv for Hydra

    def fails(self, step, batches, timer):
        if kind == "bug":
            raise KeyError("injected bug")
        raise CollectiveError("rank 1 stopped answering during allreduce #3 (injected)")

    Trainer.train_step = fails
    cli.main([f"hydra.run.dir={run_dir}", "trainer.steps=2", "trainer.devices=1", "trainer.batch_per_device=2",
              "trainer.progress=false", "trainer.eval_every=0", "trainer.checkpoint_every=0",
              "trainer.tensorboard=false"])
    """
)


@pytest.mark.parametrize(("kind", "code"), [("bug", 1), ("peer", 3)])
def test_a_bug_or_a_failed_peer_leaves_failed_json_with_its_code(tmp_path, kind, code):
    run_dir = tmp_path / "run"
    done = command("-c", FAILS_IN_A_STEP, kind, str(run_dir), cwd=tmp_path)
    assert done.returncode == code, done.stderr
    failed = run_dir / "failed.json"
    assert failed.exists(), done.stderr  # before the fix: only exit codes 2 and 4 wrote one
    said = json.loads(failed.read_text())
    assert said["exit_code"] == code
    assert ("KeyError: 'injected bug'" if kind == "bug" else "rank 1 stopped answering") in said["error"], said


def test_a_checkpoint_of_another_model_is_refused_naming_its_path(tmp_path):
    import torch

    from lptrain.settings.locations import compose_config
    from lptrain.train.checkpoint import CheckpointError, save_checkpoint
    from lptrain.train.trainer import Trainer

    path = tmp_path / "other" / "last.pt"
    save_checkpoint(path, {"step": 1, "params": torch.zeros(10), "config": {"model": {"name": "alexnet"}}})
    config = compose_config(["trainer.devices=1", f"trainer.resume={path}", "trainer.tensorboard=false"])
    with pytest.raises(CheckpointError) as refused:
        Trainer(config, tmp_path / "run")
    assert str(path) in str(refused.value), refused.value  # before the fix: "checkpoint has 10 parameters ..."
    assert "alexnet" in str(refused.value)
