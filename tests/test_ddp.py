"""lptrain.ddp under torchrun (gloo, 2 and 3 processes): the hook and the backend train a DDP
model to the parameters DDP's own allreduce gives, within what reordering the additions
alone changes (measured by a reversed-order control); bad input gets a one-line error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ALGOS = ("lp", "mst", "be", "ring")


def torchrun(nproc: int, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", params=[2, 3])
def found(request, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp(f"ddp{request.param}")
    run = torchrun(request.param, str(HERE / "ddp_workers.py"), "--steps", "20", "--out", str(work / "r.pt"), cwd=work)
    assert run.returncode == 0, run.stderr[-4000:]
    return torch.load(work / "r.pt", weights_only=False)


def drift(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def reorder_bound(found: dict) -> float:
    """Four times the control's distance from DDP's own, plus a couple of float32 ulps of the
    largest parameter (at 2 processes every order gives the same sum: the control reads 0)."""
    native = found["native"]
    return 4 * drift(found["control"], native) + 2 * torch.finfo(torch.float32).eps * float(native.abs().max())


@pytest.mark.parametrize("algo", ALGOS)
def test_the_hook_trains_to_ddps_parameters(found, algo):
    assert found["native"].shape == found["hook"][algo].shape
    assert drift(found["hook"][algo], found["native"]) <= reorder_bound(found), (found["world"], algo)


def test_the_hook_with_auto_trains_to_ddps_parameters_and_says_what_it_chose(found):
    """lptrain.ddp.state(algo="auto") on declared interleaved racks: the choice per bucket,
    its rank order keeping each rack contiguous where there are two racks to keep."""
    assert drift(found["hook"]["auto"], found["native"]) <= reorder_bound(found), found["world"]
    lines = found["auto_choice"]
    assert lines[0].startswith("machine: racks:2@1/2:interleaved model: 2 racks"), lines
    assert len(lines) > 1 and all(line.startswith("allreduce of ") for line in lines[1:]), lines


def test_the_hook_checks_for_desync_once_per_step_and_runs_the_last_bucket_itself(found):
    """Each step of the ring hook: one small allreduce of the desync check (not one per bucket),
    and every bucket but the last handed to the worker thread (the last is ready when backward
    is over, so it runs on the calling thread: nothing is left to overlap)."""
    counts = found["counts"]
    steps, buckets = counts["steps"], counts["buckets"]
    assert buckets > steps  # more than one bucket a step, so the counts tell the rules apart
    assert counts["checks"] == steps, counts
    assert counts["handoffs"] == buckets - steps, counts


def test_ranks_whose_steps_disagree_stop_with_a_desync_error_naming_the_step(found):
    """The hook checks once per step: a step whose buckets differed across ranks is named."""
    text = found["hook_desync"]
    assert text.startswith("DesyncError: rank 0: the ranks called different collectives (#3)"), text
    assert "the allreduces of DDP step" in text, text


def test_the_hook_in_bf16_trains_as_ddps_bf16_compression_hook(found):
    """grad_dtype=bf16: the bucket travels in bf16, summed in float32 and rounded once; DDP's
    bf16_compress_hook sums in bf16. At 2 processes both round a+b once: the same bits; at 3
    they differ by less than bf16 itself moves the result away from float32's."""
    ours, theirs, fp32 = found["hook_bf16"], found["native_bf16"], found["native"]
    assert drift(theirs, fp32) > 0  # bf16 changes something, so the comparison has teeth
    if found["world"] == 2:
        assert torch.equal(ours, theirs)
    else:
        assert drift(ours, theirs) <= drift(theirs, fp32)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_ddp_model_on_the_backend_trains_to_ddps_parameters(found, algo):
    assert drift(found["backend"][algo], found["native"]) <= reorder_bound(found), (found["world"], algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_the_backends_collectives_match_gloos(found, algo):
    worst = found["collectives"][algo]
    assert set(worst) == {"all_reduce", "all_reduce_avg", "broadcast", "reduce", "async"}
    assert worst["broadcast"] == 0 and worst["reduce"] <= 1e-12 and worst["async"] == 0, worst
    assert worst["all_reduce"] <= 1e-12 and worst["all_reduce_avg"] <= 1e-12, worst  # float64, |x| ~ 4
    assert all(found["passed"][algo].values()), found["passed"][algo]


def test_bad_input_gets_one_line_naming_the_cause(found):
    said = found["refusals"]
    assert all("\n" not in text for text in said.values()), said
    assert said["unknown_algorithm"].startswith("CollectiveInputError") and "'lq'" in said["unknown_algorithm"]
    assert "grad_dtype 'fp8'" in said["unknown_grad_dtype"]
    assert "can only be called once" in said["hook_twice"]  # DDP's own refusal of a second hook
    assert "does not implement broadcast of sparse tensors" in said["sparse_broadcast"]
    assert "does not implement all_reduce with PREMUL_SUM" in said["premul_sum"]
    shared = found["shared_state"]
    assert shared.startswith("CollectiveInputError") and "registered on a second DDP model" in shared, shared
    assert "\n" not in shared, shared


@pytest.mark.parametrize("via", ["hook", "backend"])
def test_a_peer_that_dies_fails_the_survivors_backward_naming_the_collective(tmp_path, via):
    """Rank 1 leaves mid-training; rank 0's backward raises the hook's (or the backend's)
    CollectiveError, its first line naming the collective and the peer (not a hang: the
    timeout is 20 s, the launch's 120 s bound the run), and the worker thread closes at once."""
    out = tmp_path / "said.txt"
    args = ("--steps", "10", "--die-at", "3", "--out", str(out), "--via", via)
    run = torchrun(2, str(HERE / "ddp_workers.py"), *args, cwd=tmp_path, timeout=120)
    assert run.returncode != 0
    first = out.read_text().splitlines()[0]  # DDP re-raises the hook's error; PyTorch adds where it arose below
    assert "CollectiveError: rank 0:" in first and "allreduce" in first and "peer" in first, first
