"""lptrain's torch.distributed backend in processes of their own, for
tests/test_pytorch_suite.py: ``ops`` runs the operations torch calls by their Python names
on the group object or its work (``dist.all_gather_coalesced``, sparse ``dist.all_reduce``,
``dist.recv`` from any rank) and checks them against the plain result; ``refusals`` asks
for the groups the backend refuses and prints each rank's one line. Each rank joins
``init_process_group`` over a file store and exits non-zero with the error on the first
mismatch."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lptrain.ddp  # noqa: F401 - registers the lptrain backends
from lptrain.comm.errors import CollectiveInputError


def join(rank: int, world: int, backend: str, store: str) -> None:
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )


def ops(rank: int, world: int, backend: str, store: str) -> None:
    join(rank, world, backend, store)
    try:
        inputs = [torch.full((2, 3), float(rank)), torch.arange(4.0) + 10 * rank]
        outputs = [[torch.empty_like(t) for t in inputs] for _ in range(world)]
        dist.all_gather_coalesced(outputs, inputs)
        for r in range(world):
            torch.testing.assert_close(outputs[r], [torch.full((2, 3), float(r)), torch.arange(4.0) + 10 * r])
        sparse = torch.sparse_coo_tensor([[rank]], [1.0 + rank], (world,))
        dist.all_reduce(sparse)
        torch.testing.assert_close(sparse.to_dense(), torch.arange(1.0, world + 1))
        if rank == 0:  # a receive from any rank: dist.recv asks the work for its sender
            got = torch.zeros(1)
            assert dist.recv(got) == world - 1 and got.item() == world - 1, got
        elif rank == world - 1:
            dist.send(torch.full((1,), float(rank)), 0)
    finally:
        dist.destroy_process_group()


def say(line: str) -> None:
    """One line in one write: the ranks share the pipe, and a short write is not interleaved."""
    os.write(1, f"{line}\n".encode())


def refused(make) -> str:
    try:
        make()
    except CollectiveInputError as err:
        return str(err)
    return "not refused"


def refusals(rank: int, world: int, backend: str, store: str) -> None:
    join(rank, world, "gloo", store)
    try:
        if rank == 0:  # new_group's non-members return before the backend is asked
            say(f"rank {rank}: {refused(lambda: dist.new_group([0], backend=backend))}")
        else:
            dist.new_group([0], backend=backend)
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", rank)
        say(f"rank {rank}: {refused(lambda: dist.new_group(backend=backend))}")
    finally:
        dist.distributed_c10d._get_default_group().bound_device_id = None
        dist.destroy_process_group()


def main() -> None:
    what, backend, world, store = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    run = {"ops": ops, "refusals": refusals}[what]
    mp.start_processes(run, args=(world, backend, store), nprocs=world, start_method="fork")
    print("ok")


if __name__ == "__main__":
    main()
