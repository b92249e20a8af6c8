"""Shared helpers: reference results and the tolerance of a different summation order."""

from __future__ import annotations

import pytest
import torch

from lptrain.comm.algorithms import SCHEDULES
from lptrain.communicators import build_communicator

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int32, torch.int64)
DTYPES = FLOAT_DTYPES + INT_DTYPES

# Every schedule-driven configuration the tests cover: (name, options). Every algorithm of
# lptrain.comm.algorithms.MODULES with its defaults, and LP's options besides.
ALGORITHMS = {
    **{name: (name, {}) for name in SCHEDULES},
    "lp-small-blocks": ("lp", {"block_size": 12}),  # many blocks, short last block
    "lp-rb": ("lp", {"allreduce": "reduce_broadcast", "block_size": 20}),
    "lp-reversed-chain": ("lp", {"block_size": 16}),  # order filled in per P by make_comm
    # every algorithm over racks of interleaved ranks made contiguous: evens, then odds
    **{f"{name}-evens-first": (name, {}) for name in SCHEDULES},
}

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")


def make_comm(key: str, devices: list, **extra):
    name, options = ALGORITHMS[key]
    options = dict(options, **extra)
    if key == "lp-reversed-chain":
        options["order"] = list(reversed(range(len(devices))))
    if key.endswith("-evens-first"):
        options["order"] = [*range(0, len(devices), 2), *range(1, len(devices), 2)]
    return build_communicator(name, devices, **options)


def make_inputs(p: int, count: int, dtype: torch.dtype, device="cpu", seed: int = 0) -> list[torch.Tensor]:
    """Different values per rank; integers small enough that no sum overflows."""
    g = torch.Generator().manual_seed(seed * 1000 + p * 31 + count)
    out = []
    for _ in range(p):
        if dtype.is_floating_point:
            t = torch.randn(count, generator=g, dtype=torch.float64) * 4
        else:
            t = torch.randint(-1000, 1000, (count,), generator=g, dtype=torch.int64)
        out.append(t.to(dtype).to(device))
    return out


def reference_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    """The plain reference: the sum of the inputs, in float64 on the CPU."""
    return sum(t.to("cpu", torch.float64) for t in inputs)


def sum_tolerance(inputs: list[torch.Tensor], accumulate_fp32: bool = True) -> torch.Tensor:
    """Per-element bound on |computed - exact| for any summation order.

    Each of the P-1 additions rounds with relative error ``eps`` of the accumulation
    type, bounded by ``(P - 1) eps sum |x_i|``; the final result is rounded once more to
    the output type.
    """
    dtype = inputs[0].dtype
    if not dtype.is_floating_point:
        return torch.zeros(inputs[0].numel(), dtype=torch.float64)
    acc = torch.float32 if accumulate_fp32 and dtype in (torch.float16, torch.bfloat16) else dtype
    p = len(inputs)
    magnitude = sum(t.to("cpu", torch.float64).abs() for t in inputs)
    eps_acc, eps_out = torch.finfo(acc).eps, torch.finfo(dtype).eps
    return (p - 1) * eps_acc * magnitude + eps_out * magnitude + torch.finfo(dtype).tiny


def assert_close_to_sum(result: torch.Tensor, inputs: list[torch.Tensor], accumulate_fp32: bool = True, what=""):
    ref = reference_sum(inputs)
    got = result.to("cpu", torch.float64)
    if not result.dtype.is_floating_point:
        assert torch.equal(got, ref), f"{what}: integer result differs from the exact sum"
        return
    err = (got - ref).abs()
    tol = sum_tolerance(inputs, accumulate_fp32)
    bad = err > tol
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {err.numel()} elements beyond the summation-order tolerance; "
        f"worst error {float(err.max()):.3g}"
    )
