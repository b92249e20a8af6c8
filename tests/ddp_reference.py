"""PyTorch's own DistributedDataParallel (gloo) on the same model, data and optimizer as
lptrain's trainer: the reference the torchrun test compares lptrain's parameters with.

    torchrun --nproc-per-node 2 tests/ddp_reference.py --steps 6 --batch-per-device 16 --out params.pt
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lptrain.data import batch_indices, load_data, prepare
from lptrain.models import build_model, classification_loss
from lptrain.schema import MnistDataConfig
from lptrain.train.schedule import learning_rate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch-per-device", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_data(MnistDataConfig())
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as lptrain's
    model = DistributedDataParallel(build_model("small", data.num_classes, 28))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    global_batch = args.batch_per_device * world
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, "cosine")
        idx = batch_indices(len(data.train), global_batch, step, args.seed)
        idx = idx[rank * args.batch_per_device : (rank + 1) * args.batch_per_device]
        images, labels = data.train.batch(idx)
        x = prepare(images, 1, 28, data.mean, data.std)
        opt.zero_grad()
        loss, _ = classification_loss(model(x), labels)
        loss.backward()  # DDP averages the gradients across the ranks
        opt.step()
    if rank == 0:
        flat = torch.cat([q.detach().reshape(-1) for q in model.module.parameters()])
        torch.save(flat, args.out)
    dist.barrier()  # leave together: an early exit can abort in gloo's teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
