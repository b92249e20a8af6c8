#!/usr/bin/env python3
"""Measure the collectives and training on the emulated cluster and write the results.

Needs root (or a user namespace): every measurement is an ``lptrain-cluster`` run. The
rows go to docs/data/cluster.json; the tables go into docs/BENCHMARKS.md (its cluster
section, between ``<!-- benchmarks:cluster -->`` markers, as ``scripts/benchmarks.py --only
cluster`` writes it from ``scripts/benchmark_sections/cluster.py``) and into
docs/PAPER_RESULTS.md between ``<!-- cluster:paper -->`` markers, and the figure to
docs/figures/cluster_time_vs_p.png. The measurements and tables themselves are
``scripts/doctools/cluster_experiment.py``.

    python scripts/cluster_results.py                      # everything, about 45 minutes
    python scripts/cluster_results.py --only bench --nodes 2,4,8
    python scripts/cluster_results.py --render             # tables again from the JSON, no runs
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from benchmark_sections import BY_NAME, cluster
from benchmark_sections.page import DATA as BENCHMARKS_DATA
from benchmark_sections.page import DOC as BENCHMARKS_DOC
from benchmark_sections.page import write_section
from doctools import DOCS, ROOT
from doctools import cluster_experiment as ex
from doctools.document import update_sections
from doctools.files import read_json, write_json

DATA = cluster.DATA
BIG, SMALL = ex.BIG, ex.SMALL


def _train_load(data: dict) -> str:
    loads = [t["load"] for t in data["train"] if "load" in t]
    if not loads:
        return "the machine was shared with other work while these ran (its load not recorded)"
    return f"load average {min(loads):.1f} to {max(loads):.1f} at the starts of the runs"


def paper_section(data: dict) -> list[str]:
    lines = [
        "## Measured on emulated links: the claims where the network is the bottleneck",
        "",
        "![time against P on the emulated cluster](figures/cluster_time_vs_p.png)",
        "",
        "Measured, not simulated: every node a network namespace with one full-duplex port shaped by "
        "`lptrain-cluster` (a `tc htb` token bucket, MTU 9000, TCP bbr: lptrain/cluster/plan.py says why), "
        f"one torchrun process per node over gloo (`python scripts/cluster_results.py`); {ex.describe(data)}. "
        "Times are multiples of n/B (n the message, B the nominal rate of one port one way).",
        "",
    ]
    for size in (SMALL, BIG):
        for op in ex.OPS:
            lines += [f"### {op}, {ex._size_label(size)}", "", *ex.time_vs_p_table(data, op, size), ""]
    lines += ["### Flatness in P", ""]
    for size in (SMALL, BIG):
        for op in ("broadcast", "reduce"):
            lo, hi = ex.flatness(data, "lp", op, size)
            blo, bhi = ex.flatness(data, "be", op, size)
            lines.append(f"- LP {op} at {ex._size_label(size)}: {lo:.2f} to {hi:.2f} n/B over P = 2 to 8 "
                         f"(BE {blo:.2f} to {bhi:.2f}).")  # fmt: skip
    lines += [""]
    if data.get("train"):
        c = data["train"][0]
        lines += [
            "### The paper's iteration against allreduce in training",
            "",
            f"GoogLeNet at 64 px with its auxiliary classifiers ({c['parameters'] / 1e6:.1f} M parameters, "
            f"{c['parameters'] * 4 / 1e6:.0f} MB of fp32 gradients), synthetic data, one CPU replica per "
            f"node, batch 8 per node, `trainer.overlap=false`; communication ms per iteration, median of the steps "
            f"after the first ({c['steps']} steps); {_train_load(data)}.",
            "",
            *ex.train_table(data),
            "",
        ]
    if data.get("bench"):
        table, s = ex.prediction_table(data)
        w = s["worst"]
        lines += [
            "### The simulator held against the cluster",
            "",
            f"`lptrain.sim.dataflow` runs each rank's program as the executor does (segments, issue order, one "
            f"connection per pair, max-min fair shares of each port). Calibrated on the two-node rows only (a grid "
            f"search): B = {s['bandwidth'] / 1e6:.1f} MB/s, {s['overhead'] * 1e6:.0f} us per message. Every row "
            f"with P > 2 is a prediction: median error {s['median']:.0%}, largest {s['max']:.0%} ({w['algo']} "
            f"{w['op']} at P = {w['nodes']}, {ex._size_label(w['size'])}) over {s['count']} rows.",
            "",
            "By P, median and largest error: "
            + "; ".join(f"P = {p}: {m:.0%}, {x:.0%}" for p, (m, x) in s["by_p"].items())
            + f". In {s['slower']} of the {s['count']} predicted rows the cluster was slower than the model. "
            "One disagreement is "
            "MST's allreduce at P = 2 (measured 1.84 n/B, predicted 1.0): the model lets the reduce and the "
            "broadcast overlap on the one link both ways; over gloo they do not, probably because the root's "
            "receive notices queue behind the broadcast's bytes on the same connection (not verified).",
            "",
            *table,
            "",
        ]
    if data.get("auto"):
        lines += [
            "### comm=auto tuned on the cluster",
            "",
            "`lptrain-bench --save-tuning` on 4 nodes, then auto timed beside every fixed algorithm in a later "
            "run (allreduce; seconds per call; "
            + (
                f"load average {data['auto']['load']:.1f}"
                if "load" in data["auto"]
                else "the machine was shared with other work while these ran, its load not recorded"
            )
            + "):",
            "",
            *ex.auto_table(data),
            "",
        ]
    return lines


def figure(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, no display
    import matplotlib.pyplot as plt

    rows = ex.with_nominal(data)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=False)
    for ax, op in zip(axes, ex.OPS):
        for algo in ex.TABLE_ALGOS:
            points = sorted((r["nodes"], ex._n_over_b(r)) for r in rows if r["op"] == op and r["algo"] == algo
                            and r["size"] == BIG)  # fmt: skip
            if points:
                ax.plot(*zip(*points), marker="o", label="gloo's own" if algo == "gloo" else algo)
        ax.set_title(f"{op}, 16 MiB (measured)")
        ax.set_xlabel("P (nodes)")
        ax.set_ylabel("time / (n/B)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Emulated cluster, {data['conditions']['link']} per port", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(data: dict) -> None:
    """docs/BENCHMARKS.md's cluster section and the figure (where there are benchmark rows),
    and PAPER_RESULTS.md's section between ``<!-- cluster:paper -->`` markers."""
    if data.get("bench"):
        write_section(BY_NAME[cluster.NAME], cluster.record(data), BENCHMARKS_DOC, BENCHMARKS_DATA)
        figure(data, DOCS / "figures" / "cluster_time_vs_p.png")
    update_sections(DOCS / "PAPER_RESULTS.md", {"paper": paper_section(data)}, prefix="cluster")


