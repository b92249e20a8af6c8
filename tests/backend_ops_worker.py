"""The operations of lptrain's torch.distributed backend that torch calls by their Python
names on the group object (``dist.all_gather_coalesced``, sparse ``dist.all_reduce``), run
by tests/test_pytorch_suite.py in processes of their own: each rank joins
``init_process_group(BACKEND)`` over a file store, checks what it got against the plain
result, and exits non-zero with the error on the first mismatch."""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lptrain.ddp  # noqa: F401 - registers the lptrain backends


def rank_main(rank: int, world: int, backend: str, store: str) -> None:
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        inputs = [torch.full((2, 3), float(rank)), torch.arange(4.0) + 10 * rank]
        outputs = [[torch.empty_like(t) for t in inputs] for _ in range(world)]
        dist.all_gather_coalesced(outputs, inputs)
        for r in range(world):
            torch.testing.assert_close(outputs[r], [torch.full((2, 3), float(r)), torch.arange(4.0) + 10 * r])
        sparse = torch.sparse_coo_tensor([[rank]], [1.0 + rank], (world,))
        dist.all_reduce(sparse)
        torch.testing.assert_close(sparse.to_dense(), torch.arange(1.0, world + 1))
    finally:
        dist.destroy_process_group()


def main() -> None:
    backend, world, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mp.start_processes(rank_main, args=(world, backend, store), nprocs=world, start_method="fork")
    print("ok")


if __name__ == "__main__":
    main()
