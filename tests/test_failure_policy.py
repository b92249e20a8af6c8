"""The failure policy (lptrain/exits.py): every failure ends promptly, in one line, with its code.

Each test is a failure a user met: an exception inside backward with overlap on, two
quick Ctrl-C's, one bad job of a sweep, a full disk while checkpointing, a run folder
lptrain did not create, two runs started in the same second, a checkpoint's temporary
file left by a killed save.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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
    assert err.strip().splitlines()[-1] == "lptrain: interrupted", err[-3000:]
