"""The trainer under torchrun: the same parameters as PyTorch's DDP and as one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
TRAIN = [
    "trainer.steps=6",
    "trainer.batch_per_device=16",
    "trainer.eval_every=0",
    "trainer.progress=false",
    "trainer.tensorboard=false",
    "trainer.checkpoint_every=6",
]


def torchrun(nproc: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def lptrain_params(run_dir: Path) -> torch.Tensor:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["params"]


@pytest.mark.parametrize("comm", ["lp", "ring", "auto"])
def test_lptrain_under_torchrun_matches_distributed_data_parallel(tmp_path, comm):
    declared = ["comm.options.topology=racks:2@1/2"] if comm == "auto" else []  # it says what it chose on them
    run = torchrun(
        2,
        "-m",
        "lptrain",
        f"comm={comm}",
        *declared,
        "trainer.devices=cpu*1",
        *TRAIN,
        f"hydra.run.dir={tmp_path / 'lptrain'}",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 processes" in run.stdout and "replicas        identical" in run.stdout
    if declared:
        assert "across processes, machine: racks:2@1/2 model: 2 racks [0] [1]" in run.stdout, run.stdout[:3000]
    ddp = torchrun(
        2,
        str(HERE / "ddp_reference.py"),
        "--steps",
        "6",
        "--batch-per-device",
        "16",
        "--out",
        str(tmp_path / "ddp.pt"),
        cwd=tmp_path,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    ours, theirs = lptrain_params(tmp_path / "lptrain"), torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), float((ours - theirs).abs().max())


def test_two_processes_of_two_devices_equal_one_process_of_four(tmp_path):
    """Hierarchical: reduce inside each process, allreduce across, broadcast back."""
    run = torchrun(
        2,
        "-m",
        "lptrain",
        "comm=be",
        "trainer.devices=cpu*2",
        *TRAIN,
        f"hydra.run.dir={tmp_path / 'two'}",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "lptrain",
            "comm=be",
            "trainer.devices=cpu*4",
            *TRAIN,
            f"hydra.run.dir={tmp_path / 'one'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert torch.allclose(lptrain_params(tmp_path / "two"), lptrain_params(tmp_path / "one"), rtol=1e-5, atol=1e-6)


def test_bench_under_torchrun_compares_the_schedules_with_the_backend(tmp_path):
    import json

    out = tmp_path / "rows.json"
    run = torchrun(
        3,
        "-m",
        "lptrain.bench",
        "--op",
        "all",
        "--algo",
        "lp,mst,be,ring,nccl,mpi",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "1",
        "--trials",
        "1",
        "--json",
        str(out),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {r["algo"] for r in rows} == {"lp", "mst", "be", "ring", "gloo"}
    assert "# the transport as measured:" in run.stdout and "follow it (lp, mst, be, ring)" in run.stdout
    assert {r["op"] for r in rows} == {"allreduce", "broadcast", "reduce"}
    assert all(r["wrong"] == 0 and r["devices"] == 3 for r in rows)
    assert "mpi: skipped" in run.stdout


def test_one_torchrun_process_joins_its_group_and_trains_like_a_plain_run(tmp_path):
    """What scripts/gpu_check.sh does with NCCL on a single GPU, here with gloo."""
    run = torchrun(
        1, "-m", "lptrain", "trainer.devices=cpu*2", *TRAIN, f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "replicas        identical" in run.stdout
    plain = subprocess.run(
        [sys.executable, "-m", "lptrain", "trainer.devices=cpu*2", *TRAIN, f"hydra.run.dir={tmp_path / 'plain'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert torch.equal(lptrain_params(tmp_path / "one"), lptrain_params(tmp_path / "plain"))
