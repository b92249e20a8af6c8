"""DDP with lptrain's hook and on lptrain's backend, beside DDP's own allreduce and lptrain's
trainer: the same network, batch and steps under torchrun, in one run.

    python scripts/bench_ddp_hook.py                         # alexnet, 10 steps, 2 processes on loopback
    python scripts/bench_ddp_hook.py --steps 6 --repeats 2 --json hook.json
    python scripts/bench_ddp_hook.py --cluster "--nodes 4 --link 200mbit"   # root: emulated nodes
    python scripts/bench_ddp_hook.py --recipe googlenet --variants native,hook:auto \\
        --cluster "--nodes 8 --layout racks --link 200mbit --uplink 100mbit"   # auto on thin uplinks

The variants, one after the other, interleaved over ``--repeats`` rounds (the best of each
is printed): DDP native (gloo's allreduce on DDP's 25 MiB buckets, ``scripts/ddp_recipe.py``),
DDP with the lp and ring hooks (``--comm hook:ALGO``), DDP on the lptrain_lp backend
(``--comm backend:lp``), and lptrain's trainer (``comm=lp``, overlap on, the same 25 MiB
buckets, one CPU replica per process). The figure is the wall clock of the ``--steps``
training steps after ``--warmup`` steps (default 2), and its ratio to DDP native's (above 1:
faster). The warm-up is timed apart and reported beside: DDP sorts its buckets anew by the
order backward produced them after its first step, and comm=auto chooses per message size
at the first message of each size, so a run's steady steps start at the third. A
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from doctools import launch
from doctools.files import write_json

DDP_RECIPE = Path(__file__).resolve().parent / "ddp_recipe.py"
VARIANTS = ("native", "hook:lp", "hook:ring", "backend:lp", "trainer:lp")
LABELS = {
    "native": "DDP native (gloo allreduce)",
    "hook:lp": "DDP + lptrain.ddp hook lp",
    "hook:ring": "DDP + lptrain.ddp hook ring",
    "backend:lp": "DDP on backend lptrain_lp",
    "trainer:lp": "lptrain trainer comm=lp",
    "hook:auto": "DDP + lptrain.ddp hook auto",
    "trainer:auto": "lptrain trainer comm=auto",
}


def launcher(nproc: int, cluster: str | None) -> list[str]:
    """What runs ``[script, args]`` or ``["-m", module, args]`` on every process: torchrun on
    loopback, or lptrain-cluster with ``cluster``'s options (one torchrun node per namespace)."""
    if cluster is None:
        return launch.torchrun(nproc)
    return [*launch.lptrain_cluster(*shlex.split(cluster)), sys.executable]


def split(step_s: list[float], warmup: int) -> tuple[float, float]:
    """(the warm-up steps' seconds, the timed steps' seconds) of one run's step times."""
    return sum(step_s[:warmup]), sum(step_s[warmup:])


def ddp(
    run: list[str], recipe: str, steps: int, warmup: int, comm: str, bucket_mb: float, topology: str | None
) -> tuple[float, float] | None:
    command = [*run, str(DDP_RECIPE), "--recipe", recipe, "--steps", str(warmup + steps)]
    if comm == "hook:auto" and topology:
        command += ["--topology", topology]
    result = launch.json_result([*command, "--comm", comm, "--bucket-mb", str(bucket_mb)])
    return split(result["step_s"], warmup) if result else None


def trainer(
    run: list[str],
    recipe: str,
    steps: int,
    warmup: int,
    algo: str,
    bucket_mb: float,
    work: Path,
    topology: str | None,
) -> tuple[float, float] | None:
    run_dir = work / f"{algo}-{len(list(work.iterdir()))}"
    overrides = [
        f"+recipe={recipe}",
        f"comm={algo}",
        "trainer.devices=cpu",
        f"trainer.steps={warmup + steps}",
        "trainer.overlap=true",
        f"trainer.bucket_mb={bucket_mb}",
        "trainer.log_every=1",
    ]
    if algo == "auto" and topology:
        overrides.append(f"comm.options.topology={topology}")
    if launch.lptrain_summary(run, run_dir, *overrides) is None:
        return None
    return split([s["wall_ms"] / 1e3 for s in launch.step_rows(run_dir)], warmup)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="alexnet")
    p.add_argument("--steps", type=int, default=10, help="the steps timed, after the warm-up")
    p.add_argument("--warmup", type=int, default=2, help="steps run first and timed apart (default 2)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cluster", default=None, help="lptrain-cluster's options: each run across emulated nodes")
    p.add_argument("--topology", default="probe", help="what the auto variants price on (default: probe)")
    p.add_argument("--json", metavar="FILE", help="also write every round's times as JSON to FILE")
    args = p.parse_args()
    run = launcher(args.nproc, args.cluster)
    variants = args.variants.split(",")
    rounds: dict[str, list[float]] = {v: [] for v in variants}
    warmups: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for v in variants:
                kind, algo = (v.split(":") + [""])[:2]
                if kind == "trainer":
                    took = trainer(
                        run, args.recipe, args.steps, args.warmup, algo, args.bucket_mb, Path(tmp), args.topology
                    )
                else:
                    took = ddp(run, args.recipe, args.steps, args.warmup, v, args.bucket_mb, args.topology)
                if took is not None:
                    warmups[v].append(took[0])
                    rounds[v].append(took[1])
    best = {v: min(times) for v, times in rounds.items() if times}
    native = best.get("native")
    where = f"lptrain-cluster {args.cluster}" if args.cluster else f"{args.nproc} processes on loopback"
    print(
        f"# {args.recipe}, {where}, {args.steps} steps timed after {args.warmup} of warm-up, "
        f"buckets {args.bucket_mb:g} MiB, best of {args.repeats}"
    )
    print(f"{'variant':<30} {'train s':>8} {'ms/step':>8} {'vs native':>9} {'warm-up s':>9}")
    for v in variants:
        if v in best:
            ratio = f"{native / best[v]:8.2f}x" if native else "      n/a"
            print(
                f"{LABELS.get(v, v):<30} {best[v]:8.2f} {1e3 * best[v] / args.steps:8.0f} {ratio} "
                f"{min(warmups[v]):9.2f}",
                flush=True,
            )
    if args.json:
        result = {
            "recipe": args.recipe,
            "where": where,
            "nproc": args.nproc,
            "steps": args.steps,
            "warmup_steps": args.warmup,
            "bucket_mb": args.bucket_mb,
            "repeats": args.repeats,
            "labels": LABELS,
            "rounds": rounds,
            "warmup": warmups,
        }
        write_json(args.json, result)


if __name__ == "__main__":
    main()
