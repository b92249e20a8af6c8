"""Every collective of every algorithm against the plain reference (the sum of the inputs)."""

from __future__ import annotations

import pytest
import torch
from conftest import ALGORITHMS, DTYPES, assert_close_to_sum, make_comm, make_inputs, reference_sum

from lptrain.comm.algorithms import SCHEDULES, WITH_VARIANTS

LARGE_PRIME = 3_000_017  # a few million elements, divisible by nothing


def _counts(p: int) -> list[int]:
    """Tiny, odd and prime counts, and counts around multiples of P and of the block sizes."""
    return sorted({0, 1, 2, 3, 7, 13, 31, 97, 1009, max(p - 1, 0), p + 1, 3 * p + 1, 12 * 5 + 1, 20 * 3 - 1})


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern, so that equality below is bitwise, not numeric."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("key", ALGORITHMS)
def test_allreduce_matches_sum_and_replicas_are_bitwise_identical(key, p):
    comm = make_comm(key, ["cpu"] * p)
    for dtype in DTYPES:
        for count in _counts(p):
            inputs = make_inputs(p, count, dtype)
            tensors = [t.clone() for t in inputs]
            comm.allreduce(tensors)
            for r, t in enumerate(tensors):
                assert t.dtype == dtype and t.shape == (count,)
                assert_close_to_sum(t, inputs, what=f"{key} P={p} {dtype} count={count} rank {r}")
                assert torch.equal(_bits(t), _bits(tensors[0])), f"rank {r} differs bitwise from rank 0"


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("key", ALGORITHMS)
def test_reduce_every_root_and_other_inputs_unchanged(key, p):
    comm = make_comm(key, ["cpu"] * p)
    for dtype in DTYPES:
        for count in _counts(p):
            inputs = make_inputs(p, count, dtype, seed=1)
            for root in range(p):
                tensors = [t.clone() for t in inputs]
                comm.reduce(tensors, root=root)
                assert_close_to_sum(tensors[root], inputs, what=f"{key} P={p} {dtype} count={count} root={root}")
                for r in range(p):
                    if r != root:
                        assert torch.equal(_bits(tensors[r]), _bits(inputs[r])), f"reduce changed rank {r}"


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("key", ALGORITHMS)
def test_broadcast_every_root(key, p):
    comm = make_comm(key, ["cpu"] * p)
    for dtype in DTYPES:
        for count in _counts(p):
            inputs = make_inputs(p, count, dtype, seed=2)
            for root in range(p):
                tensors = [t.clone() for t in inputs]
                comm.broadcast(tensors, root=root)
                for r, t in enumerate(tensors):
                    assert torch.equal(_bits(t), _bits(inputs[root])), f"{key} P={p} root={root}: rank {r} differs"


@pytest.mark.parametrize("key", WITH_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_a_few_million_elements(key, dtype):
    p = 5
    comm = make_comm(key, ["cpu"] * p, **({"block_size": "1M"} if key.startswith("lp") else {}))
    inputs = make_inputs(p, LARGE_PRIME, dtype, seed=3)
    tensors = [t.clone() for t in inputs]
    comm.allreduce(tensors)
    for t in tensors:
        assert_close_to_sum(t, inputs, what=f"{key} allreduce {LARGE_PRIME}")
    tensors = [t.clone() for t in inputs]
    comm.reduce(tensors, root=3)
    assert_close_to_sum(tensors[3], inputs, what=f"{key} reduce {LARGE_PRIME}")
    tensors = [t.clone() for t in inputs]
    comm.broadcast(tensors, root=4)
    assert all(torch.equal(t, inputs[4]) for t in tensors)


def test_multidimensional_tensors_are_reduced_elementwise():
    inputs = [torch.randn(3, 5, 7) for _ in range(4)]
    tensors = [t.clone() for t in inputs]
    make_comm("lp", ["cpu"] * 4, block_size=40).allreduce(tensors)
    assert tensors[0].shape == (3, 5, 7)
    assert torch.allclose(tensors[2], sum(inputs), atol=1e-5)


@pytest.mark.parametrize("key", SCHEDULES)
def test_avg_divides_by_world_size(key):
    inputs = make_inputs(6, 101, torch.float64)
    tensors = [t.clone() for t in inputs]
    make_comm(key, ["cpu"] * 6).allreduce(tensors, op="avg")
    assert torch.allclose(tensors[5], reference_sum(inputs) / 6)
    tensors = [t.clone() for t in inputs]
    make_comm(key, ["cpu"] * 6).reduce(tensors, root=2, op="avg")
    assert torch.allclose(tensors[2], reference_sum(inputs) / 6)
    half = [t.to(torch.bfloat16) for t in inputs]
    tensors = [t.clone() for t in half]
    make_comm(key, ["cpu"] * 6).allreduce(tensors, op="avg")
    assert torch.allclose(tensors[0].double(), reference_sum(half) / 6, rtol=2e-2, atol=2e-2)


def test_repeated_calls_reuse_plans_and_scratch_safely():
    """Scratch buffers are reused across calls: results must not leak between calls."""
    comm = make_comm("lp", ["cpu"] * 4, block_size=64)
    for seed in range(3):
        for count in (50, 1000, 50):
            inputs = make_inputs(4, count, torch.float32, seed=seed)
            tensors = [t.clone() for t in inputs]
            comm.reduce(tensors, root=1)
            assert_close_to_sum(tensors[1], inputs)
            assert all(torch.equal(tensors[r], inputs[r]) for r in (0, 2, 3))
