"""The plain DDP script on the lptrain backend: LPTRAIN_ALGO=ring torchrun --nproc-per-node 2 examples/ddp_backend.py"""

import argparse

import torch
import torch.distributed as dist

# Imported before the group exists: torch.distributed.nn's functions take group.WORLD as a
# default argument, read once at import (the first optimizer imports the module). Imported
# later, they would hold the group past destroy_process_group(), and gloo's threads with it,
# into the interpreter's exit, where such a thread can abort the process ("terminate called
# without an active exception": CPython gh-87135, pybind11#2215).
import torch.distributed.nn  # noqa: F401
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lptrain.ddp  # noqa: F401 - registers the lptrain backends


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    dist.init_process_group("cpu:lptrain,cuda:lptrain")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights in every process
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 14 * 14, 10)
    )
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(1 + rank)  # each process its own share of the data
    for step in range(args.steps):
        x = torch.randn(args.batch, 1, 28, 28, generator=data)
        y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, :14].mean(dim=(1, 2)) > 0).long()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # DDP averages the gradients across the processes
        opt.step()
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)
    weights = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    if rank == 0:
        print(f"final loss {loss.item():.6f}, weights sum {weights.double().sum().item():.9f}")
    dist.barrier()  # no process tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