def _nodes(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--link", default="200mbit")
    p.add_argument("--nodes", type=_nodes, default=list(range(2, 17)), help="node counts of the star")
    p.add_argument("--train-nodes", type=_nodes, default=[4, 8])
    p.add_argument("--train-steps", type=int, default=6)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--sizes", default="4M,16M", help="the benchmark's message sizes (from,to: -b and -e, x4 apart)")
    p.add_argument(
        "--only",
        default="bench,racks,ddp,train",
        help=f"parts to measure again, of {', '.join(ex.PARTS)} (auto: the old tuned comm=auto on 4 nodes)",
    )
    p.add_argument("--rack-nodes", type=_nodes, default=[8], help="node counts of the racks grid")
    p.add_argument("--ddp-steps", type=int, default=4, help="steps of each DDP and trainer run")
    p.add_argument("--render", action="store_true", help="no runs: tables and figure from docs/data/cluster.json")
    args = p.parse_args(argv)
    previous = read_json(DATA) if DATA.exists() else None
    if args.render:
        if previous is None:
            p.error(f"{DATA} does not exist yet; run without --render first")
        render(previous)
        return 0
    only = set(args.only.split(","))
    if os.geteuid() == 0:
        os.nice(-10)  # ahead of whatever else runs on the machine: the CPU should not set the times
    if not only <= set(ex.PARTS):
        p.error(f"--only takes {', '.join(ex.PARTS)}, got {args.only!r}")

    def save(data: dict) -> None:
        data["conditions"]["date"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        write_json(DATA, data)

    try:
        sizes = tuple(args.sizes.split(","))
        data = ex.measure(args.nodes, args.link, sizes, args.trials, args.train_nodes, args.train_steps, only,
                          previous, say=lambda m: print(m, file=sys.stderr, flush=True), save=save,
                          rack_nodes=tuple(args.rack_nodes), ddp_steps=args.ddp_steps)  # fmt: skip
    except RuntimeError as err:
        print(f"cluster_results: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cluster_results: interrupted; what was measured before is in " + str(DATA), file=sys.stderr)
        return 130
    save(data)
    render(data)
    print(
        f"wrote {DATA.relative_to(ROOT)}, docs/BENCHMARKS.md, docs/PAPER_RESULTS.md, docs/figures/cluster_time_vs_p.png"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
