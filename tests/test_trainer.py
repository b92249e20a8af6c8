"""The BSP-SGD trainer: exactness, resumption, convergence, logs and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

from lptrain.comm import BackendUnavailableError
from lptrain.data import DataError
from lptrain.train.checkpoint import CheckpointError
from lptrain.train.trainer import ConfigError, Trainer

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.checkpoint_every=0", "trainer.eval_every=0"]


def config(*overrides: str):
    with initialize_config_module(version_base=None, config_module="lptrain.configs"):
        return compose("config", overrides=list(overrides))


def train(tmp_path: Path, *overrides: str) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(config(*QUIET, "trainer.log_every=1", *overrides), tmp_path)
    trainer.fit()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    return trainer, [json.loads(line) for line in lines]


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lptrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# -- BSP-SGD is exact -------------------------------------------------------------------------

ONE_DEVICE: dict[str, tuple] = {}


@pytest.mark.parametrize("sync", ["allreduce", "reduce"])
@pytest.mark.parametrize("comm", ["lp", "mst", "be", "ring"])
def test_p_replicas_match_one_device_with_the_p_times_larger_batch(tmp_path, comm, sync):
    common = [
        "optim.lr=0.05",
        "optim.weight_decay=0.0001",
        "trainer.steps=6",
        "optim.schedule=step",
        "optim.step_size=3",
        "optim.gamma=0.5",
    ]
    if "ref" not in ONE_DEVICE:
        ref, ref_log = train(tmp_path / "one", *common, "trainer.devices=cpu:1", "trainer.batch_per_device=32")
        ONE_DEVICE["ref"] = (ref.replicas.params[0].clone(), [m["loss"] for m in ref_log])
    ref_params, ref_losses = ONE_DEVICE["ref"]
    many, log = train(
        tmp_path / "many",
        *common,
        f"comm={comm}",
        f"trainer.sync={sync}",
        "trainer.devices=cpu:4",
        "trainer.batch_per_device=8",
    )
    losses = [m["loss"] for m in log]
    assert len(losses) == len(ref_losses) == 6
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert losses[-1] < losses[0]  # it did learn something: the comparison is not between two no-ops
    assert torch.allclose(many.replicas.params[0], ref_params, rtol=1e-4, atol=1e-6)
    assert many.replicas.identical()


def test_buckets_give_the_same_result_as_one_collective(tmp_path):
    one, _ = train(tmp_path / "a", "trainer.steps=3", "trainer.devices=cpu:3")
    bucketed, _ = train(tmp_path / "b", "trainer.steps=3", "trainer.devices=cpu:3", "trainer.bucket_mb=0.05")
    assert len(bucketed.buckets) > 3
    assert torch.allclose(one.replicas.params[0], bucketed.replicas.params[0], atol=1e-6)


# -- resuming --------------------------------------------------------------------------------------


def test_resume_gives_the_same_later_losses(tmp_path):
    full, log = train(
        tmp_path / "full", "trainer.steps=10", "trainer.checkpoint_every=4", "trainer.keep_checkpoints=true"
    )
    middle = tmp_path / "full" / "checkpoints" / "step_00000004.pt"
    resumed, later = train(tmp_path / "again", "trainer.steps=10", f"trainer.resume={middle}")
    assert [m["step"] for m in later] == list(range(5, 11))
    assert [m["loss"] for m in later] == [m["loss"] for m in log[4:]]
    assert torch.equal(resumed.replicas.params[0], full.replicas.params[0])


def test_stop_at_ends_early_on_the_full_schedule_and_a_resume_finishes_the_run(tmp_path):
    # A cosine schedule depends on trainer.steps: a run stopped at step 3 of 8 must see the
    # learning rates of the 8-step run, and its checkpoint must continue that run exactly.
    common = ["trainer.steps=8", "optim.schedule=cosine", "optim.lr=0.1"]
    full, log = train(tmp_path / "full", *common)
    short, first = train(tmp_path / "short", *common, "trainer.stop_at=3", "trainer.checkpoint_every=3")
    assert [m["step"] for m in first] == [1, 2, 3]
    assert [m["loss"] for m in first] == [m["loss"] for m in log[:3]]
    assert [m["lr"] for m in first] == [m["lr"] for m in log[:3]]
    assert short.steps == 8 and short.stop_at == 3  # a stop on the 8-step run, not a 3-step schedule
    resumed, rest = train(
        tmp_path / "rest", *common, f"trainer.resume={tmp_path / 'short' / 'checkpoints' / 'last.pt'}"
    )
    assert [m["loss"] for m in rest] == [m["loss"] for m in log[3:]]
    assert torch.equal(resumed.replicas.params[0], full.replicas.params[0])


@pytest.mark.parametrize("sync", ["allreduce", "reduce"])
def test_gradient_clipping_acts_on_the_averaged_gradient_and_keeps_replicas_identical(tmp_path, sync):
    # Clipping the averaged gradient is what one device with the P-times larger batch does.
    common = ["trainer.steps=4", "optim.clip_grad_norm=0.05", "optim.lr=0.05", f"trainer.sync={sync}"]
    one, ref = train(tmp_path / "one", *common, "trainer.devices=cpu:1", "trainer.batch_per_device=32")
    many, log = train(tmp_path / "many", *common, "trainer.devices=cpu:4", "trainer.batch_per_device=8")
    free, unclipped = train(
        tmp_path / "free",
        "trainer.steps=4",
        "optim.lr=0.05",
        f"trainer.sync={sync}",
        "trainer.devices=cpu:4",
        "trainer.batch_per_device=8",
    )
    assert all(m["grad_norm"] > 0.05 for m in log)  # the limit was hit, so clipping acted
    assert [m["loss"] for m in log] == pytest.approx([m["loss"] for m in ref], rel=1e-5)
    assert torch.allclose(many.replicas.params[0], one.replicas.params[0], rtol=1e-4, atol=1e-6)
    assert many.replicas.identical()
    assert log[-1]["loss"] != unclipped[-1]["loss"]


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before writing {path}: {proc.stderr.read()}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"no checkpoint after {timeout} s")
        time.sleep(0.05)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_run_killed_mid_way_resumes_exactly(tmp_path, how):
    args = [
        "trainer.steps=150",
        "trainer.checkpoint_every=10",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.tensorboard=false",
        "trainer.progress=false",
        "trainer.devices=cpu:2",
    ]
    full = cli(*args, f"hydra.run.dir={tmp_path / 'full'}", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "lptrain", *args, f"hydra.run.dir={tmp_path / 'cut'}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(tmp_path / "cut" / "checkpoints" / "last.pt", proc)
    proc.send_signal(how)
    out, err = proc.communicate(timeout=120)
    if how == signal.SIGINT:
        assert proc.returncode == 0, err
        assert "resume with trainer.resume=" in out
    else:
        assert proc.returncode == -signal.SIGKILL
    stopped_at = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert 10 <= stopped_at < 150, "the run was not interrupted mid-way"
    again = cli(*args, f"trainer.resume={tmp_path / 'cut'}", f"hydra.run.dir={tmp_path / 'again'}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    full_losses = {m["step"]: m["loss"] for m in map(json.loads, (tmp_path / "full" / "metrics.jsonl").open())}
    later = [json.loads(line) for line in (tmp_path / "again" / "metrics.jsonl").open()]
    assert later[0]["step"] == stopped_at + 1 and later[-1]["step"] == 150
    assert all(m["loss"] == full_losses[m["step"]] for m in later)
    final = torch.load(tmp_path / "again" / "checkpoints" / "last.pt", weights_only=True)
    reference = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    assert torch.equal(final["params"], reference["params"])


# -- convergence and logs ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_main_job_alexnet_recipe_learns_the_digits(tmp_path):
    # The README's first command; about five minutes on two cores (92.4% when measured).
    trainer = Trainer(config("+recipe=alexnet", "trainer.progress=false", "trainer.checkpoint_every=0"), tmp_path)
    summary = trainer.fit()
    assert summary.eval_accuracy > 0.85, f"eval accuracy {summary.eval_accuracy:.3f} (chance is 0.10)"
    assert summary.replicas_identical


@pytest.mark.parametrize("comm", ["lp", "mst", "be", "ring"])
def test_the_default_recipe_learns_the_embedded_digits(tmp_path, comm):
    trainer = Trainer(
        config(
            f"comm={comm}",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            "trainer.steps=120",
            "trainer.eval_every=120",
            "trainer.checkpoint_every=0",
        ),
        tmp_path,
    )
    summary = trainer.fit()
    assert summary.eval_accuracy > 0.85, f"{comm}: eval accuracy {summary.eval_accuracy:.3f} (chance is 0.10)"
    assert summary.replicas_identical


def test_tensorboard_event_files_hold_the_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    Trainer(
        config(
            "trainer.steps=4",
            "trainer.log_every=2",
            "trainer.eval_every=4",
            "trainer.progress=false",
            "trainer.checkpoint_every=0",
            "trainer.devices=cpu:2",
        ),
        tmp_path,
    ).fit()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/accuracy",
        "eval/accuracy",
        "eval/loss",
        "time/data_ms",
        "time/compute_ms",
        "time/comm_ms",
        "comm/bandwidth_GBps",
        "throughput/images_per_s",
        "optim/lr",
    }
    assert expected <= tags, expected - tags
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4]
    assert all(e.value > 0 for e in acc.Scalars("time/comm_ms"))
    hparams = list((tmp_path / "tb").glob("hparams/events.out.tfevents.*"))
    assert hparams, "no hparams run for sweeps"


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["trainer.global_batch=10", "trainer.devices=cpu:4"], ConfigError, "does not split across 4 devices"),
        (["trainer.devices=cuda:2"], BackendUnavailableError, "needs CUDA"),
        (["comm=nccl"], BackendUnavailableError, "nccl communicator needs CUDA"),
        (["data=cifar10", "data.root=/nonexistent/cifar"], DataError, "CIFAR-10 was not found under /nonexistent"),
        (["data=imagefolder", "data.root=/nonexistent/img"], DataError, "does not exist"),
        (["trainer.sync=gossip"], ConfigError, "valid modes: allreduce, reduce"),
        (["optim.clip_grad_norm=-1"], ConfigError, "optim.clip_grad_norm=-1 is not valid"),
        (
            ["trainer.steps=5", "trainer.stop_at=9"],
            ConfigError,
            "trainer.stop_at=9 is not valid; use a step from 1 to 5",
        ),
        (["model.init=xavier"], ValueError, "unknown model.init 'xavier'; valid choices: default, kaiming"),
        (["trainer.devices=cpu:0"], ValueError, "device spec 'cpu:0' is not valid"),
    ],
)
def test_bad_configuration_fails_clearly(tmp_path, overrides, error, message):
    if "cuda" in " ".join(overrides) and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(error, match=message):
        Trainer(config(*QUIET, *overrides), tmp_path)


def test_corrupt_and_foreign_checkpoints_fail_clearly(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupt or not a checkpoint"):
        Trainer(config(*QUIET, f"trainer.resume={bad}"), tmp_path)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match="not an lptrain checkpoint"):
        Trainer(config(*QUIET, f"trainer.resume={foreign}"), tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        Trainer(config(*QUIET, f"trainer.resume={tmp_path / 'missing.pt'}"), tmp_path)


def test_cli_reports_user_errors_without_a_traceback(tmp_path):
    result = cli("trainer.global_batch=10", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "lptrain: error: trainer.global_batch=10 does not split across 4 devices" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_lists_the_options_of_an_unknown_group_choice(tmp_path):
    result = cli("comm=tree", cwd=tmp_path)
    assert result.returncode != 0
    assert "Could not find 'comm/tree'" in result.stderr
    assert all(name in result.stderr for name in ("lp", "mst", "be", "ring", "nccl"))


def test_cli_rejects_an_unknown_key(tmp_path):
    result = cli("trainer.stepz=3", cwd=tmp_path)
    assert result.returncode != 0 and "stepz" in result.stderr


# -- the command, sweeps and the report ----------------------------------------------------------------


def test_sweep_and_report(tmp_path):
    sweep = tmp_path / "sweep"
    result = cli(
        "-m",
        "comm=lp,ring",
        "trainer.steps=4",
        "trainer.log_every=1",
        "trainer.eval_every=4",
        "trainer.devices=cpu:2",
        "trainer.progress=false",
        "trainer.checkpoint_every=0",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = subprocess.run([sys.executable, "-m", "lptrain.report", str(sweep)], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    rows = [line.split() for line in report.stdout.splitlines()[2:4]]
    assert sorted(r[0] for r in rows) == ["lp", "ring"]
    assert all(r[1] == "cpu:2" and r[4] == "4" and float(r[5]) > 0 and r[6].endswith("%") for r in rows)
    png = sweep / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_summary_and_progress_are_printed(tmp_path):
    result = cli(
        "trainer.steps=6",
        "trainer.log_every=3",
        "trainer.devices=cpu:2",
        "trainer.eval_every=6",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "step 3/6 | loss" in out and "step 6/6 | loss" in out
    assert "=== lptrain summary" in out and "communication" in out and "replicas        identical" in out
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 6


def test_a_regular_install_finds_its_configs_from_any_directory(tmp_path):
    """Not only the editable install: a built wheel must carry the Hydra configs."""
    root = Path(__file__).resolve().parents[1]
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--target",
            str(target),
            str(root),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run(
        [sys.executable, "-m", "lptrain", "+recipe=vgg16", "--cfg", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "name: vgg16" in result.stdout
    imported = subprocess.run(
        [sys.executable, "-c", "import lptrain; print(lptrain.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert imported.stdout.startswith(str(target))
