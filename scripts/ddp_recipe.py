"""PyTorch DDP (gloo or NCCL) on a recipe's network, data, batch and optimizer: the baseline
that ``scripts/bench_ddp.py`` times lptrain against.

    torchrun --standalone --nproc-per-node 2 scripts/ddp_recipe.py --recipe alexnet --steps 10
    torchrun --standalone --nproc-per-node 2 scripts/ddp_recipe.py --recipe alexnet --comm hook:lp
    torchrun --standalone --nproc-per-node 2 scripts/ddp_recipe.py --recipe alexnet --comm backend:lp

``--comm`` picks who averages DDP's buckets: ``native`` (DDP's own allreduce on gloo),
``hook:ALGO`` (lptrain's communication hook, ``lptrain.ddp``) or ``backend:ALGO`` (DDP on
the ``lptrain_ALGO`` backend). ``--profile A-B`` writes PyTorch's Chrome trace of those
steps (counted from 1) to ``--trace``.

One replica per process, the recipe's per-device batch, the same torchvision network and
initialisation (same seed), the same batches (lptrain's sampler), SGD with the recipe's
learning rate, schedule, momentum, weight decay and gradient clipping. Prints one JSON
line on rank 0: the wall clock of the steps and the final loss.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lptrain.data import StepBatchSampler, load_data, prepare, resolve_workers, train_batches
from lptrain.models import SPECS, build_model, classification_loss
from lptrain.settings.locations import compose_config
from lptrain.train.profiling import StepProfiler, parse_step_range
from lptrain.train.schedule import learning_rate


def join(comm: str) -> None:
    """The default group: gloo, or the lptrain backend for ``backend:ALGO``."""
    if comm.startswith("backend:"):
        import lptrain.ddp  # noqa: F401 - registers the backends

        name = f"lptrain_{comm.removeprefix('backend:')}"
        dist.init_process_group(f"cpu:{name},cuda:{name}")
    else:
        dist.init_process_group("gloo")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", required=True, help="alexnet, googlenet or vgg16")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (default: DDP's own, 25)")
    p.add_argument(
        "--comm", default="native", help="native, hook:ALGO or backend:ALGO (ALGO: lp, mst, be, ring; hook:auto too)"
    )
    p.add_argument(
        "--topology",
        default=None,
        help="with hook:auto, what auto prices on: probe (measured at start), declared racks (racks:2@1/2) or a model",
    )
    p.add_argument("--profile", default=None, help="steps to profile, A-B counted from 1 (default: none)")
    p.add_argument("--trace", default="ddp_trace.json", help="where --profile writes rank 0's Chrome trace")
    args = p.parse_args()
    cfg = compose_config([f"+recipe={args.recipe}", "trainer.devices=cpu"])
    join(args.comm)
    rank, world = dist.get_rank(), dist.get_world_size()
    t, o = cfg.trainer, cfg.optim
    data = load_data(cfg.data)
    torch.manual_seed(int(t.seed))
    model = build_model(cfg.model.name, data.num_classes, int(cfg.model.image_size), init=str(cfg.model.init))
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    if args.comm.startswith("hook:"):
        import lptrain.ddp

        algo = args.comm.removeprefix("hook:")
        options = {"topology": args.topology} if algo == "auto" and args.topology else {}
        ddp.register_comm_hook(lptrain.ddp.state(algo=algo, **options), lptrain.ddp.hook)
    profiled = parse_step_range(args.profile)
    profiler = StepProfiler(profiled, Path(args.trace).parent, rank, cuda=False) if profiled and rank == 0 else None
    opt = torch.optim.SGD(ddp.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    per_device = int(t.batch_per_device)
    sampler = StepBatchSampler(len(data.train), per_device * world, int(t.seed), 0, args.steps, rank, per_device)
    spec = SPECS[cfg.model.name]
    losses, step_s = [], []
    with train_batches(data.train, sampler, resolve_workers(cfg.data.workers), False) as batches:
        dist.barrier()
        began = last = time.perf_counter()  # last: where the step being timed began
        for step, (images, labels) in zip(range(args.steps), batches):
            if profiler is not None:
                profiler.before(step + 1)
            for group in opt.param_groups:
                group["lr"] = learning_rate(
                    step,
                    int(t.steps),
                    float(o.lr),
                    o.schedule,
                    int(o.warmup_steps),
                    int(o.step_size),
                    float(o.gamma),
                    float(o.min_lr),
                )
            x = prepare(images, spec.in_channels, int(cfg.model.image_size), data.mean, data.std)
            opt.zero_grad()
            loss, _ = classification_loss(ddp(x), labels)
            loss.backward()  # DDP averages the gradient buckets across the ranks, overlapped with backward
            if o.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), float(o.clip_grad_norm))
            opt.step()
            losses.append(float(loss))
            ended = time.perf_counter()
            step_s.append(ended - last)
            last = ended
            if profiler is not None:
                profiler.after(step + 1)
        wall = time.perf_counter() - began
    if profiler is not None:
        profiler.close()
        if profiler.written:
            profiler.written.replace(args.trace)
    if rank == 0:
        summary = {"recipe": args.recipe, "comm": args.comm, "steps": args.steps, "train_s": wall, "step_s": step_s}
        print(json.dumps({**summary, "final_loss": losses[-1]}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
