#!/usr/bin/env python3
"""The trainer compiled (``trainer.compile=true``) against eager, and in channels_last.

    python scripts/bench_compile.py                              # the default network and AlexNet
    python scripts/bench_compile.py --recipes alexnet --steps alexnet=8 --json compile.json

Each variant is one ``lptrain`` run in its own process, from a cold Inductor cache (a fresh
``TORCHINDUCTOR_CACHE_DIR``), so the compile time is what a user's first run pays. Per run
it prints the first step's time (the compile, for compiled runs), steps per second after
it, compute and communication per step and the communication's share of the step, from
the run's summary.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from doctools.files import write_json

# recipe -> the overrides that select it ("default": the default experiment, the small CNN)
RECIPES = {"default": [], "alexnet": ["+recipe=alexnet"]}
STEPS = {"default": 40, "alexnet": 10}
VARIANTS = {
    "eager": [],
    "compile": ["trainer.compile=true"],
    "channels_last": ["trainer.channels_last=true"],
    "compile+channels_last": ["trainer.compile=true", "trainer.channels_last=true"],
}


def step_s(row: dict) -> float:
    """A step's seconds from its row of steps.jsonl: its phases and its wait for data."""
    return (row["data_ms"] + row["step_ms"]) / 1e3


def run_one(recipe: str, variant: str, steps: int, overrides: list[str], work: Path) -> dict:
    """One run; its figures from summary.json."""
    run_dir = work / f"{recipe}-{variant}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"cache-{recipe}-{variant}")}
    cmd = [
        sys.executable,
        "-m",
        "lptrain",
        *RECIPES[recipe],
        *VARIANTS[variant],
        f"trainer.steps={steps}",
        "trainer.eval_every=0",
        "trainer.checkpoint_every=0",
        "trainer.progress=false",
        "trainer.tensorboard=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"bench_compile: {recipe} {variant} failed (exit {done.returncode}): {last}")
    s = json.loads((run_dir / "summary.json").read_text())
    steps_log = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    first = steps_log[0]
    return {
        "recipe": recipe,
        "variant": variant,
        "steps": s["steps"],
        "timed_steps": s["timed_steps"],
        "first_step_s": s["compile_s"] if s.get("compile_s") is not None else step_s(first),
        "compile_s": s.get("compile_s"),
        "images_per_s": s["images_per_s"],
        "steps_per_s": len(steps_log[1:]) / sum(map(step_s, steps_log[1:])),
        "compute_ms": s["mean_compute_ms"],
        "comm_ms": s["mean_comm_ms"],
        "comm_exposed_ms": s["mean_comm_exposed_ms"],
        "comm_fraction": s["comm_fraction"],
        "devices": s["devices"],
        "identical": s["replicas_identical"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--steps", default="", help="steps per recipe, e.g. default=40,alexnet=10 (these are the defaults)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = p.parse_args()
    steps = dict(STEPS)
    for item in filter(None, args.steps.split(",")):
        name, _, n = item.partition("=")
        steps[name] = int(n)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes.split(","):
            for variant in args.variants.split(","):
                r = run_one(recipe, variant, steps[recipe], args.overrides, Path(tmp))
                rows.append(r)
                print(
                    f"{recipe} {variant}: first step {r['first_step_s']:.1f} s, "
                    f"{r['steps_per_s']:.2f} steps/s after it, compute {r['compute_ms']:.1f} ms, "
                    f"comm {r['comm_ms']:.1f} ms ({100 * r['comm_fraction']:.1f}% of the step)",
                    flush=True,
                )
    if args.json:
        write_json(args.json, {"steps": steps, "rows": rows})


if __name__ == "__main__":
    main()
