"""compile: the trainer with ``trainer.compile`` and ``trainer.channels_last`` against eager
(``scripts/bench_compile.py``): steps per second and the share of the step that is
communication, since how fast the compute runs sets that share."""

from __future__ import annotations

from doctools.commands import Run
from doctools.markdown import table

NAME = "compile"
HEADING = "Compiled and channels_last against eager"
QUESTION = (
    "The trainer with `trainer.compile=true` (torch.compile, Inductor) and `trainer.channels_last=true` against "
    "eager on the CPU: steps per second, and what share of the step is communication."
)
MINUTES = 6
DEFAULT = True
TITLES = {"default": "small CNN (the default experiment)", "alexnet": "AlexNet (`+recipe=alexnet`)"}


def measure(run: Run) -> dict:
    run("python scripts/bench_compile.py --steps default=40,alexnet=10 --json compile.json")
    return run.json("compile.json")


def _row(x: dict, eager: dict) -> list[str]:
    first = f"{x['first_step_s']:.1f} s" + (" (compiles)" if x["compile_s"] is not None else "")
    return [
        TITLES.get(x["recipe"], x["recipe"]),
        x["variant"],
        first,
        f"{x['steps_per_s']:.2f}",
        f"{x['steps_per_s'] / eager['steps_per_s']:.2f}x",
        f"{x['compute_ms']:.1f} ms",
        f"{x['comm_ms']:.1f} ms",
        f"{100 * x['comm_fraction']:.1f}%",
        "yes" if x["identical"] else "NO",
    ]


def render(r: dict) -> list[str]:
    rows = r["rows"]
    eager = {x["recipe"]: x for x in rows if x["variant"] == "eager"}
    body = [_row(x, eager[x["recipe"]]) for x in rows]
    reading = []
    for recipe, e in eager.items():
        compiled = next((x for x in rows if x["recipe"] == recipe and x["variant"] == "compile"), None)
        if compiled is None:
            continue
        reading.append(
            f"- {TITLES.get(recipe, recipe)}: compiled {compiled['steps_per_s']:.2f} steps/s against eager's "
            f"{e['steps_per_s']:.2f} ({compiled['steps_per_s'] / e['steps_per_s']:.2f}x), after a first step of "
            f"{compiled['compile_s']:.1f} s that compiled; communication {100 * compiled['comm_fraction']:.1f}% of "
            f"the step compiled, {100 * e['comm_fraction']:.1f}% eager."
        )
    steps = ", ".join(f"{TITLES.get(k, k)} {v}" for k, v in r["steps"].items())
    return [
        f"One process, {rows[0]['devices']} replicas, comm=lp, overlap on (the defaults); each variant one run in "
        f"its own process from a cold Inductor cache, steps: {steps}. `first step`: its wall clock, which holds the "
        "compile for compiled runs (the summary's `compile` line); `steps/s`: over the steps after it, data wait "
        "included; `compute`, `comm` and the share: the summary's per-step means (the share is communication over "
        "the step). One run of each: on this shared 2-core machine differences of some 10% are noise.",
        "",
        *table(
            ["network", "variant", "first step", "steps/s", "vs eager", "compute", "comm", "comm share", "identical"],
            body,
        ),
        "",
        *reading,
    ]


def headline(r: dict) -> list[str] | None:
    """None: no figure of this section is in the README's headline table."""
    return None
