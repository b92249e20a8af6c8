"""ddp-hook: PyTorch DDP averaging its buckets with lptrain's communication hook, and DDP
on lptrain's process-group backend, beside DDP's own allreduce (``scripts/bench_ddp_hook.py``)."""

from __future__ import annotations

from benchmark_sections.common import spread
from doctools.commands import Run
from doctools.markdown import table

NAME = "ddp-hook"
HEADING = "DDP with lptrain's hook and backend"
QUESTION = (
    "PyTorch DDP averaging its buckets with lptrain's communication hook, and DDP on lptrain's process-group "
    "backend, beside DDP's own allreduce."
)
MINUTES = 2
DEFAULT = True


def measure(run: Run) -> dict:
    run(
        "python scripts/bench_ddp_hook.py --recipe googlenet --steps 8 --repeats 2 "
        "--variants native,hook:lp,hook:ring,backend:lp --json hook.json"
    )
    return run.json("hook.json")


def render(r: dict) -> list[str]:
    best = {v: min(t) for v, t in r["rounds"].items() if t}
    native = best["native"]
    body = [
        [
            r["labels"].get(v, v),
            ", ".join(f"{x:.2f}" for x in t),
            f"{best[v]:.2f}",
            f"{1e3 * best[v] / r['steps']:.0f}",
            f"{native / best[v]:.2f}x",
        ]
        for v, t in r["rounds"].items()
        if t
    ]
    others = {v: native / b for v, b in best.items() if v != "native"}
    noise = max(spread(t) for t in r["rounds"].values() if t)
    return [
        f"{r['recipe']}, {r['where']}, one CPU replica per process, {r['steps']} steps, {r['bucket_mb']:g} MiB buckets "
        f"everywhere; every variant trains the same network on the same batches. The figure is the wall clock of the "
        f"steps, each variant once per round ({r['repeats']} rounds, interleaved); the ratio is DDP native's best "
        "over the variant's best (above 1: faster).",
        "",
        *table(["variant", "train s, each round", "best s", "ms/step", "vs native"], body),
        "",
        "- Against DDP native: "
        + ", ".join(f"{r['labels'].get(v, v)} {x:.2f}x" for v, x in others.items())
        + f"; the rounds of one variant differed by up to {100 * noise:.0f}%.",
    ] + (
        [
            "- With 2 processes LP's chain is a single exchange, the same transfers as gloo's allreduce; lptrain's "
            "schedules run them as gloo point-to-point messages from Python on the hook's thread, beside backward on "
            "the same 2 cores. Every bucket "
            "but the last goes to the hook's thread (the last is ready when backward is over and runs on the calling "
            "thread), and the desync check is one small allreduce per step, not per bucket."
        ]
        if r["nproc"] == 2
        else []
    )


def headline(r: dict) -> list[str] | None:
    """None: no figure of this section is in the README's headline table."""
    return None
