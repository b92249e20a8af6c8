"""overlap: how much communication overlapping it with backward hides
(``scripts/bench_ddp.py --in-process``), and what gradients communicated in bf16 and fp16
cost and save (``scripts/bench_grad_dtype.py``, whose figure goes beside the document)."""

from __future__ import annotations

import shutil
from pathlib import Path

from doctools import DOCS
from doctools.commands import Run
from doctools.markdown import table

NAME = "overlap"
HEADING = "Overlap and half-size gradients"
QUESTION = (
    "How much communication overlapping it with backward hides, and what gradients communicated in bf16 "
    "and fp16 cost and save."
)
MINUTES = 2
DEFAULT = True
FIGURE = DOCS / "figures" / "grad_dtype.png"


def measure(run: Run) -> dict:
    run("python scripts/bench_ddp.py --recipes alexnet --steps 6 --variants none --in-process 4 --json exposed.json")
    run("python scripts/bench_grad_dtype.py --steps 100 --out grad_dtype.png --json grad.json")
    return {
        "exposed": run.json("exposed.json"),
        "grad_dtype": run.json("grad.json"),
        "figure": "figures/grad_dtype.png",
    }


def after(work: Path) -> None:
    """The figure goes beside the document once the section is written."""
    shutil.copyfile(work / "grad_dtype.png", FIGURE)


def render(r: dict) -> list[str]:
    ex = r["exposed"]["in_process"]
    handoff = all("handoff_ms" in x for x in ex)  # measured since the hand-off has its own figure
    body = [
        [
            "on" if x["overlap"] else "off",
            f"{x['comm_ms']:.1f} ms",
            f"{x['exposed_ms']:.1f} ms",
            f"{100 * x['exposed_ms'] / x['step_ms']:.1f}%",
            *([f"{x['handoff_ms']:.1f} ms"] if handoff else []),
            f"{x['step_ms']:.0f} ms",
        ]
        for x in ex
    ]
    off = next(x for x in ex if not x["overlap"])
    on = next(x for x in ex if x["overlap"])
    g = r["grad_dtype"]
    rows = {x["dtype"]: x for x in g["rows"]}
    grad = [
        [
            d,
            f"{x['mib_per_step']:.2f} MiB",
            f"{x['max_loss_diff']:.4f}",
            f"{x['final_loss']:.4f}",
            f"{100 * x['eval_accuracy']:.2f}%",
            f"{x['comm_ms']:.2f} ms",
        ]
        for d, x in rows.items()
    ]
    fp32 = rows["fp32"]
    half = [d for d in rows if d != "fp32"]
    first = ex[0]
    return [
        f"Exposed communication: {first['recipe']} in one process on {first['devices']} CPU replicas, 25 MiB buckets, "
        f"{r['exposed']['steps']} steps, with `trainer.overlap` off and on (per-step means of the trainer's summary):",
        "",
        *table(
            ["overlap", "communication per step", "exposed", "exposed share of the step"]
            + (["hand-off"] if handoff else [])
            + ["step"],
            body,
        ),
        "",
        f"- Exposed communication: {on['exposed_ms']:.1f} ms a step with overlap on, {off['exposed_ms']:.1f} ms off; "
        f"the collectives themselves took {on['comm_ms']:.1f} ms on and {off['comm_ms']:.1f} ms off, and the step "
        f"{on['step_ms']:.0f} ms on and {off['step_ms']:.0f} ms off (one run of each). CPU replicas run their "
        "backward in turn, so a bucket's collective can start only during the last replica's backward, and it runs "
        "on the same 2 cores as that backward.",
        "",
        f"Half-size gradients: the default experiment (4 CPU replicas, the small CNN), {g['steps']} steps once per "
        "`comm.grad_dtype`, same seed and batches:",
        "",
        *table(
            [
                "comm.grad_dtype",
                "bytes per step",
                f"max abs(loss - fp32 loss), {g['steps']} steps",
                "final loss",
                "eval accuracy",
                "comm per step",
            ],
            grad,
        ),
        "",
        f"- {' and '.join(half)} send {rows[half[0]]['mib_per_step'] / fp32['mib_per_step']:.2f} of fp32's bytes; "
        "the largest loss difference from fp32 over the run was "
        + ", ".join(f"{rows[d]['max_loss_diff']:.4f} ({d})" for d in half)
        + ". Communication per step: "
        + ", ".join(f"{x['comm_ms']:.2f} ms ({d})" for d, x in rows.items())
        + ". At this size (under 1 MiB) dispatch, the casts and the float32 accumulation weigh more than the "
        "bytes; the halving pays where the link is the bottleneck.",
        "",
        f"![loss curves of the default experiment with gradients communicated in fp32, bf16 and fp16]({r['figure']})",
    ]


def headline(r: dict) -> list[str] | None:
    """None: no figure of this section is in the README's headline table."""
    return None
