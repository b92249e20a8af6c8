"""``lptrain-sim``: predict the collectives at any scale, or calibrate the model here.

lptrain-sim predict --topology pcie --devices 16 --op allreduce -b 1M -e 1G -f 4
lptrain-sim predict --topology racks --devices 8 --link 200mbit --uplink 1/2 --placement interleaved --order racks
lptrain-sim calibrate --devices 4 -b 64K -e 64M
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lptrain.comm.algorithms.order import check_order, format_order, is_identity
from lptrain.comm.measure import OPS, bus_factor
from lptrain.comm.sizes import format_size, message_sizes, parse_size, parse_size_range
from lptrain.exits import EXIT_USAGE, quiet_on_closed_pipe
from lptrain.sim.calibrate import compare, fit, measure
from lptrain.sim.predict import ALGOS, predict, rack_orders
from lptrain.sim.rates import parse_rate, uplink_rate
from lptrain.sim.topology import PLACEMENTS, TOPOLOGIES, Topology, build_topology

# The most ranks ``predict`` prices. It builds each schedule and prices every transfer of it,
# and ring's and BE's allreduce have about 2 P^2 transfers: the time and memory grow with P^2.
# At 1024 ranks a ring allreduce of one size is priced in about half a minute and 200 MB on
# a loaded 2-core machine; at 2048, in nearly two minutes and 1.1 GB; a million would take
# days. 1024 is also the largest machine the documents predict (nodes, 1024 GPUs).
MAX_DEVICES = 1024


def _algos(text: str) -> list[str]:
    algos = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGOS]
    if bad or not algos:
        raise ValueError(f"unknown algorithm(s) {', '.join(bad) or '(none)'}; valid: {', '.join(ALGOS)}")
    return algos


def _topology(args: argparse.Namespace) -> Topology:
    """The machine ``--topology`` names, with ``--link``, and for racks ``--racks``,
    ``--uplink`` and ``--placement``."""
    params: dict = {"per_switch": args.per_switch} if args.topology in ("pcie", "nodes") else {}
    if args.link is not None:
        params["bandwidth"] = parse_rate(args.link, "--link")
    racks_only = {"--racks": args.racks, "--uplink": args.uplink, "--placement": args.placement}
    if args.topology != "racks":
        given = [flag for flag, value in racks_only.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only racks have these; use them with --topology racks")
        return build_topology(args.topology, args.devices, **params)
    params["racks"] = args.racks or 2
    if args.uplink is not None:
        port = params.get("bandwidth") or build_topology("racks", 2).route(0, 1)[0].bandwidth
        params["uplink_bandwidth"] = uplink_rate(args.uplink, port)
    placement = args.placement or "contiguous"
    if placement not in PLACEMENTS:
        placement = [int(r) for r in placement.split(",")] if placement.replace(",", "").isdigit() else placement
    params["placement"] = placement
    return build_topology("racks", args.devices, **params)


def _order(text: str | None, topo: Topology) -> list[int] | None:
    """``--order``: natural (0..P-1), racks (each rack contiguous) or a list such as 0,2,1,3."""
    if text is None or text == "natural":
        return None
    try:
        order = (
            rack_orders(topo).get("racks")
            if text == "racks"
            else check_order([int(r) for r in text.split(",")], topo.world_size)
        )
    except ValueError:
        raise ValueError(
            f"--order must be natural, racks, or a permutation of 0..{topo.world_size - 1} such as "
            f"{','.join(map(str, reversed(range(topo.world_size))))}, got {text!r}"
        ) from None
    return None if order is None or is_identity(order) else order


def _gbps(value: float) -> str:
    """GB/s in 8 characters: two decimals, or three significant digits below 0.1 (slow links)."""
    return f"{value:8.2f}" if value >= 0.1 or value == 0 else f"{value:8.3g}"


def check_devices(devices: int) -> None:
    """``predict``'s P: two or more (one device sends nothing, and its bandwidth would read inf
    and nan), at most ``MAX_DEVICES`` (what it can price in minutes)."""
    if devices == 1:
        raise ValueError("--devices 1: one device sends nothing (every collective takes 0 s); give 2 or more")
    if devices > MAX_DEVICES:
        raise ValueError(
            f"--devices {devices} is more than lptrain-sim prices (at most {MAX_DEVICES}: every transfer of a "
            "schedule is priced, and ring and BE have about 2 P^2 of them)"
        )


def cmd_predict(args: argparse.Namespace) -> int:
    check_devices(args.devices)
    topo = _topology(args)
    order = _order(args.order, topo)
    block = None if args.lp_block == "auto" else parse_size(args.lp_block, "--lp-block")
    print(
        f"# lptrain-sim {args.op} on {topo.describe()}" + (f"; ranks in order {format_order(order)}" if order else "")
    )
    print(f"#{'size':>9} {'algo':>6} {'time(us)':>12} {'algbw':>8} {'busbw':>8}  (GB/s, predicted)")
    rows = []
    for size in message_sizes(args.minbytes, args.maxbytes, args.stepfactor):
        for algo in _algos(args.algo):
            sec = predict(algo, args.op, topo, size, block_bytes=block, order=order).seconds
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
            print(f" {format_size(size):>9} {algo:>6} {sec * 1e6:12.1f} {_gbps(algbw)} {_gbps(rows[-1]['busbw'])}")
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
    p.add_argument("--devices", type=int, default=8, help=f"P, from 2 to {MAX_DEVICES}")
    p.add_argument("--per-switch", type=int, default=4, help="GPUs per PCIe switch (pcie, nodes)")
    p.add_argument("--op", default="allreduce", choices=list(OPS))
    p.add_argument("--algo", default=",".join(ALGOS), help=f"comma-separated, of {', '.join(ALGOS)}")
    p.add_argument("--lp-block", default="auto")
    p.add_argument("--link", help="each port's rate in tc's notation, e.g. 200mbit (default: the topology's own)")
    p.add_argument("--racks", type=int, help="racks: how many (default 2)")
    p.add_argument("--uplink", help="racks: each uplink's rate (100mbit) or a fraction of a port (0.5, 1/2)")
    p.add_argument(
        "--placement", help="racks: contiguous (default), interleaved, or each rank's rack as a list (0,1,0,1)"
    )
    p.add_argument(
        "--order", help="the ranks place by place: natural (default), racks (each rack contiguous), or 0,2,1,3"
    )
    c = sub.add_parser("calibrate", help="fit the host model to runs measured here, show predicted against measured")
    c.add_argument("--devices", type=int, default=4)
    c.add_argument("--trials", type=int, default=3)
    for q, (lo, hi) in ((p, ("1K", "1G")), (c, ("64K", "64M"))):
        q.add_argument("-b", "--minbytes", default=lo)
        q.add_argument("-e", "--maxbytes", default=hi)
        q.add_argument("-f", "--stepfactor", type=int, default=4)
        q.add_argument("--json", metavar="FILE")
    return parser


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.devices < 1:
            raise ValueError(f"--devices must be at least 1, got {args.devices}")
        args.minbytes, args.maxbytes = parse_size_range(args.minbytes, args.maxbytes, args.stepfactor)
        return cmd_predict(args) if args.command == "predict" else cmd_calibrate(args)
    except ValueError as err:  # one line, as every lptrain command says a bad input
        sys.stderr.write(f"{parser.prog} {args.command}: error: {err}\n")
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    sys.exit(main())
