"""lptrain.ddp's CUDA paths on one GPU: ``torchrun --nproc-per-node 1 scripts/ddp_gpu_check.py``.

One process on an NCCL default group: DDP on the GPU with DDP's own allreduce, with
lptrain's lp hook (a CUDA future completed on a side stream after backward's event), and
on the lptrain backend (``dist.new_group(backend="lptrain_lp")``: an inner NCCL group, its
work on a side stream); then all_reduce, broadcast and reduce of a CUDA tensor on that
backend. At one process the schedules move nothing, so this checks the streams, events and
futures around them, not the transfers (NCCL between GPUs needs a process per GPU). Prints
one line per check and exits 1 if any failed.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lptrain.ddp


def train(register=None, group=None) -> torch.Tensor:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    model = DistributedDataParallel(net, device_ids=[0], bucket_cap_mb=1, process_group=group)
    if register is not None:
        register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(10):
        x = torch.randn(64, 256, device="cuda", generator=g)
        y = torch.randint(0, 10, (64,), device="cuda", generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> None:
    torch.cuda.set_device(0)
    # No device_id: torch's new_group asks a default group bound to a device for that
    # device's backend in the new group, and a group written in Python registers none.
    dist.init_process_group("nccl")
    checks: dict[str, bool] = {}
    native = train()
    hooked = train(lambda m: m.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook))
    checks["DDP with the lp hook equals DDP native"] = torch.equal(native, hooked)
    group = dist.new_group(backend="lptrain_lp")
    checks["DDP on the lptrain_lp backend equals DDP native"] = torch.equal(native, train(group=group))
    t = torch.arange(1e6, device="cuda")
    want = t.clone()
    dist.all_reduce(t, group=group)
    dist.broadcast(t, src=0, group=group)
    dist.reduce(t, dst=0, group=group)
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group, async_op=True)
    work.wait()
    checks["all_reduce, broadcast, reduce, avg of a CUDA tensor"] = torch.equal(t, want)
    for what, ok in checks.items():
        print(f"{'ok    ' if ok else 'FAILED'} {what}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
