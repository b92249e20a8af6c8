"""Render a Chrome trace from ``trainer.profile`` as a timeline PNG (matplotlib, no browser).

    python scripts/trace_figure.py outputs/.../profile/trace_rank0.json --out docs/figures/lp_trace_alexnet.png

One row per thread that has lptrain's ranges: the trainer's phases (data, compute, comm,
update ...) and autograd's backward operators on the thread that runs backward, each
bucket's collective (``lptrain allreduce lp BYTES B bucket K``) on the communication
thread. Where the buckets' bars sit under backward's, communication overlapped it. The
trace file itself opens in Perfetto (ui.perfetto.dev) or chrome://tracing; this is a
rendering of it, for documents.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLOURS = {
    "data": "#bbbbbb",
    "comm_buffers": "#d9b3ff",
    "compute": "#9ecae1",
    "comm": "#fdae6b",
    "update": "#a1d99b",
    "comm_params": "#d9b3ff",
}
BACKWARD = "autograd::engine::evaluate_function: "


def load(path: Path) -> list[dict]:
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def render(trace: Path, out: Path, title: str) -> dict[str, int]:
    events = load(trace)
    phases = [e for e in events if e["name"].startswith("lptrain phase ")]
    buckets = [e for e in events if e["name"].startswith("lptrain ") and " bucket " in e["name"]]
    if not phases or not buckets:
        raise SystemExit(f"{trace}: no lptrain phase or bucket ranges (was it written by trainer.profile?)")
    main_tid = phases[0]["tid"]
    backward = [e for e in events if e["name"].startswith(BACKWARD) and e["tid"] == main_tid]
    t0 = min(e["ts"] for e in phases)
    ms = lambda us: (us - t0) / 1e3  # noqa: E731

    fig, ax = plt.subplots(figsize=(12, 3.4))
    rows = {"phases (main thread)": 2, "backward operators (main thread)": 1, "bucket collectives (comm thread)": 0}
    wide = 0.05 * ms(max(x["ts"] + x["dur"] for x in phases + buckets))  # a bar wide enough for a label
    for e in phases:
        phase = e["name"].removeprefix("lptrain phase ")
        ax.barh(2, e["dur"] / 1e3, left=ms(e["ts"]), height=0.7, color=PHASE_COLOURS.get(phase, "#cccccc"))
        if e["dur"] / 1e3 > wide:
            ax.text(ms(e["ts"]) + e["dur"] / 2e3, 2, phase, ha="center", va="center", fontsize=8)
    for e in backward:
        ax.barh(1, e["dur"] / 1e3, left=ms(e["ts"]), height=0.7, color="#3182bd", linewidth=0)
    for e in buckets:
        words = e["name"].split()
        label = f"{words[1]} {words[2]} b{words[-1]}\n{int(words[3]) / 2**20:.0f} MiB"
        ax.barh(0, e["dur"] / 1e3, left=ms(e["ts"]), height=0.7, color="#e6550d", edgecolor="black", linewidth=0.5)
        if e["dur"] / 1e3 > wide:
            ax.text(ms(e["ts"]) + e["dur"] / 2e3, 0, label, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(list(rows.values()), list(rows.keys()))
    ax.set_xlabel("ms since the first profiled step began")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    return {"phases": len(phases), "backward": len(backward), "buckets": len(buckets)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", default="lptrain: the LP bucket collectives overlapping backward")
    args = p.parse_args()
    counts = render(args.trace, args.out, args.title)
    print(f"{args.out}: {counts['phases']} phase ranges, {counts['backward']} backward operators, "
          f"{counts['buckets']} bucket collectives")  # fmt: skip


if __name__ == "__main__":
    main()
