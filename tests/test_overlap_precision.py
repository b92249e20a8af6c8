"""Communication overlapped with backward, mixed precision and half-size gradients: all exact
where they must be (the same parameters, replicas identical), and bad values refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lptrain.errors import ConfigError
from lptrain.settings.locations import compose_config
from lptrain.train.overlap import GPU_BUCKET_MB, OverlappedReduction, default_bucket_mb, gradient_buckets
from lptrain.train.trainer import Trainer

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.checkpoint_every=0", "trainer.eval_every=0"]


def config(*overrides: str):
    return compose_config(list(overrides))


def train(run_dir: Path, *overrides: str) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(config(*QUIET, "trainer.log_every=1", *overrides), run_dir)
    summary = trainer.fit()
    assert summary.replicas_identical
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return trainer, rows


def test_buckets_run_from_the_last_parameter_and_cover_the_buffer():
    assert gradient_buckets([3, 5, 2], None) == [(0, 10)]
    assert gradient_buckets([3, 5, 2], 4) == [(3, 10), (0, 3)]
    assert gradient_buckets([3, 5, 2], 1) == [(8, 10), (3, 8), (0, 3)]
    assert gradient_buckets([3, 5, 2], 100) == [(0, 10)]


def test_unset_buckets_are_25_mib_on_gpus_and_one_bucket_on_cpus():
    assert GPU_BUCKET_MB == 25.0  # DDP's bucket_cap_mb
    assert default_bucket_mb(None, "cuda") == 25.0
    assert default_bucket_mb(None, "cpu") is None
    assert default_bucket_mb(4.0, "cuda") == 4.0 and default_bucket_mb(4.0, "cpu") == 4.0


def test_the_first_lines_say_what_the_buckets_are(tmp_path, capsys):
    small = ["trainer.devices=cpu*2", "data=synthetic", "data.train_samples=64", "data.test_samples=16"]
    one = Trainer(config(*QUIET, *small), tmp_path / "one")
    assert one.describe_buckets() == (
        "gradient in one bucket (trainer.bucket_mb unset): its collective starts when backward has ended"
    )
    some = Trainer(config(*QUIET, *small, "trainer.bucket_mb=0.25"), tmp_path / "some")
    assert some.describe_buckets().startswith(
        f"gradient in {len(some.buckets)} bucket(s) of at least 0.25 MiB (trainer.bucket_mb=0.25), the largest"
    )
    assert some.describe_buckets().endswith("each started while backward still runs")
    from lptrain.cli import run

    run(config(*QUIET, *small, "trainer.steps=1", "trainer.bucket_mb=0.25"), tmp_path / "cli")
    assert capsys.readouterr().out.splitlines()[1] == f"lptrain: {some.describe_buckets()}"


@pytest.mark.parametrize("sync", ["allreduce", "reduce"])
@pytest.mark.parametrize("comm", ["lp", "mst", "be", "ring"])
def test_overlap_gives_bitwise_the_same_parameters(tmp_path, comm, sync):
    common = [
        f"comm={comm}",
        f"trainer.sync={sync}",
        "trainer.steps=3",
        "trainer.devices=cpu*3",
        "trainer.batch_per_device=8",
        "trainer.bucket_mb=0.05",
    ]
    serial, serial_rows = train(tmp_path / "serial", *common, "trainer.overlap=false")
    overlapped, rows = train(tmp_path / "overlap", *common, "trainer.overlap=true")
    assert len(overlapped.buckets) > 1  # several buckets, so that some go while backward runs
    assert torch.equal(serial.replicas.params[0], overlapped.replicas.params[0])
    assert [r["loss"] for r in rows] == [r["loss"] for r in serial_rows]
    # Serial: all of the communication is exposed. Overlapped: at most all of it.
    assert all(r["comm_exposed_ms"] == pytest.approx(r["comm_ms"]) for r in serial_rows)
    assert all(r["comm_exposed_ms"] >= 0 for r in rows)


def test_a_parameter_without_gradient_does_not_hold_its_bucket_back():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    models = [Branchy(), Branchy()]
    grads = [torch.zeros(40) for _ in models]
    for m, g in zip(models, grads):  # gradients as views into one flat buffer, as Replicas does
        offset = 0
        for p in m.parameters():
            p.grad = g[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
    done = []
    buckets = gradient_buckets([p.numel() for p in models[0].parameters()], 20)
    reduction = OverlappedReduction(models, [torch.device("cpu")] * 2, buckets, done.append)
    reduction.begin()
    for m in models:
        m(torch.ones(1, 4)).sum().backward()
    reduction.backward_done()
    reduction.wait()
    assert done == list(range(len(buckets)))  # every bucket, in order, the unused one too
    reduction.close()


def test_bf16_gradients_halve_the_bytes_and_keep_the_curve(tmp_path):
    fp32, fp32_rows = train(tmp_path / "fp32", "trainer.steps=30", "trainer.bucket_mb=0.25")
    bf16, bf16_rows = train(tmp_path / "bf16", "trainer.steps=30", "trainer.bucket_mb=0.25", "comm.grad_dtype=bf16")
    assert bf16.bytes_per_step * 2 == fp32.bytes_per_step
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(fp32_rows, bf16_rows))
    assert worst < 0.05, worst  # the stated tolerance (docs/BENCHMARKS.md has the measured curve)
    assert bf16_rows[-1]["loss"] < 0.5 * bf16_rows[0]["loss"]  # and it learns


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_and_keeps_the_replicas_identical(tmp_path, precision):
    trainer, rows = train(tmp_path, "trainer.steps=8", f"trainer.precision={precision}")
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert trainer.replicas.identical()
    assert trainer.replicas.params[0].dtype == torch.float32  # the weights stay float32


def test_an_fp16_overflow_skips_the_step_everywhere_and_halves_the_scale(tmp_path):
    trainer = Trainer(config(*QUIET, "trainer.steps=2", "trainer.precision=fp16", "trainer.devices=cpu*2"), tmp_path)
    trainer.scaler.scale = 2.0**120  # the scaled loss overflows float32's gradient range
    before = trainer.replicas.params[0].clone()
    trainer.fit()
    assert trainer.scaler.skipped >= 1 and trainer.scaler.scale < 2.0**120
    assert trainer.replicas.identical()
    if trainer.scaler.skipped == 2:
        assert torch.equal(before, trainer.replicas.params[0])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["comm.grad_dtype=int8"], "comm.grad_dtype=int8 is not valid; valid choices: fp32, bf16, fp16"),
        (["trainer.precision=fp8"], "trainer.precision=fp8 is not valid; valid choices: fp32, bf16, fp16"),
        (["trainer.bucket_mb=0"], "trainer.bucket_mb=0.0 is not valid; use a positive size in MiB"),
    ],
)
def test_bad_values_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(config(*QUIET, *overrides), tmp_path)


def test_a_precision_the_cpu_cannot_run_is_refused(tmp_path, monkeypatch):
    import lptrain.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "check_precision", lambda kind, p: f"{p} autocast does not run on {kind} here")
    with pytest.raises(ConfigError, match="trainer.precision=fp16 is not valid: fp16 autocast does not run on cpu"):
        Trainer(config(*QUIET, "trainer.precision=fp16"), tmp_path)


# Every algorithm is checked bitwise with and without overlap in one process above; across
# processes lp (eager issue order) runs by default and the other three with the slow tests
# (pytest -m slow), to keep CI within its time.
@pytest.mark.parametrize(
    "comm", ["lp", *(pytest.param(algo, marks=pytest.mark.slow) for algo in ("mst", "be", "ring"))]
)
def test_overlap_under_torchrun_gives_the_same_parameters(tmp_path, comm):
    def run(overlap: bool) -> torch.Tensor:
        run_dir = tmp_path / f"overlap-{overlap}"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "-m",
                "lptrain",
                f"comm={comm}",
                "trainer.devices=cpu*2",
                "trainer.steps=3",
                "trainer.batch_per_device=8",
                "trainer.bucket_mb=0.05",
                f"trainer.overlap={str(overlap).lower()}",
                "trainer.checkpoint_every=3",
                "trainer.progress=false",
                "trainer.eval_every=0",
                f"hydra.run.dir={run_dir}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "replicas        identical" in result.stdout
        return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["params"]

    assert torch.equal(run(False), run(True))
