"""The BSP-SGD trainer: exactness, resumption, convergence, logs and bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lptrain.comm import BackendUnavailableError
from lptrain.data import DataError
from lptrain.settings.locations import compose_config
from lptrain.train.checkpoint import CheckpointError
from lptrain.train.trainer import ConfigError, Trainer

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.checkpoint_every=0", "trainer.eval_every=0"]


def config(*overrides: str):
    return compose_config(list(overrides))


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
        ref, ref_log = train(tmp_path / "one", *common, "trainer.devices=cpu*1", "trainer.batch_per_device=32")
        ONE_DEVICE["ref"] = (ref.replicas.params[0].clone(), [m["loss"] for m in ref_log])
    ref_params, ref_losses = ONE_DEVICE["ref"]
    many, log = train(
        tmp_path / "many",
        *common,
        f"comm={comm}",
        f"trainer.sync={sync}",
        "trainer.devices=cpu*4",
        "trainer.batch_per_device=8",
    )
    losses = [m["loss"] for m in log]
    assert len(losses) == len(ref_losses) == 6
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert losses[-1] < losses[0]  # it did learn something: the comparison is not between two no-ops
    assert torch.allclose(many.replicas.params[0], ref_params, rtol=1e-4, atol=1e-6)
    assert many.replicas.identical()


def test_buckets_give_the_same_result_as_one_collective(tmp_path):
    one, _ = train(tmp_path / "a", "trainer.steps=3", "trainer.devices=cpu*3")
    bucketed, _ = train(tmp_path / "b", "trainer.steps=3", "trainer.devices=cpu*3", "trainer.bucket_mb=0.001")
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
    one, ref = train(tmp_path / "one", *common, "trainer.devices=cpu*1", "trainer.batch_per_device=32")
    many, log = train(tmp_path / "many", *common, "trainer.devices=cpu*4", "trainer.batch_per_device=8")
    free, unclipped = train(
        tmp_path / "free",
        "trainer.steps=4",
        "optim.lr=0.05",
        f"trainer.sync={sync}",
        "trainer.devices=cpu*4",
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
        "trainer.devices=cpu*2",
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
        assert proc.returncode == 130, err  # interrupted, checkpoint saved: a sweep script can tell
        assert "resume with trainer.resume=" in out
    else:
        assert proc.returncode == -signal.SIGKILL
    stopped_at = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert 10 <= stopped_at < 150, "the run was not interrupted mid-way"
    again = cli(*args, f"trainer.resume={tmp_path / 'cut'}", f"hydra.run.dir={tmp_path / 'again'}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    full_losses = {m["step"]: m["loss"] for m in map(json.loads, (tmp_path / "full" / "steps.jsonl").open())}
    later = [json.loads(line) for line in (tmp_path / "again" / "steps.jsonl").open()]
    assert later[0]["step"] == stopped_at + 1 and later[-1]["step"] == 150
    assert all(m["loss"] == full_losses[m["step"]] for m in later)
    final = torch.load(tmp_path / "again" / "checkpoints" / "last.pt", weights_only=True)
    reference = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)
    assert torch.equal(final["params"], reference["params"])


# -- convergence and logs ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_main_job_alexnet_recipe_learns_the_digits(tmp_path):
    # The README's first command; a few minutes on two cores (README.md shows a run's output).
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
            "trainer.devices=cpu*2",
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
    # The hparams are in the run's own event file, written at the start (a run that never
    # ends still has them), with the options a sweep varies.
    assert "_hparams_/experiment" in acc.summary_metadata, sorted(acc.summary_metadata)
    blob = b"".join(p.read_bytes() for p in (tmp_path / "tb").glob("events.out.tfevents.*"))
    assert b"comm.options.block_size" in blob and b"trainer.bucket_mb" in blob


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["trainer.global_batch=10", "trainer.devices=cpu*4"], ConfigError, "must split across the 4 replicas"),
        (["trainer.devices=cuda:2"], BackendUnavailableError, "needs CUDA"),
        (["comm=nccl"], BackendUnavailableError, "nccl communicator needs CUDA"),
        (["data=cifar10", "data.root=/nonexistent/cifar"], DataError, "CIFAR-10 was not found under /nonexistent"),
        (["data=imagefolder", "data.root=/nonexistent/img"], DataError, "does not exist"),
        (["trainer.sync=gossip"], ConfigError, "trainer.sync=gossip is not valid; valid choices: allreduce, reduce"),
        (["optim.clip_grad_norm=-1"], ConfigError, "optim.clip_grad_norm=-1.0 is not valid"),
        (
            ["trainer.steps=5", "trainer.stop_at=9"],
            ConfigError,
            "trainer.stop_at=9 is not valid; use a step from 1 to 5",
        ),
        (["model.init=xavier"], ConfigError, "model.init=xavier is not valid; valid choices: default, kaiming"),
        (["trainer.devices=cpu*0"], ConfigError, r"trainer.devices=cpu\*0 is not valid"),
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
    with pytest.raises(ConfigError, match=r"is not a checkpoint \(corrupt, truncated"):
        Trainer(config(*QUIET, f"trainer.resume={bad}"), tmp_path)
    truncated = tmp_path / "truncated.pt"
    torch.save({"format": "lptrain-checkpoint-v1", "params": torch.zeros(1000)}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:-200])
    with pytest.raises((CheckpointError, ConfigError), match="corrupt") as caught:
        Trainer(config(*QUIET, f"trainer.resume={truncated}"), tmp_path)
    assert "weights_only" not in str(caught.value)  # torch's advice to unpickle anything: wrong here
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match="not an lptrain checkpoint"):
        Trainer(config(*QUIET, f"trainer.resume={foreign}"), tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        Trainer(config(*QUIET, f"trainer.resume={tmp_path / 'missing.pt'}"), tmp_path)


# -- the command, sweeps and the report ----------------------------------------------------------------


def test_the_summary_progress_eval_and_interval_means_are_printed_and_logged(tmp_path):
    run_dir = tmp_path / "r"
    result = cli(
        "trainer.steps=6",
        "trainer.log_every=3",
        "trainer.devices=cpu*2",
        "trainer.eval_every=3",
        "comm.options.block_size=64K",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "step 3/6 | loss" in out and "step 6/6 | loss" in out and "ETA" in out
    assert "eval at step 3: loss" in out and "eval at step 6: loss" in out
    assert "=== lptrain summary" in out and "communication" in out and "replicas        identical" in out
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6
    assert (run_dir / "config.yaml").read_text().count("block_size: 64K") == 1
    # The logged points are the interval's means; steps.jsonl has every step.
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    logged = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert [m["step"] for m in logged] == [3, 6] and [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert logged[0]["loss"] == pytest.approx(sum(s["loss"] for s in steps[:3]) / 3)
    assert logged[1]["comm_ms"] == pytest.approx(sum(s["comm_ms"] for s in steps[3:]) / 3)


@pytest.mark.parametrize("overlap", ["true", "false"])
def test_a_finished_trainer_is_freed_so_runs_in_one_process_do_not_pile_up(tmp_path, overlap):
    """A Hydra sweep and the convergence study run one trainer after another in a process;
    the overlap's gradient hooks once kept every finished trainer and its replicas alive."""
    import gc
    import weakref

    trainer, _ = train(tmp_path, "trainer.steps=2", f"trainer.overlap={overlap}", "trainer.bucket_mb=0.01")
    gone = weakref.ref(trainer)
    del trainer, _
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("name", ["lp", "be", "ring"])
def test_the_first_lines_name_the_communicator_that_sized_its_messages_for_the_link(name):
    from types import SimpleNamespace

    from lptrain.comm.build import build_in_process, sized_for_link
    from lptrain.comm.distributed import DistributedCommunicator
    from lptrain.comm.hierarchical import HierarchicalCommunicator
    from lptrain.comm.transport import LinkCost

    # across: what the builder makes of the default options on a link measured as below
    remote = DistributedCommunicator.__new__(DistributedCommunicator)
    remote.name, remote.world_size, remote.link = name, 2, LinkCost(alpha_s=200e-6, beta_s_per_byte=0.5e-9)
    remote.sized_for_link = sized_for_link(name, 2, {})
    trainer = SimpleNamespace(comm=HierarchicalCommunicator(build_in_process("ring", ["cpu"]), remote))
    (line,) = Trainer._kernel_choices(trainer)
    assert line.startswith(f"{name} across processes: ") and "200 us per message, 2.00 GB/s" in line
    assert ("LP's blocks" in line) == (name == "lp")
