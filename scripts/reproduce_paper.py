#!/usr/bin/env python3
"""Reproduce the paper's claims: figures in docs/figures/ and the text in docs/PAPER_RESULTS.md.

Everything labelled "simulated" is the simulator pricing lptrain's own schedules on a
modelled machine (lptrain.sim.topology: the figures it assumes are stated there and in
the report; none is tuned to the paper). Everything labelled "measured" ran here, on
this machine's CPU, with the in-process executor.

    python scripts/reproduce_paper.py            # full run, a few minutes
    python scripts/reproduce_paper.py --quick    # fewer points (used by the tests)
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lptrain.comm.sizes import format_size  # noqa: E402
from lptrain.sim.calibrate import compare, fit, measure  # noqa: E402
from lptrain.sim.predict import predict  # noqa: E402
from lptrain.sim.topology import build_topology  # noqa: E402

MiB = 2**20
ALGOS = ("lp", "lp-rb", "mst", "be", "ring")
STYLE = {"lp": "-o", "lp-rb": "--o", "mst": "-s", "be": "-^", "ring": "-v"}
MODELS = {"AlexNet": 233 * MiB, "GoogLeNet": 51 * MiB, "VGG-16": 528 * MiB}  # fp32 gradients, PAPER.md
TOPOS = ("pcie", "nvlink", "private")
FLAT_SIZES = (64 * MiB, 256 * MiB, 1024 * MiB)


def seconds(algo: str, topo_name: str, p: int, nbytes: int, op: str = "allreduce") -> float:
    return predict(algo, op, build_topology(topo_name, p), nbytes).seconds


def figure_time_vs_p(out: Path, ps: list[int], big_ps: list[int], nbytes: int) -> dict:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    data = {}
    for ax, (topo, sweep) in zip(axes, (("pcie", ps), ("nvlink", ps), ("nodes", big_ps))):
        for algo in ALGOS:
            ys = [seconds(algo, topo, p, nbytes) * 1e3 for p in sweep]
            data[(topo, algo)] = dict(zip(sweep, ys))
            ax.plot(sweep, ys, STYLE[algo], label=algo, markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices P")
        ax.set_ylabel("allreduce time (ms)")
        ax.set_title(f"simulated: {topo}, {format_size(nbytes)} allreduce")
        ax.legend(fontsize=8)
    fig.suptitle("Claim 1: time against P (simulated on lptrain's schedules)")
    fig.tight_layout()
    fig.savefig(out / "time_vs_p.png", dpi=110)
    plt.close(fig)
    return data


def figure_bandwidth_vs_size(out: Path, p: int, sizes: list[int]) -> dict:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    data = {}
    for topo in TOPOS:
        for algo in ("lp", "be"):
            data[(topo, algo)] = {n: n / seconds(algo, topo, p, n) / 1e9 for n in sizes}
        axes[0].plot(sizes, list(data[(topo, "lp")].values()), "-o", markersize=3, label=f"lp, {topo}")
        axes[0].plot(sizes, list(data[(topo, "be")].values()), "--^", markersize=3, label=f"be, {topo}")
        axes[1].plot(
            sizes, [data[(topo, "lp")][n] / data[(topo, "be")][n] for n in sizes], "-o", markersize=3, label=topo
        )
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("algorithm bandwidth (GB/s)")
    axes[0].set_title(f"simulated: allreduce bandwidth, P = {p}")
    axes[0].legend(fontsize=8)
    axes[1].axhline(1, color="grey", lw=0.8)
    axes[1].axhline(2, color="grey", lw=0.8, ls=":")
    axes[1].set_ylabel("LP bandwidth / BE bandwidth")
    axes[1].set_title("Claim 2: LP over BE (the paper: up to 2x)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bandwidth_vs_size.png", dpi=110)
    plt.close(fig)
    return data


def figure_models(out: Path, ps: list[int]) -> dict:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    data = {}
    for ax, (model, nbytes) in zip(axes, MODELS.items()):
        for algo in ALGOS:
            ys = [seconds(algo, "pcie", p, nbytes) * 1e3 for p in ps]
            data[(model, algo)] = dict(zip(ps, ys))
            ax.plot(ps, ys, STYLE[algo], label=algo, markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices P")
        ax.set_ylabel("gradient allreduce per iteration (ms)")
        ax.set_title(f"simulated: {model} ({nbytes // MiB} MiB), pcie")
        ax.legend(fontsize=8)
    fig.suptitle("Claim 3: per-iteration communication of BSP-SGD")
    fig.tight_layout()
    fig.savefig(out / "models_vs_p.png", dpi=110)
    plt.close(fig)
    return data


def figure_calibration(out: Path, sizes: list[int], trials: int) -> tuple:
    runs = measure(4, sizes, trials=trials)
    model = fit(runs)
    rows = compare(runs, model)
    fig, ax = plt.subplots(figsize=(6, 5))
    for algo in ("lp", "mst", "be", "ring"):
        mine = [r for r in rows if r["algo"] == algo]
        ax.loglog(
            [r["measured_s"] * 1e3 for r in mine], [r["predicted_s"] * 1e3 for r in mine], "o", label=algo, markersize=4
        )
    lo = min(min(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3
    hi = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted after calibration (ms)")
    ax.set_title("measured here: 4 CPU devices, in-process executor")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=110)
    plt.close(fig)
    return model, rows


def report(args, t_vs_p, bw, models, calib, ps, big_ps, p_bw, big) -> str:
    model, rows = calib
    lines = [
        "# The paper's claims, checked",
        "",
        f"Written by `python scripts/reproduce_paper.py{' --quick' if args.quick else ''}` on "
        f"{datetime.date.today().isoformat()} ({platform.machine()}, Python {platform.python_version()}).",
        "",
        "What is simulated and what is measured: every figure but the last is the simulator",
        "(`lptrain.sim`) pricing lptrain's own LP, MST, BE and ring schedules on a modelled",
        "machine; the last is measured on this machine's CPU. The modelled machines use typical",
        "figures, stated here and in `lptrain/sim/topology.py`, and none was tuned to the paper:",
        "",
        "- `pcie` (the paper's kind of machine): 4 GPUs per PCIe switch, switches under one root;",
        "  12 GB/s per direction on every PCIe link, 1 us per hop, 10 us per message, reductions",
        "  at 900 GB/s / 3. Each GPU has one port: all it sends crosses one uplink.",
        "- `nvlink`: a full mesh, 50 GB/s per direction per pair, 1 us, 10 us per message.",
        "- `private`: a dedicated 12 GB/s link per pair, the closed form's assumption.",
        "- `nodes`: nodes of 8 GPUs (two PCIe switches) behind one 12.5 GB/s network port each.",
        "",
        "Model: a step of a schedule ends when its busiest link has drained (transfers sharing",
        "a link share its bandwidth), plus the longest route latency, the message overhead and",
        "the largest reduction on any device. LP blocks follow the cost-model rule",
        "`b* = sqrt(n alpha / ((P-2) beta))`, clamped to 256 KiB..16 MiB.",
        "",
        "## Claim 1: LP's cost is invariant to P; MST grows as log P",
        "",
        f"![time against P](figures/time_vs_p.png)  (simulated, {format_size(big)} allreduce)",
        "",
        "| topology | algorithm | " + " | ".join(f"P={p}" for p in ps) + " | T(P=16) / T(P=2) |",
        "|---|---|" + "---|" * len(ps) + "---|",
    ]
    for topo in ("pcie", "nvlink"):
        for algo in ALGOS:
            d = t_vs_p[(topo, algo)]
            ratio = d[16] / d[2] if 16 in d and 2 in d else float("nan")
            lines.append(f"| {topo} | {algo} | " + " | ".join(f"{d[p]:.1f}" for p in ps) + f" | {ratio:.2f} |")
    lines += [
        "",
        "The issue's question, T(P=16) / T(P=2) of the allreduce, for 64 MiB and up (1.00 = flat):",
        "",
        "| topology | algorithm | " + " | ".join(format_size(n) for n in FLAT_SIZES) + " |",
        "|---|---|" + "---|" * len(FLAT_SIZES),
    ]
    for topo in TOPOS:
        for algo in ALGOS:
            ratios = [seconds(algo, topo, 16, n) / seconds(algo, topo, 2, n) for n in FLAT_SIZES]
            lines.append(f"| {topo} | {algo} | " + " | ".join(f"{x:.2f}" for x in ratios) + " |")
    lines += [
        "",
        f"Times in ms. On nodes joined by a network (P up to {max(big_ps)}):",
        "",
        "| algorithm | " + " | ".join(f"P={p}" for p in big_ps) + " |",
        "|---|" + "---|" * len(big_ps),
    ]
    for algo in ALGOS:
        d = t_vs_p[("nodes", algo)]
        lines.append(f"| {algo} | " + " | ".join(f"{d[p]:.0f}" for p in big_ps) + " |")
    mst = t_vs_p[("pcie", "mst")]
    lp_pcie, lp_nv = t_vs_p[("pcie", "lp")], t_vs_p[("nvlink", "lp")]
    pmax = max(ps)
    flat_pcie, flat_nv = lp_pcie[pmax] / lp_pcie[4], lp_nv[pmax] / lp_nv[4]
    verdict = "nearly flat" if max(flat_pcie, flat_nv) < 1.25 else "not flat"
    lines += [
        "",
        "What the model says (every number below is computed from the tables above):",
        f"- LP from P=4 to P={pmax}: x{flat_pcie:.2f} on pcie, x{flat_nv:.2f} on nvlink: {verdict}, the pipeline "
        "fill (P-2 extra steps) being all that grows.",
        f"- LP from P=2 to P=4 on pcie: x{lp_pcie[4] / lp_pcie[2]:.2f}. With two GPUs each one sends in one "
        "direction only; from three on, the middle GPUs send a reduce block and a broadcast block in every step "
        "through their single PCIe port, which doubles the per-step time (the one-port cap of PAPER.md).",
        f"- MST from P=2 to P={pmax} on pcie: x{mst[pmax] / mst[2]:.2f}, against log2({pmax}) = "
        f"{math.log2(pmax):.0f}: it grows with log P, each extra round resending the whole message.",
        "",
        "## Claim 2: up to 2x the bandwidth of BE for BSP-SGD's message sizes",
        "",
        "![bandwidth against size](figures/bandwidth_vs_size.png)  (simulated, P = " + str(p_bw) + ")",
        "",
        "| topology | " + " | ".join(format_size(n) for n in args.bw_table) + " |",
        "|---|" + "---|" * len(args.bw_table),
    ]
    for topo in TOPOS:
        lines.append(
            f"| {topo}: LP / BE | "
            + " | ".join(f"{bw[(topo, 'lp')][n] / bw[(topo, 'be')][n]:.2f}" for n in args.bw_table)
            + " |"
        )
    largest = max(args.bw_sizes)
    r = {topo: bw[(topo, "lp")][largest] / bw[(topo, "be")][largest] for topo in TOPOS}
    small = min(args.bw_sizes)
    best_pcie = min(ALGOS, key=lambda a: seconds(a, "pcie", p_bw, largest))
    lines += [
        "",
        f"At {format_size(largest)}: LP / BE = {r['private']:.2f} on private links, {r['nvlink']:.2f} on the "
        f"NVLink mesh and {r['pcie']:.2f} under PCIe switches; at {format_size(small)} it is "
        f"{bw[('pcie', 'lp')][small] / bw[('pcie', 'be')][small]:.2f} (pcie).",
        "The paper's 2x is the private-link limit for large P and n (BE moves 2(P-1)/P n through each port,",
        "LP about n). Under PCIe switches each GPU has one port, and LP's overlapped allreduce sends a",
        "reduce block and a broadcast block through it in every step, so the port carries ~2n as well;",
        "BE's exchanges between switches meanwhile share the switch uplinks."
        + (
            " On this model the one-port cap costs LP more than the contention costs BE: the ratio is"
            " lower under PCIe than on private links."
            if r["pcie"] < r["private"]
            else ""
        ),
        f"The fastest schedule for {format_size(largest)} on pcie at P = {p_bw} is {best_pcie}.",
        "Small messages are latency-bound: BE needs 2 log2 P messages, LP 2P-3+k.",
        "",
        "## Claim 3: per-iteration communication of AlexNet, GoogLeNet and VGG-16",
        "",
        "![models against P](figures/models_vs_p.png)  (simulated, pcie)",
        "",
        "| model | algorithm | " + " | ".join(f"P={p}" for p in ps) + " |",
        "|---|---|" + "---|" * len(ps),
    ]
    for name in MODELS:
        for algo in ALGOS:
            d = models[(name, algo)]
            lines.append(f"| {name} | {algo} | " + " | ".join(f"{d[p]:.0f}" for p in ps) + " |")
    lines += [
        "",
        "Milliseconds of gradient allreduce per iteration (simulated, pcie). Computed from the table:",
    ]
    for name in MODELS:
        lp_t, mst_t, be_t = models[(name, "lp")], models[(name, "mst")], models[(name, "be")]
        best = min(ALGOS, key=lambda a: models[(name, a)][pmax])
        lines.append(
            f"- {name}: MST / LP = {mst_t[2] / lp_t[2]:.2f} at P=2 and {mst_t[pmax] / lp_t[pmax]:.2f} at P={pmax}; "
            f"BE / LP = {be_t[pmax] / lp_t[pmax]:.2f} at P={pmax}; fastest at P={pmax}: {best}."
        )
    lines += [
        "",
        "## Claim 4: convergence is unchanged",
        "",
        "Not simulated: measured by the trainer's tests (the same loss curve for lp, mst, be and",
        "ring, and P replicas equal to one device with the P-times larger batch) and in README.md",
        "(97.4 to 97.6% on the embedded MNIST after 300 steps for every communicator).",
        "",
        "## Measured here: the simulator against the in-process executor",
        "",
        "![calibration](figures/calibration.png)",
        "",
        f"Fitted on this machine (4 CPU devices, lp, mst, be and ring, every op, "
        f"{format_size(min(args.calib_sizes))} to {format_size(max(args.calib_sizes))}, in one run): "
        f"{model.describe()}.",
        "",
        "| size | op | algo | measured (us) | predicted (us) | error |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {format_size(row['bytes'])} | {row['op']} | {row['algo']} | {row['measured_s'] * 1e6:.0f} "
            f"| {row['predicted_s'] * 1e6:.0f} | {100 * row['error']:+.0f}% |"
        )
    errs = sorted(abs(r["error"]) for r in rows)

    def median_error(selected) -> str:
        e = sorted(abs(r["error"]) for r in selected)
        return f"{100 * e[len(e) // 2]:.0f}%" if e else "n/a"

    cached = [r for r in rows if 4 * r["bytes"] <= model.cache_bytes]
    streamed = [r for r in rows if 4 * r["bytes"] > model.cache_bytes]
    lines += [
        "",
        f"Median absolute error {100 * errs[len(errs) // 2]:.0f}%, worst {100 * errs[-1]:.0f}%: "
        f"{median_error(cached)} (median) where the four devices' buffers fit in the cache, "
        f"{median_error(streamed)} where they do not. The host model knows two copy bandwidths only;",
        "a schedule whose blocks stay in cache while the whole message does not (LP's pipeline, the",
        "ring's chunks) runs between the two, and the machine is shared, so single rows are noisy.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer points, seconds instead of minutes")
    parser.add_argument("--docs", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = parser.parse_args(argv)
    out = args.docs / "figures"
    out.mkdir(parents=True, exist_ok=True)
    big = 256 * MiB
    if args.quick:
        ps, big_ps, p_bw = [2, 4, 8, 16], [8, 16, 32], 8
        args.bw_sizes = [2**k for k in range(10, 31, 5)]
        args.calib_sizes, trials = [64 * 1024, 1 * MiB], 1
    else:
        ps, big_ps, p_bw = [2, 4, 8, 16, 32, 64], [8, 32, 128, 512, 1024], 8
        args.bw_sizes = [2**k for k in range(10, 31)]
        args.calib_sizes, trials = [4**k * 1024 for k in range(0, 9)], 3
    args.bw_table = [n for n in args.bw_sizes if n in (1024, 2**20, 64 * MiB, 256 * MiB, 2**30)] or args.bw_sizes
    print("claim 1: time against P ...", flush=True)
    t_vs_p = figure_time_vs_p(out, ps, big_ps, big)
    print("claim 2: bandwidth against size ...", flush=True)
    bw = figure_bandwidth_vs_size(out, p_bw, args.bw_sizes)
    print("claim 3: the models ...", flush=True)
    models = figure_models(out, ps)
    print("measured: calibration on this machine ...", flush=True)
    calib = figure_calibration(out, args.calib_sizes, trials)
    text = report(args, t_vs_p, bw, models, calib, ps, big_ps, p_bw, big)
    (args.docs / "PAPER_RESULTS.md").write_text(text)
    print(f"wrote {args.docs / 'PAPER_RESULTS.md'} and {out}/*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
