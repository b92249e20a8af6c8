"""trainer: lptrain's trainer against PyTorch DDP on the same recipe, batch and steps
(``scripts/bench_ddp.py``), the rounds interleaved so that the machine's drift hits every
variant alike."""

from __future__ import annotations

from benchmark_sections.common import spread
from doctools.commands import Run
from doctools.markdown import table

NAME = "trainer"
HEADING = "The trainer against PyTorch DDP"
QUESTION = "lptrain's trainer and PyTorch DDP side by side on the same recipe, batch and steps."
MINUTES = 5
DEFAULT = True

VARIANTS = ("ddp", "lp:on", "ring:on")  # bench_ddp.py's --variants: DDP, and lptrain with overlap on
LABELS = {
    "ddp": "DDP (gloo)",
    "lp:on": "lptrain comm=lp",
    "ring:on": "lptrain comm=ring",
    "lp:off": "lptrain comm=lp, overlap off",
    "ring:off": "lptrain comm=ring, overlap off",
}


def measure(run: Run) -> dict:
    variants = ",".join(VARIANTS)
    run(
        "python scripts/bench_ddp.py --recipes googlenet,alexnet --steps 8 --repeats 2 "
        f"--variants {variants} --in-process 0 --json ddp.json"
    )
    return run.json("ddp.json")


def render(r: dict) -> list[str]:
    body, reading = [], []
    for recipe, got in r["recipes"].items():
        ddp = got["best"]["ddp"]
        for v, times in got["rounds"].items():
            body.append(
                [
                    recipe,
                    LABELS.get(v, v),
                    ", ".join(f"{t:.2f}" for t in times),
                    f"{got['best'][v]:.2f}",
                    f"{ddp / got['best'][v]:.2f}x",
                ]
            )
    ratios = {recipe: got["best"]["ddp"] / got["best"]["lp:on"] for recipe, got in r["recipes"].items()}
    reading.append(
        "- lptrain's trainer (comm=lp, overlap on, its defaults) ran "
        + " and ".join(f"{recipe} at {x:.2f}x" for recipe, x in ratios.items())
        + f" DDP's speed (best of {r['repeats']} interleaved rounds; above 1: lptrain faster)."
    )
    noise = {recipe: max(spread(t) for t in got["rounds"].values()) for recipe, got in r["recipes"].items()}
    reading.append(
        "- The rounds of one variant differed by up to "
        + " and ".join(f"{100 * x:.0f}% ({recipe})" for recipe, x in noise.items())
        + ": a difference between variants smaller than that is within this machine's noise."
    )
    verdict = {
        recipe: "faster than DDP" if x - 1 > noise[recipe] else "slower than DDP" if 1 - x > noise[recipe] else "even"
        for recipe, x in ratios.items()
    }
    reading.append(
        "- Against that spread, lptrain's trainer is "
        + "; ".join(
            f"{'within the noise of DDP' if v == 'even' else v + ' by more than that'} on {recipe}"
            for recipe, v in verdict.items()
        )
        + "."
    )
    return [
        f"{r['nproc']} processes under `torchrun --standalone`, one CPU replica and one thread each (torchrun's "
        f"default), the recipe's batch, network, data and optimizer, {r['steps']} steps; DDP with its 25 MiB "
        f"buckets on gloo (`scripts/ddp_recipe.py`), lptrain with {r['bucket_mb']:g} MiB buckets. The figure is the "
        "wall clock of the training steps (start-up excluded), each variant once per round, the rounds interleaved; "
        "the ratio is DDP's best over the variant's best (above 1: faster than DDP).",
        "",
        *table(["recipe", "variant", "train s, each round", "best s", "vs DDP"], body),
        "",
        *reading,
    ]


def headline(r: dict) -> list[str] | None:
    ratios = [f"{recipe} {got['best']['ddp'] / got['best']['lp:on']:.2f}x" for recipe, got in r["recipes"].items()]
    return [f"lptrain's trainer against PyTorch DDP, {r['nproc']} processes (CPU)", ", ".join(ratios)]
