"""lptrain against PyTorch DDP, side by side: the same recipe, steps and batch under torchrun.

    python scripts/bench_ddp.py                      # alexnet and googlenet, 10 steps, 2 processes
    python scripts/bench_ddp.py --recipes alexnet --steps 12 --repeats 2
    python scripts/bench_ddp.py --variants ddp,lp:on --in-process 0 --json ddp.json

For each recipe, one after the other on the same machine: DDP (``scripts/ddp_recipe.py``,
gloo, its default 25 MiB buckets) and lptrain with lp and ring, each with
``trainer.overlap=false`` and ``true`` (buckets of ``--bucket-mb``), one CPU replica per
process (``--variants`` picks some: ``ddp``, ``lp:off``, ``lp:on``, ``ring:off``, ``ring:on``).
The figure compared is the wall clock of the training steps (lptrain's summary ``train_s``,
DDP's loop), start-up excluded; printed as a table with each time's ratio to
DDP's (above 1: lptrain faster), and the in-process exposed-communication share is printed
by ``lptrain`` itself. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from doctools import launch
from doctools.files import write_json

DDP_RECIPE = Path(__file__).resolve().parent / "ddp_recipe.py"


def ddp(recipe: str, steps: int, nproc: int) -> float:
    result = launch.json_result(launch.torchrun(nproc, str(DDP_RECIPE), "--recipe", recipe, "--steps", str(steps)))
    if result is None:
        raise RuntimeError(f"ddp_recipe.py printed no result for {recipe}")
    return result["train_s"]


def run_lptrain(launcher: list[str], run_dir: Path, *overrides: str) -> dict:
    """One lptrain run with logging, evaluation and checkpoints off; its summary.json."""
    summary = launch.lptrain_summary(launcher, run_dir, *overrides)
    if summary is None:
        raise RuntimeError(f"lptrain wrote no summary.json in {run_dir}")
    return summary


def lptrain(recipe: str, steps: int, nproc: int, comm: str, overlap: bool, bucket_mb: float, work: Path) -> float:
    run_dir = work / f"{recipe}-{comm}-{overlap}-{len(list(work.iterdir()))}"
    summary = run_lptrain(
        launch.torchrun(nproc),
        run_dir,
        f"+recipe={recipe}",
        f"comm={comm}",
        "trainer.devices=cpu",
        f"trainer.steps={steps}",
        f"trainer.overlap={str(overlap).lower()}",
        f"trainer.bucket_mb={bucket_mb}",
    )
    return summary["train_s"]


def in_process(recipe: str, steps: int, devices: int, bucket_mb: float, work: Path) -> list[dict]:
    """One process, ``devices`` CPU replicas: communication and its exposed part, without and with overlap."""
    rows = []
    for overlap in (False, True):
        s = run_lptrain(
            [sys.executable],
            work / f"inproc-{recipe}-{overlap}",
            f"+recipe={recipe}",
            f"trainer.devices=cpu*{devices}",
            f"trainer.steps={steps}",
            f"trainer.overlap={str(overlap).lower()}",
            f"trainer.bucket_mb={bucket_mb}",
        )
        step = s["mean_comm_ms"] / s["comm_fraction"] if s["comm_fraction"] else float("nan")
        print(
            f"{recipe:<10} in-process cpu*{devices} overlap={str(overlap).lower():<5} comm {s['mean_comm_ms']:7.1f} ms,"
            f" exposed {s['mean_comm_exposed_ms']:7.1f} ms ({100 * s['mean_comm_exposed_ms'] / step:4.1f}% of the"
            f" step), hand-off {s['mean_comm_handoff_ms']:5.1f} ms, step {step:7.1f} ms, train {s['train_s']:6.1f} s",
            flush=True,
        )
        rows.append(
            {
                "recipe": recipe,
                "devices": devices,
                "overlap": overlap,
                "comm_ms": s["mean_comm_ms"],
                "exposed_ms": s["mean_comm_exposed_ms"],
                "handoff_ms": s["mean_comm_handoff_ms"],
                "step_ms": step,
                "train_s": s["train_s"],
            }
        )
    return rows


def variant_name(variant: str) -> str:
    """``ddp`` or ``ALGO:on``/``ALGO:off``, as the table prints it."""
    if variant == "ddp":
        return "DDP (gloo)"
    comm, overlap = variant.split(":")
    return f"lptrain {comm} overlap={'true' if overlap == 'on' else 'false'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default="alexnet,googlenet")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--repeats", type=int, default=1, help="rounds of all variants (interleaved); the best of each")
    p.add_argument(
        "--variants",
        default="ddp,lp:off,lp:on,ring:off,ring:on",
        help="what runs under torchrun: ddp and ALGO:on / ALGO:off (overlap); none: nothing",
    )
    p.add_argument("--in-process", type=int, default=4, metavar="P", help="also P CPU replicas in one process (0: no)")
    p.add_argument("--json", metavar="FILE", help="also write every round's times as JSON to FILE")
    args = p.parse_args()
    variants = [] if args.variants == "none" else args.variants.split(",")
    if variants and "ddp" not in variants:
        p.error("--variants needs ddp: the times are compared with DDP's")
    result: dict = {
        "nproc": args.nproc,
        "steps": args.steps,
        "bucket_mb": args.bucket_mb,
        "repeats": args.repeats,
        "recipes": {},
        "in_process": [],
    }
    if variants:
        print(f"# {args.nproc} processes x 1 CPU replica, {args.steps} steps, lptrain buckets {args.bucket_mb} MiB")
        print(f"{'recipe':<10} {'run':<22} {'train s':>8} {'vs DDP':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for recipe in args.recipes.split(",") if variants else []:
            rounds: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(args.repeats):
                for v in variants:
                    if v == "ddp":
                        took = ddp(recipe, args.steps, args.nproc)
                    else:
                        comm, overlap = v.split(":")
                        took = lptrain(recipe, args.steps, args.nproc, comm, overlap == "on", args.bucket_mb, work)
                    rounds[v].append(took)
            best = {v: min(times) for v, times in rounds.items()}
            result["recipes"][recipe] = {"rounds": rounds, "best": best}
            for v, took in best.items():
                print(f"{recipe:<10} {variant_name(v):<22} {took:8.2f} {best['ddp'] / took:6.2f}x", flush=True)
        if args.in_process:
            for recipe in args.recipes.split(","):
                result["in_process"] += in_process(recipe, args.steps, args.in_process, args.bucket_mb, work)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
