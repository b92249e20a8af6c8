"""The trainer on a GPU: half precision, narrow gradients, resuming, the pinned-memory loader,
and memory that stays flat over many calls.

Skipped with a reason on machines without a GPU. Two replicas share cuda:0 (the machine
the check runs on has one GPU); the small CNN keeps each run to a few seconds.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from conftest import needs_cuda

from lptrain.communicators import build_communicator
from lptrain.settings.locations import compose_config

pytestmark = [pytest.mark.cuda, needs_cuda]

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0", "trainer.log_every=1"]
TWO_REPLICAS = ["trainer.devices=[cuda:0,cuda:0]", "trainer.device_type=cuda", "trainer.batch_per_device=16"]


def _trainer(run_dir: Path, *overrides: str):
    from lptrain.train.trainer import Trainer

    cfg = compose_config([*QUIET, *TWO_REPLICAS, "trainer.steps=6", "trainer.checkpoint_every=0", *overrides])
    return Trainer(cfg, run_dir)


@pytest.fixture
def deterministic(monkeypatch):
    """cuDNN's deterministic kernels, so that two runs differ only by what a test changes."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_training_on_the_gpu_keeps_the_replicas_identical(tmp_path, precision):
    trainer = _trainer(tmp_path, f"trainer.precision={precision}")
    summary = trainer.fit()
    assert summary.replicas_identical and math.isfinite(summary.final_loss)
    assert all(p.dtype == torch.float32 for p in trainer.replicas.params)  # weights stay fp32 under autocast
    if precision == "fp16":
        assert trainer.scaler.enabled and trainer.scaler.scale > 0


def test_bf16_gradients_on_the_gpu_are_averaged_in_bf16_and_follow_fp32(tmp_path, deterministic):
    narrow = _trainer(tmp_path / "bf16", "comm.grad_dtype=bf16")
    assert narrow.bytes_per_step == narrow.replicas.numel * 2
    narrow_summary = narrow.fit()
    wide = _trainer(tmp_path / "fp32")
    wide.fit()
    assert narrow_summary.replicas_identical and math.isfinite(narrow_summary.final_loss)
    a, b = narrow.replicas.params[0], wide.replicas.params[0]
    assert not torch.equal(a, b)  # the narrow gradients did change something ...
    assert float((a - b).abs().max()) <= 0.05 * float(b.abs().max())  # ... but not the course


def test_a_run_resumed_on_the_gpu_repeats_the_uninterrupted_one(tmp_path, deterministic):
    full = _trainer(tmp_path / "full", "trainer.checkpoint_every=3", "trainer.keep_checkpoints=true")
    full.fit()
    middle = tmp_path / "full" / "checkpoints" / "step_00000003.pt"
    state = torch.load(middle, weights_only=True)
    assert "rng_cuda" not in state and state["params"].device.type == "cpu"
    resumed = _trainer(tmp_path / "again", f"trainer.resume={middle}")
    assert resumed.start_step == 3
    resumed.fit()
    for a, b in zip(resumed.replicas.params, full.replicas.params):
        assert a.device.type == "cuda"
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # bitwise where every kernel is deterministic
    momentum = resumed.optimizers[0].state_dict()["state"]
    assert momentum and all(s["momentum_buffer"].device.type == "cuda" for s in momentum.values())


def test_image_batches_come_pinned_for_the_gpu_and_train(tmp_path):
    spec = importlib.util.spec_from_file_location("make_imagefolder", ROOT / "scripts" / "make_imagefolder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = module.make_imagefolder(tmp_path / "digits", per_class=4, val_per_class=1, max_side=64)
    overrides = ["data=imagefolder", f"data.root={root}", "data.workers=2", "model.image_size=32", "trainer.steps=3"]
    trainer = _trainer(tmp_path / "run", *overrides)
    assert trainer.pin_memory and trainer.workers == 2
    with trainer.train_batches(0, 2) as batches:
        images, labels = next(batches)
    assert images.is_pinned() and labels.is_pinned()  # so the copies to the GPU can be non-blocking
    summary = trainer.fit()
    assert summary.steps == 3 and summary.replicas_identical and math.isfinite(summary.final_loss)


@pytest.mark.parametrize("cuda_graph", ["off", "on", "auto"])
@pytest.mark.parametrize("algo", ["lp", "ring"])
def test_gpu_memory_stays_flat_over_100_calls(algo, cuda_graph):
    comm = build_communicator(algo, ["cuda:0"] * 4, cuda_graph=cuda_graph)
    tensors = [torch.ones(1 << 18, device="cuda:0") for _ in range(4)]
    halves = [torch.ones(1 << 18, device="cuda:0", dtype=torch.bfloat16) for _ in range(4)]
    for call in range(100):
        comm.allreduce(tensors, op="avg")
        comm.reduce(halves, root=call % 4)  # widened to float32 scratch, kept from call to call
        if call == 9:
            torch.cuda.synchronize()
            settled = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.synchronize()
    assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == settled
    assert all(torch.equal(t, torch.ones_like(t)) for t in tensors)


def test_gpu_memory_stays_flat_over_100_training_steps_with_overlapped_buckets(tmp_path):
    from lptrain.train.timing import PhaseTimer

    trainer = _trainer(tmp_path, "trainer.steps=100", "trainer.bucket_mb=0.05", "trainer.overlap=true")
    assert len(trainer.buckets) > 1
    timer = PhaseTimer(trainer.devices)
    with trainer.train_batches(0, 100) as batches:
        for step in range(100):
            trainer.train_step(step, batches, timer)
            if step == 9:
                torch.cuda.synchronize()
                settled = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == settled
    assert torch.equal(trainer.replicas.params[0], trainer.replicas.params[1])


def test_on_gpus_unset_buckets_are_25_mib_and_the_first_lines_say_so(tmp_path):
    trainer = _trainer(tmp_path, "model=alexnet", "model.image_size=64", "data=synthetic")
    assert trainer.bucket_mb == 25.0 and len(trainer.buckets) > 1  # AlexNet's ~218 MiB gradient
    assert "(trainer.bucket_mb=25, the default on GPUs as in DDP)" in trainer.describe_buckets()
