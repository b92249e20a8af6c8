"""ddp-hook: PyTorch DDP averaging its buckets with lptrain's communication hook, and DDP
on lptrain's process-group backend, beside DDP's own allreduce (``scripts/bench_ddp_hook.py``).

One run on this shared 2-core machine differs from the next by up to 2x, so every variant
runs once per round for :data:`ROUNDS` interleaved rounds, and the ratio to DDP native is
taken within each round and given as the median over the rounds with the lowest and highest
round, not as the best round of each (which rewards the luckiest run)."""

from __future__ import annotations

import statistics

from benchmark_sections.common import median_range, spread
from doctools.commands import Run
from doctools.markdown import table

NAME = "ddp-hook"
HEADING = "DDP with lptrain's hook and backend"
QUESTION = (
    "PyTorch DDP averaging its buckets with lptrain's communication hook, and DDP on lptrain's process-group "
    "backend, beside DDP's own allreduce."
)
MINUTES = 5
DEFAULT = True
ROUNDS = 5
RING_GOAL = 0.95  # DDP with the ring hook against DDP native, in steps per second


def measure(run: Run) -> dict:
    run(
        f"python scripts/bench_ddp_hook.py --recipe googlenet --steps 8 --warmup 2 --repeats {ROUNDS} "
        "--variants native,hook:lp,hook:ring,backend:lp --json hook.json"
    )
    return run.json("hook.json")


def paired(rounds: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each variant's ratio to DDP native in every round (native's time over the variant's:
    above 1, faster). A variant with a different number of rounds is refused: its rounds
    would pair with the wrong ones."""
    native = rounds["native"]
    for v, times in rounds.items():
        if len(times) != len(native):
            raise ValueError(f"ddp-hook: {v} has {len(times)} rounds and native {len(native)}, so they do not pair")
    return {v: [n / t for n, t in zip(native, times)] for v, times in rounds.items()}


def render(r: dict) -> list[str]:
    rounds = {v: t for v, t in r["rounds"].items() if t}
    ratio = paired(rounds)
    label = {v: r["labels"].get(v, v) for v in rounds}
    body = [
        [
            label[v],
            ", ".join(f"{x:.2f}" for x in t),
            f"{statistics.median(t):.2f}",
            f"{1e3 * statistics.median(t) / r['steps']:.0f}",
            "1.00x" if v == "native" else median_range(ratio[v]),
        ]
        for v, t in rounds.items()
    ]
    header = ["variant", "train s, each round", "median s", "ms/step", "vs native"]
    warmup, warm = r.get("warmup_steps"), r.get("warmup") or {}
    if warmup:  # records since the warm-up is timed apart (older ones timed every step)
        header.append(f"first {warmup} steps, median s")
        for row, v in zip(body, rounds):
            row.append(f"{statistics.median(warm[v]):.2f}" if warm.get(v) else "-")
    timed = f"{r['steps']} steps timed after {warmup} of warm-up" if warmup else f"{r['steps']} steps"
    n = len(rounds["native"])
    noise = max(spread(t) for t in rounds.values())
    lines = [
        f"{r['recipe']}, {r['where']}, one CPU replica per process, {timed}, {r['bucket_mb']:g} MiB buckets "
        f"everywhere; every variant trains the same network on the same batches. The figure is the wall clock of the "
        f"steps, each variant once per round ({n} rounds, interleaved). The ratio is DDP native's time over the "
        "variant's in the same round (above 1: faster), the median over the rounds and, in brackets, the lowest "
        "and the highest round.",
        "",
        *table(header, body),
        "",
        "- Against DDP native: "
        + ", ".join(f"{label[v]} {median_range(x)}" for v, x in ratio.items() if v != "native")
        + f"; the rounds of one variant differed by up to {100 * noise:.0f}%.",
    ]
    if "hook:ring" in ratio:
        got = ratio["hook:ring"]
        middle = statistics.median(got)
        above = sum(x >= RING_GOAL for x in got)
        lines.append(
            "- Goal: DDP with `lptrain.ddp.state(algo='ring')` at least "
            f"{RING_GOAL:.2f}x DDP native's steps per "
            f"second, by the median of the rounds: {'met' if middle >= RING_GOAL else 'not met'}, {middle:.2f}x "
            f"({above} of {len(got)} rounds at or above)."
        )
    if r["nproc"] == 2:
        lines.append(
            "- With 2 processes LP's chain is a single exchange, the same transfers as gloo's allreduce; lptrain's "
            "schedules run them as gloo point-to-point messages from Python on the hook's thread, beside backward on "
            "the same 2 cores. Every bucket "
            "but the last goes to the hook's thread (the last is ready when backward is over and runs on the calling "
            "thread), and the desync check is one small allreduce per step, not per bucket."
        )
    return lines


def headline(r: dict) -> list[str] | None:
    """None: no figure of this section is in the README's headline table."""
    return None
