"""``lptrain-sim``: predict the collectives at any scale, or calibrate the model here.

lptrain-sim predict --topology pcie --devices 16 --op allreduce -b 1M -e 1G -f 4
lptrain-sim calibrate --devices 4 -b 64K -e 64M
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lptrain.comm.measure import OPS, bus_factor
from lptrain.comm.sizes import format_size, message_sizes, parse_size, parse_size_range
from lptrain.sim.calibrate import compare, fit, measure
from lptrain.sim.predict import ALGOS, predict
from lptrain.sim.topology import TOPOLOGIES, build_topology


def _algos(text: str) -> list[str]:
    algos = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGOS]
    if bad or not algos:
        raise ValueError(f"unknown algorithm(s) {', '.join(bad) or '(none)'}; valid: {', '.join(ALGOS)}")
    return algos


def cmd_predict(args: argparse.Namespace) -> int:
    params = {"per_switch": args.per_switch} if args.topology in ("pcie", "nodes") else {}
    topo = build_topology(args.topology, args.devices, **params)
    block = None if args.lp_block == "auto" else parse_size(args.lp_block, "--lp-block")
    print(f"# lptrain-sim {args.op} on {topo.describe()}")
    print(f"#{'size':>9} {'algo':>6} {'time(us)':>12} {'algbw':>8} {'busbw':>8}  (GB/s, predicted)")
    rows = []
    for size in message_sizes(args.minbytes, args.maxbytes, args.stepfactor):
        for algo in _algos(args.algo):
            sec = predict(algo, args.op, topo, size, block_bytes=block).seconds
            algbw = size / sec / 1e9 if sec else float("inf")
            rows.append(
                {
                    "size": size,
                    "algo": algo,
                    "seconds": sec,
                    "algbw": algbw,
                    "busbw": algbw * bus_factor(args.op, args.devices),
                }
            )
            print(f" {format_size(size):>9} {algo:>6} {sec * 1e6:12.1f} {algbw:8.2f} {rows[-1]['busbw']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    sizes = message_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    print(f"# measuring lp, mst, be, ring on {args.devices} CPU devices, {len(sizes)} sizes ...", flush=True)
    runs = measure(args.devices, sizes, trials=args.trials)
    model = fit(runs)
    print(f"# fitted host model: {model.describe()}")
    print(f"#{'size':>9} {'op':>9} {'algo':>5} {'measured(us)':>13} {'predicted(us)':>14} {'error':>7}")
    rows = compare(runs, model)
    for r in rows:
        print(
            f" {format_size(r['bytes']):>9} {r['op']:>9} {r['algo']:>5} {r['measured_s'] * 1e6:13.1f}"
            f" {r['predicted_s'] * 1e6:14.1f} {100 * r['error']:+6.1f}%"
        )
    worst = max(abs(r["error"]) for r in rows)
    print(
        f"# {len(rows)} runs, median |error| {100 * sorted(abs(r['error']) for r in rows)[len(rows) // 2]:.1f}%, "
        f"worst {100 * worst:.1f}%"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": vars(model), "rows": rows}, f, indent=1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lptrain-sim", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="predicted times on a modelled machine")
    p.add_argument("--topology", default="pcie", choices=list(TOPOLOGIES))
    p.add_argument("--devices", type=int, default=8, help="P, up to thousands")
    p.add_argument("--per-switch", type=int, default=4, help="GPUs per PCIe switch (pcie, nodes)")
    p.add_argument("--op", default="allreduce", choices=list(OPS))
    p.add_argument("--algo", default=",".join(ALGOS), help=f"comma-separated, of {', '.join(ALGOS)}")
    p.add_argument("--lp-block", default="auto")
    c = sub.add_parser("calibrate", help="fit the host model to runs measured here, show predicted against measured")
    c.add_argument("--devices", type=int, default=4)
    c.add_argument("--trials", type=int, default=3)
    for q, (lo, hi) in ((p, ("1K", "1G")), (c, ("64K", "64M"))):
        q.add_argument("-b", "--minbytes", default=lo)
        q.add_argument("-e", "--maxbytes", default=hi)
        q.add_argument("-f", "--stepfactor", type=int, default=4)
        q.add_argument("--json", metavar="FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.devices < 1:
            raise ValueError(f"--devices must be at least 1, got {args.devices}")
        args.minbytes, args.maxbytes = parse_size_range(args.minbytes, args.maxbytes, args.stepfactor)
        return cmd_predict(args) if args.command == "predict" else cmd_calibrate(args)
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    sys.exit(main())
