"""The numerics guard: a non-finite loss or gradient stops the run before anything non-finite is saved."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lptrain.errors import ConfigError
from lptrain.exits import EXIT_DIVERGED
from lptrain.settings.locations import compose_config
from lptrain.train.checkpoint import load_checkpoint
from lptrain.train.numerics import NumericsError, gradient_verdict, nonfinite_entry
from lptrain.train.trainer import Trainer

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0", "data.workers=0"]
# Small and fast: two replicas of the small CNN, 8 images each. With this learning rate the
# loss is finite at step 1 and not finite a few steps later.
DIVERGING = [*QUIET, "trainer.devices=cpu*2", "trainer.batch_per_device=8", "optim.lr=1e6", "trainer.steps=12"]


def _all_finite(state) -> bool:
    if isinstance(state, torch.Tensor):
        return not state.is_floating_point() or bool(torch.isfinite(state).all())
    if isinstance(state, dict):
        return all(_all_finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(_all_finite(v) for v in state)
    return True


def test_a_diverging_run_stops_at_the_step_and_keeps_the_last_finite_checkpoint(tmp_path):
    trainer = Trainer(compose_config([*DIVERGING, "trainer.checkpoint_every=1"]), tmp_path)
    with pytest.raises(NumericsError) as caught:
        trainer.fit()
    message = str(caught.value)
    assert "\n" not in message
    assert "not finite" in message and ("loss" in message or "gradient" in message), message
    failed_step = int(message.split(" of step ")[1].split()[0])
    assert 1 < failed_step < 12, message
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert state["step"] < failed_step, (state["step"], message)
    assert _all_finite({k: state[k] for k in ("params", "buffers", "optimizer")})
    assert f"step {state['step']}" in message and "last.pt" in message, message


def test_a_run_that_diverges_before_its_first_checkpoint_writes_none(tmp_path):
    trainer = Trainer(compose_config([*DIVERGING, "trainer.checkpoint_every=0"]), tmp_path)
    with pytest.raises(NumericsError, match="no checkpoint of this run was saved"):
        trainer.fit()
    assert not (tmp_path / "checkpoints").exists()


def test_a_checkpoint_of_non_finite_weights_is_refused_and_the_previous_one_kept(tmp_path):
    trainer = Trainer(compose_config([*QUIET, "trainer.devices=cpu*2", "trainer.steps=2"]), tmp_path)
    trainer.save(1)
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    with torch.no_grad():
        trainer.replicas.params[0][5] = float("inf")
    with pytest.raises(
        NumericsError,
        match="the parameters after step 2 are not finite: not saved; the last good checkpoint is .*step 1",
    ):
        trainer.save(2)
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


def test_fp16_skipped_steps_are_not_divergence(tmp_path):
    """An fp16 overflow skips the step and halves the scale (normal); only the unscaled loss counts."""
    trainer = Trainer(
        compose_config([*QUIET, "trainer.devices=cpu*2", "trainer.batch_per_device=8", "trainer.precision=fp16"]),
        tmp_path,
    )
    trainer.stop_at = 2
    trainer.scaler.scale = 2.0**127  # every scaled gradient overflows: each step is skipped
    trainer.fit()
    assert trainer.scaler.skipped == 2


def test_the_gradient_verdict():
    assert gradient_verdict(torch.tensor([1.0, -2.0]).sum(), counts=True) == 0.0
    assert gradient_verdict(torch.tensor([1.0, float("nan")]).sum(), counts=True) == 1.0
    assert gradient_verdict(torch.tensor([float("inf"), -float("inf")]).sum(), counts=True) == 1.0
    assert gradient_verdict(torch.tensor([float("inf")]).sum(), counts=False) == 0.0  # not the root's
    assert gradient_verdict(None, counts=True) == 0.0  # fp16: the scaler's own test decides


def test_nonfinite_entry_names_the_key():
    state = {"params": torch.ones(3), "optimizer": {"state": {0: {"momentum_buffer": torch.tensor([float("nan")])}}}}
    assert nonfinite_entry(state) == "optimizer.state.0.momentum_buffer"
    assert nonfinite_entry({"params": torch.ones(3), "step": 4}) is None


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("key", ["optim.lr", "optim.weight_decay", "optim.gamma", "optim.min_lr"])
def test_optimizer_values_must_be_finite(key, value):
    with pytest.raises(ConfigError, match=f"{key}={value} is not valid"):
        compose_config([f"{key}={value}"])


def test_the_exit_code_of_a_diverged_run():
    from lptrain.cli import classify

    assert classify(NumericsError("the loss of step 3 is not finite")) == (
        EXIT_DIVERGED,
        "the loss of step 3 is not finite",
    )


@pytest.mark.slow
def test_the_command_line_stops_a_diverging_run_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "lptrain", *DIVERGING, "trainer.checkpoint_every=1", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == EXIT_DIVERGED, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("lptrain: error: the "), done.stderr
    assert "not finite" in errors[0]
    assert not (run_dir / "summary.json").exists()
    state = load_checkpoint(Path(run_dir) / "checkpoints" / "last.pt")
    assert _all_finite(state["params"])


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["allreduce", "reduce"])
def test_a_diverging_run_under_torchrun_stops_every_process_at_the_same_step(tmp_path, sync):
    """The gradient's verdict travels in the loss's sum across processes, so every rank
    reaches the same verdict at the same step (no rank trains on, or waits in a collective
    the others left), the root cause torchrun reports is the guard's code, and the last
    checkpoint is finite."""
    run_dir = tmp_path / "run"
    overrides = [*DIVERGING, "trainer.devices=cpu*1", f"trainer.sync={sync}", "trainer.checkpoint_every=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "lptrain", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", done.stderr)
    assert done.returncode != 0 and codes and codes[0] == str(EXIT_DIVERGED), done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lptrain: error: the ")]
    assert errors and all("not finite" in line for line in errors), done.stderr[-3000:]
    steps = {re.search(r"of step (\d+)", line).group(1) for line in errors}
    assert len(steps) == 1, errors  # every rank that said so stopped at the same step
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert _all_finite(state["params"]) and state["step"] < int(steps.pop())
