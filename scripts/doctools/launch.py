"""Launching the processes a benchmark times: torchrun on loopback or lptrain-cluster's
emulated nodes, built here once, and what a run hands back read here once (the JSON line
rank 0 prints last, or an lptrain run's summary.json).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# What an lptrain run that is only timed leaves off: evaluation, checkpoints, the progress
# bar and TensorBoard's event files.
QUIET = (
    "trainer.eval_every=0",
    "trainer.checkpoint_every=0",
    "trainer.progress=false",
    "trainer.tensorboard=false",
)


def torchrun(nproc: int, *args: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node=NPROC ARGS`` with this interpreter (so that it
    does not matter which torchrun PATH holds)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def lptrain_cluster(*options: str) -> list[str]:
    """``lptrain-cluster OPTIONS --`` with this interpreter: what follows runs once per
    emulated node (one torchrun node per network namespace)."""
    return [sys.executable, "-m", "lptrain.cluster.cli", *options, "--"]


def last_json(stdout: str) -> dict | None:
    """The JSON object on the last line of ``stdout`` that starts with ``{`` (a script under
    torchrun prints its result there on rank 0, after whatever else it printed); None if
    no line does."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def json_result(argv: list[str]) -> dict | None:
    """Run ``argv`` to its end (an exit status other than 0 raises ``CalledProcessError``)
    and return :func:`last_json` of its standard output."""
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return last_json(done.stdout)


def lptrain_summary(launcher: list[str], run_dir: Path, *overrides: str) -> dict | None:
    """One ``lptrain`` run with ``overrides`` and :data:`QUIET`, started by ``launcher``
    (``[sys.executable]``, :func:`torchrun` or :func:`lptrain_cluster` followed by an
    interpreter), its run folder ``run_dir``: the summary.json it wrote, None if it wrote none."""
    command = [*launcher, "-m", "lptrain", *overrides, *QUIET, f"hydra.run.dir={run_dir}"]
    subprocess.run(command, capture_output=True, text=True, check=True)
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()) if summary.exists() else None


def step_rows(run_dir: Path) -> list[dict]:
    """Every step an lptrain run logged to its ``steps.jsonl``, in order."""
    text = (run_dir / "steps.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
