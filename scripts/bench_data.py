#!/usr/bin/env python3
"""How fast the input pipeline feeds training, with 0, 1, 2, ... DataLoader workers.

    python scripts/bench_data.py                          # makes a JPEG folder in a temporary directory
    python scripts/bench_data.py --root /data/digits --workers 0,2,4 --model alexnet --image-size 64

In one run, side by side, for each worker count: the images/s of the input pipeline alone
(iterating the training batches, nothing else) and of whole training steps (the Trainer on
``data=imagefolder``), with the data wait and compute per step. The worker counts are
measured round-robin (every count once per trial, ``--trials`` times) so that a machine
whose load drifts affects them alike; each figure is the median over the trials. A
benchmark prints; nothing here is asserted.

* loader images/s: steady state, ``batch x steps / seconds`` after the first ``--warmup``
  batches (worker start-up excluded; reported separately as ``first batch``).
* train images/s: the trainer's summary figure, the wall clock of the whole run
  (worker start-up and the first step included, no evaluation).
* data wait and compute: the trainer's per-step means (first step excluded).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from doctools.files import write_json
from lptrain.data import StepBatchSampler, load_data, train_batches
from lptrain.settings.locations import compose_config
from lptrain.train.trainer import Trainer
from make_imagefolder import make_imagefolder  # scripts/make_imagefolder.py, beside this script


def config(overrides: list[str]):
    return compose_config(overrides)


def loader_rate(data, workers: int, batch: int, steps: int, warmup: int) -> tuple[float, float]:
    """(images/s after ``warmup`` batches, seconds to the first batch) of the batches alone."""
    sampler = StepBatchSampler(len(data.train), batch, seed=0, start=0, stop=steps + warmup)
    began = time.perf_counter()
    with train_batches(data.train, sampler, workers, pin_memory=False) as batches:
        next(batches)
        first = time.perf_counter() - began
        for _ in range(warmup - 1):
            next(batches)
        t0 = time.perf_counter()
        n = sum(len(labels) for _, labels in batches)
        return n / (time.perf_counter() - t0), first


def train_rate(overrides: list[str], workers: int, run_dir: Path) -> dict[str, float]:
    summary = Trainer(config([*overrides, f"data.workers={workers}"]), run_dir).fit()
    return {
        "images_per_s": summary.images_per_s,
        "data_ms": summary.mean_data_ms,
        "compute_ms": summary.mean_compute_ms,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="an image folder (root/train, root/val); default: make one")
    p.add_argument("--per-class", type=int, default=100, help="images per class when making one (default 100)")
    p.add_argument("--min-side", type=int, default=64, help="smallest side of the made images (default 64)")
    p.add_argument("--max-side", type=int, default=256, help="largest side of the made images (default 256)")
    p.add_argument("--workers", default="0,1,2", help="worker counts to compare (default 0,1,2)")
    p.add_argument("--model", default="small", help="the trained model (default small)")
    p.add_argument("--image-size", type=int, default=64, help="model.image_size: the crops' side (default 64)")
    p.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    p.add_argument("--devices", default="cpu", help="trainer.devices (default cpu: one CPU replica)")
    p.add_argument("--loader-steps", type=int, default=30, help="batches timed for the loader alone (default 30)")
    p.add_argument("--train-steps", type=int, default=20, help="training steps per run (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="loader batches before the clock starts (default 3)")
    p.add_argument("--trials", type=int, default=2, help="round-robin trials (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON to FILE")
    args = p.parse_args()
    counts = [int(w) for w in args.workers.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        root = Path(args.root) if args.root else Path(tmp) / "images"
        if not args.root:
            print(f"# making {10 * args.per_class} JPEGs of {args.min_side} to {args.max_side} px in {root} ...")
            make_imagefolder(root, args.per_class, 10, args.min_side, args.max_side)
        overrides = [
            "data=imagefolder",
            f"data.root={root}",
            f"model={args.model}",
            f"model.image_size={args.image_size}",
            f"trainer.devices={args.devices}",
            f"trainer.global_batch={args.batch}",
            f"trainer.steps={args.train_steps}",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            "trainer.tensorboard=false",
            "trainer.progress=false",
            "trainer.log_every=1000000",
        ]
        data = load_data(config(overrides).data)
        loader: dict[int, list[tuple[float, float]]] = {w: [] for w in counts}
        train: dict[int, list[dict[str, float]]] = {w: [] for w in counts}
        began = time.perf_counter()
        for trial in range(args.trials):
            for w in counts:  # round-robin: every worker count once per trial
                loader[w].append(loader_rate(data, w, args.batch, args.loader_steps, args.warmup))
                train[w].append(train_rate(overrides, w, Path(tmp) / f"run_{trial}_{w}"))
        elapsed = time.perf_counter() - began

    print(
        f"# bench_data: {len(data.train)} training JPEGs ({root if args.root else 'made here'}), "
        f"{args.model} at {args.image_size} px, global batch {args.batch} on {args.devices}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), {platform.processor() or platform.machine()}"
    )
    print(
        f"# {datetime.datetime.now():%Y-%m-%d %H:%M}; medians of {args.trials} round-robin trials "
        f"({elapsed:.0f} s); loader: {args.loader_steps} batches after {args.warmup}; training: "
        f"{args.train_steps} steps, wall clock"
    )
    columns = (("workers", 7), ("loader img/s", 13), ("first batch s", 14), ("train img/s", 12))
    columns += (("data wait ms", 13), ("compute ms", 11))
    print(" ".join(f"{name:>{width}}" for name, width in columns))
    med = statistics.median
    rows = []
    for w in counts:
        row = [w, med([r for r, _ in loader[w]]), med([f for _, f in loader[w]])]
        row += [med([r[k] for r in train[w]]) for k in ("images_per_s", "data_ms", "compute_ms")]
        formats = ("d", ".0f", ".2f", ".0f", ".1f", ".1f")
        print(" ".join(f"{v:>{width}{f}}" for v, (_, width), f in zip(row, columns, formats)))
        rows.append(
            dict(zip(("workers", "loader_img_s", "first_batch_s", "train_img_s", "data_ms", "compute_ms"), row))
        )
    if args.json:
        result = {
            "images": len(data.train),
            "model": args.model,
            "image_size": args.image_size,
            "batch": args.batch,
            "devices": args.devices,
            "trials": args.trials,
            "loader_steps": args.loader_steps,
            "warmup": args.warmup,
            "train_steps": args.train_steps,
            "elapsed_s": elapsed,
            "rows": rows,
        }
        write_json(args.json, result)


if __name__ == "__main__":
    main()
