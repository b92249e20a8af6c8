"""The CUDA paths: streams and events of the in-process executor, and nccl.

Skipped with a reason on machines without a GPU. With one GPU, several replicas share
it, which still runs every link on its own stream with events between dependent blocks.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ALGORITHMS, DTYPES, assert_close_to_sum, make_comm, make_inputs, needs_cuda

from lptrain.comm import build_communicator

pytestmark = [pytest.mark.cuda, needs_cuda]


def _device_lists() -> list[list[str]]:
    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    lists = [["cuda:0"] * 4, ["cuda:0"] * 3]
    if n >= 2:
        lists.append([f"cuda:{i}" for i in range(n)])
        lists.append([f"cuda:{i % n}" for i in range(2 * n)])
    return lists


@pytest.mark.parametrize("devices", _device_lists(), ids=lambda d: ",".join(d))
@pytest.mark.parametrize("key", ALGORITHMS)
def test_cuda_collectives_match_the_reference(key, devices):
    p = len(devices)
    comm = make_comm(key, devices)
    for dtype in DTYPES:
        for count in (0, 1, 7, 97, 4099, 1_000_003):
            inputs = make_inputs(p, count, dtype, device="cpu")
            tensors = [t.to(d) for t, d in zip(inputs, devices)]
            comm.allreduce(tensors)
            for t in tensors:
                assert_close_to_sum(t, inputs, what=f"{key} cuda allreduce {dtype} {count}")
                assert torch.equal(t.cpu(), tensors[0].cpu())
            for root in range(p):
                tensors = [t.to(d) for t, d in zip(inputs, devices)]
                comm.reduce(tensors, root=root)
                assert_close_to_sum(tensors[root], inputs, what=f"{key} cuda reduce {dtype} {count}")
                assert all(torch.equal(tensors[r].cpu(), inputs[r]) for r in range(p) if r != root)
                tensors = [t.to(d) for t, d in zip(inputs, devices)]
                comm.broadcast(tensors, root=root)
                assert all(torch.equal(t.cpu(), inputs[root]) for t in tensors)


def test_cuda_executor_runs_links_on_separate_streams():
    comm = build_communicator("lp", ["cuda:0"] * 4, block_size="64K")
    tensors = [torch.ones(1 << 20, device="cuda:0") for _ in range(4)]
    comm.allreduce(tensors)
    torch.cuda.synchronize()
    assert len(comm._links.all_streams()) >= 6  # 3 forward and 3 reverse link directions
    assert all(torch.equal(t, torch.full_like(t, 4.0)) for t in tensors)


def test_cuda_results_are_ordered_with_later_work_on_the_current_stream():
    """No explicit synchronize: work queued after the collective must see its result."""
    comm = build_communicator("ring", ["cuda:0"] * 4)
    tensors = [torch.full((1 << 22,), float(r), device="cuda:0") for r in range(4)]
    comm.allreduce(tensors)
    total = torch.stack([t.sum() for t in tensors])  # on the current stream
    assert torch.allclose(total.cpu(), torch.full((4,), 6.0 * (1 << 22)))


def _distinct_gpus() -> list[str]:
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


@pytest.mark.skipif(len(_distinct_gpus()) < 1, reason="needs a GPU")
def test_nccl_matches_the_reference():
    devices = _distinct_gpus()
    comm = build_communicator("nccl", devices)
    p = len(devices)
    for dtype in (torch.float32, torch.float16, torch.int64):
        inputs = make_inputs(p, 10_007, dtype)
        tensors = [t.to(d) for t, d in zip(inputs, devices)]
        comm.allreduce(tensors)
        for t in tensors:
            assert_close_to_sum(t, inputs, what=f"nccl {dtype}")
        tensors = [t.to(d) for t, d in zip(inputs, devices)]
        comm.broadcast(tensors, root=p - 1)
        assert all(torch.equal(t.cpu(), inputs[p - 1]) for t in tensors)
        tensors = [t.to(d) for t, d in zip(inputs, devices)]
        comm.reduce(tensors, root=0)
        assert_close_to_sum(tensors[0], inputs, what=f"nccl reduce {dtype}")


def test_nccl_refuses_a_shared_gpu():
    with pytest.raises(ValueError, match="distinct GPUs"):
        build_communicator("nccl", ["cuda:0", "cuda:0"])
