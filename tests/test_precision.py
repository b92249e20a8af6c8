"""float16 and bfloat16 reductions accumulate in float32 unless told not to."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_sum, make_inputs, reference_sum

from lptrain.communicators import build_communicator


def _gradient_like(p: int, n: int) -> list[torch.Tensor]:
    """What data-parallel replicas hold: a shared signal plus per-replica noise."""
    g = torch.Generator().manual_seed(7)
    signal = torch.randn(n, generator=g, dtype=torch.float64)
    return [(signal + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).to(torch.bfloat16) for _ in range(p)]


def _mean_relative_error(result: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((result.double() - ref).abs() / ref.abs().clamp_min(1e-3)).mean())


@pytest.mark.parametrize("name", ["lp", "mst", "be", "ring"])
def test_bfloat16_allreduce_of_8_devices_with_and_without_fp32_accumulation(name, capsys):
    inputs = _gradient_like(8, 100_000)
    ref = reference_sum(inputs)
    errors = {}
    for accumulate in (True, False):
        tensors = [t.clone() for t in inputs]
        build_communicator(name, ["cpu"] * 8, accumulate_fp32=accumulate).allreduce(tensors)
        errors[accumulate] = _mean_relative_error(tensors[0], ref)
    rounding_only = _mean_relative_error(ref.to(torch.bfloat16), ref)  # the best bfloat16 can do
    with capsys.disabled():
        print(
            f"\n{name}: 8-device bfloat16 allreduce, mean relative error against float64: "
            f"{errors[True]:.2e} accumulating in float32, {errors[False]:.2e} in bfloat16 "
            f"(rounding the exact sum once: {rounding_only:.2e})"
        )
    # In float32 only the final rounding to bfloat16 remains ...
    assert errors[True] <= rounding_only * 1.01
    # ... while bfloat16 accumulation rounds at every one of the seven additions.
    assert errors[False] > 1.5 * errors[True]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["lp", "mst", "be", "ring"])
def test_native_half_accumulation_is_still_a_correct_sum(name, dtype):
    inputs = make_inputs(6, 333, dtype)
    tensors = [t.clone() for t in inputs]
    build_communicator(name, ["cpu"] * 6, accumulate_fp32=False).allreduce(tensors)
    assert_close_to_sum(tensors[4], inputs, accumulate_fp32=False)
    assert all(torch.equal(t, tensors[0]) for t in tensors)
