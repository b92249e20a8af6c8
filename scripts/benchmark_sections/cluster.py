"""cluster: the collectives on an emulated cluster (network namespaces, one shaped port per
node), where the link and not the CPU sets the time.

``scripts/cluster_results.py`` measures it (as root, about 90 minutes) and keeps its rows
in docs/data/cluster.json, which is this section's data: :func:`record` frames them as a
section's record."""

from __future__ import annotations

import json
import os

from benchmark_sections.common import size_label
from doctools import DOCS
from doctools import cluster_experiment as ex
from doctools import cluster_tables as tb
from doctools.commands import Run
from lptrain.comm.program import pipeline_block_bytes

NAME = "cluster"
HEADING = "Across namespaces with shaped links: where the network is the bottleneck"
QUESTION = (
    "The collectives on an emulated cluster (network namespaces, one shaped port per node), where the link "
    "and not the CPU sets the time."
)
MINUTES = 90
DEFAULT = False  # root, and more than an hour
DATA = DOCS / "data" / "cluster.json"
# Rows measured before this date ran reduce with a fresh copy of every non-root rank's tensor per
# call; the section says so where its rows are older (tests/test_distributed.py has the count).
KEPT_COPY = "2026-12-05 15:00"


def measure(run: Run) -> dict:
    if os.geteuid() != 0:
        raise RuntimeError("the cluster section needs root (network namespaces): run it as root")
    run("python scripts/cluster_results.py")
    return json.loads(DATA.read_text())


def record(data: dict) -> dict:
    """docs/data/cluster.json as a section's record: the date, machine and commands of its run."""
    c = data["conditions"]
    nodes = sorted({r["nodes"] for r in tb.rows_of(data)})
    each = (
        f"lptrain-cluster --nodes P --link {c['link']} -- lptrain-bench --op all -b 4M -e 16M "
        f"--algo {','.join(ex.BENCH_ALGOS)},auto --topology probe -n 1 --trials 2"
    )
    racks = (
        f"lptrain-cluster --nodes 8 --layout racks --racks 2 --link {c['link']} --uplink 100mbit -- "
        f"lptrain-bench --op allreduce -b 4M -e 16M --algo {','.join(ex.RACK_ALGOS)} --topology probe -n 1 --trials 2"
    )
    runs = ex.parts_measured(data).get("bench") or [{}]  # the section's main table: the star's first run
    star = min(runs, key=lambda s: s.get("date", ""))
    return {
        "section": "cluster",
        "started": star.get("date") or c.get("date", "?"),
        "took_s": None,
        "machine": star.get("machine") or c["machine"],
        "load": None,
        "commands": [
            f"python scripts/cluster_results.py   # as root; on the star, for P = {nodes[0]} to {nodes[-1]}, it runs",
            each,
            "# and on racks (2 and 4 racks, uplinks at 1/2 and 1/4 of a port), for example",
            racks,
        ],
        "results": data,
    }


def render(data: dict) -> list[str]:
    c = data["conditions"]
    star = {r["nodes"] for r in tb.rows_of(data)}
    nodes = tuple(p for p in (2, 4, 8, 16) if p in star)
    checked = [r for r in data["bench"] if r.get("wrong") is not None]
    wrong = sum(1 for r in checked if r["wrong"])
    loads = [r["load"] for r in data["bench"] if "load" in r]
    load = f"load average {min(loads):.1f} to {max(loads):.1f} at the runs' starts" if loads else "load not recorded"
    if c.get("nice"):
        load += f", the runs at {tb.nice_phrase(data)}, ahead of the machine's other work"
    check = tb.fidelity_phrase(data)
    if check:  # rows measured with the fidelity check, on links of MTU 9000
        load += f"; {check}"
    lines = [
        f"Measured in parts (`--only`): {tb.provenance(data)}.",
        "",
        f"Every node a network namespace with one full-duplex port shaped to {c['link']} (B = "
        f"{c['link_bytes_per_s'] / 1e6:.1f} MB/s one way), one process per node over gloo; {load}. "
        f"Medians of 2 trials; {len(checked) - wrong} of {len(checked)} results checked correct (#wrong {wrong}). "
        f"Times are multiples of n/B at {tb.size_label(ex.BIG)}: n/B is one port's physical limit for a broadcast; "
        "TCP's payload is 99.3% of the shaped rate at MTU 9000, and each port's shaper lets a burst of 128 KiB "
        "through at once, so a few rows read just under 1. comm=auto chose "
        f"from the topology it probed at start. Every P measured ({tb.node_list(sorted(star))}), both sizes and the "
        "simulator's errors: "
        "[PAPER_RESULTS.md](PAPER_RESULTS.md#measured-on-emulated-links-the-claims-where-the-network-is-the-bottleneck).",
        "",
        "The star (one switch):",
        "",
        *tb.bench_table(data, ex.BIG, nodes),
        "",
    ]
    for op in ("broadcast", "reduce"):
        lo, hi, span_nodes = tb.span(data, "lp", op, ex.BIG)
        slo, shi, _ = tb.span(data, "lp", op, ex.SMALL)
        lines.append(
            f"- LP {op}: {lo:.2f} to {hi:.2f} n/B at 16 MiB over P = {span_nodes[0]} to {span_nodes[-1]} "
            f"({slo:.2f} to {shi:.2f} at 4 MiB)."
        )
    be = tb.against_one_port(data, "be")
    if be:
        within = [r for ratio, r in be if ratio <= 1.10]
        lines.append(
            f"- BE is held to its own program's one-port model: 2(P-1)/P at a power of two and, at any other P, the "
            f"extra ranks' whole message handed over first and back after (2.50 n/B for a reduce at P = 5 to 7; "
            f"`lptrain-sim predict --topology oneport`). {len(within)} of its {len(be)} rows (3 ops, 4 and 16 MiB, "
            f"P = {min(r['nodes'] for _, r in be)} to {max(r['nodes'] for _, r in be)}) are within 1.10x of it; "
            "the farthest: "
            + ", ".join(
                f"{r['op']} at P = {r['nodes']}, {tb.size_label(r['size'])}, {ratio:.2f}x" for ratio, r in be[:2]
            )
            + ". Its allreduce's steps each wait for the last, so a message's CPU cost falls between two transfers, "
            "all ranks at once: it now sends a rank's share per message on a slow link too (1 MiB and more, where "
            "the link's own 10 ms made 256 KiB; over 16 nodes at 4 MiB 2.10 n/B in 256 KiB messages, 2.02 to 2.06 "
            "in 1 to 2 MiB, `MESSAGE_RULES` in `lptrain/comm/program.py`), and its rows were measured again with "
            "it (`--only bench --algos be`)."
        )
        past = {(r["op"], r["nodes"], r["size"]) for ratio, r in be if ratio > 1.10}
        if ("reduce", 8, ex.BIG) in past or ("allreduce", 16, ex.SMALL) in past:
            lines.append(
                "- BE's farthest rows run again (2026-12-06, the 2-core machine): the reduce at P = 8, 16 MiB, which "
                "read 2.03 and 1.99 n/B in the last two grids, took 1.80 in the grid's own command (`lptrain-cluster "
                "--nodes 8 --link 200mbit -- lptrain-bench --op all -b 4M -e 16M -f 4 --algo be -n 1 --trials 2`) "
                "and 1.87 with `--op reduce -b 16M -e 16M --trials 6`, single calls 1.77 to 1.88 (the median of 8, "
                "1.81; the model 1.75): the rows were slow runs, the spread of a median of two trials. The allreduce "
                "at P = 16, 4 MiB, in 1 MiB messages: single calls 1.95 to 2.35 n/B, the median of 6 2.06 (1.10x); "
                "the broadcast at P = 16, 16 MiB: 1.93 to 1.95 in 4 calls (1.04x). Every such run passed "
                "lptrain-cluster's fidelity check at its start (it refuses below 90% of the rate); in the per-call "
                "runs the slowest port carried 99.0% (P = 8) and 99.1% (P = 16) with every port busy."
            )
        if c["date"] < KEPT_COPY:
            lines.append(
                "- Why BE's reduce is the farthest in these rows: each rank but the root ran the schedule on a fresh "
                "copy of its tensor, which faulted all its pages in at every call (4096 for 16 MiB); with 8 or 16 "
                "processes on 2 cores those ranks entered the schedule tens of milliseconds after the root, and every "
                "later step waits for the slowest pair. The executor keeps that copy from call to call "
                "(`lptrain/comm/distributed.py`). Side by side at P = 8, 2 rounds, each a run with the fresh copy "
                "then one with the kept one (`lptrain-cluster --nodes 8 --link 200mbit -- lptrain-bench --op reduce "
                "-b 16M -e 16M --algo be,ring,mst -n 1 --trials 2`, 2026-12-05, the 2-core machine): BE took 1.89 "
                "and 1.92 n/B with the fresh copy, 1.82 and 1.78 with the kept one (the model 1.75; the ring 1.76 "
                "to 1.78 in all four); the rows above had the fresh copy."
            )
    ring = tb.against_one_port(data, "ring")
    if ring:
        within = [r for ratio, r in ring if ratio <= 1.10]
        worst, row = ring[0]
        lines.append(
            f"- The ring is held to its program's one-port model, 2(P-1)/P n/B for each op: {len(within)} of its "
            f"{len(ring)} rows (3 ops, 4 and 16 MiB, P = {min(r['nodes'] for _, r in ring)} to "
            f"{max(r['nodes'] for _, r in ring)}) are within 1.10x of it, the farthest {row['op']} at P = "
            f"{row['nodes']}, {tb.size_label(row['size'])}, {worst:.2f}x. Its reduce ends with every rank sending "
            "its share to the root; posted all at once, those P - 1 flows into one port now and then lost segments "
            "to TCP incast (single calls at 1.1x to 1.6x the median at P = 12 and 16), and such rows read up to "
            "1.35x. The root now takes them two senders at a time (`lptrain/comm/algorithms/ring.py` has the "
            "figures), and the ring's reduce rows were measured again with it (`--only bench --algos ring --ops "
            "reduce`)."
        )
    auto = tb.auto_against_gloo(data)
    if auto:
        lines.append(
            f"- comm=auto's allreduce on the star: at most {auto[0]:.2f}x gloo's own time (P = {auto[1]['nodes']}, "
            f"{tb.size_label(auto[1]['size'])})."
        )
    below = tb.auto_below_lp_block(data)
    if below:
        ps = sorted({r["nodes"] for r in below})
        own = pipeline_block_bytes(c["link_bytes_per_s"]) >> 10
        lines.append(
            f"- In {len(below)} of the star's rows (P = {ps[0]} to {ps[-1]}, "
            f"{', '.join(sorted({tb.size_label(r['size']) for r in below}))}) comm=auto ran LP in blocks smaller than "
            f"LP's own on that link (the lp column's {own} KiB): priced from the lone exchange measured at start, they "
            "looked cheapest. These rows predate the rule that auto prices no LP block below the one the link sets "
            "(`lptrain/auto/simulated.py`), under which it runs LP's own block, as in the lp column."
        )
    lines += [
        "- A node has one port, so LP's allreduce (a reduce and a broadcast overlapped) sends about 2n through it "
        "where the ring sends 2(P-1)/P n: on a star the ring and gloo's own are the allreduce to use, and auto "
        "picks the ring.",
        "",
    ]
    second = tb.rates_table(data)
    if second:
        lines += rates_lines(data, second)
    quarter = tb.pipeline_table(data)
    if quarter:
        lines += pipeline_lines(data, quarter)
    if tb.layouts(data):
        lines += [
            "Racks joined by thin uplinks (allreduce, 16 MiB; each rack's uplink carries the stated share of a port "
            "each way). LP's chain with each rack contiguous crosses every uplink once each way, where the ring's "
            "traffic crosses it 2(P-1)/P n; lp overlaps its reduce and broadcast, lp-rb runs one, then the other:",
            "",
            *tb.racks_table(data, ex.BIG),
            "",
        ]
    if data.get("ddp"):
        lines += [
            "Real training, GoogLeNet under DDP (`scripts/bench_ddp_hook.py --recipe googlenet --cluster ...`), "
            "the wall clock of the training steps:",
            "",
            *tb.ddp_table(data),
        ]
    return lines


def pipeline_lines(data: dict, quarter: list[str]) -> list[str]:
    """LP's broadcast and reduce at a quarter of the rate beside the star's own: what LP takes
    where each hop's wait for one of the host's cores no longer sets the time."""
    first, rate = data["conditions"]["link"], tb.rate_words(data["pipeline"][0]["link"])
    cores = tb.host_cores(data)
    spans = []
    for op in ex.PIPELINE_OPS:
        lo, hi, above = tb.pipeline_span(data, op)
        spans.append(f"{op} {lo:.2f} to {hi:.2f} n/B, {tb.pipeline_held(above)}")
    return [
        f"LP's broadcast and reduce (block auto) on the same star at every P, at {first} and at a quarter of the "
        f"rate, {rate} (cells: n/B at {first} / at {rate}; one run at {rate}, each row the median of two trials, "
        "`python scripts/cluster_results.py --only pipeline`). "
        f"Every hop of LP's chain waits for its process to get one of the host's {cores or 'few'} cores, a cost "
        "fixed in seconds, which the fidelity check (every port busy at once, no process waiting for another) "
        "does not see; at a quarter of the rate it weighs a quarter as much in n/B. At "
        f"{rate}: {'; '.join(spans)}:",
        "",
        *quarter,
        "",
        *([words, ""] if (words := tb.chain_cost_words(data)) else []),
    ]


def rates_lines(data: dict, second: list[str]) -> list[str]:
    """The star at both rates: the table, the spread of the ratios, and the rows that moved."""
    lo, hi = tb.rates_spread(data)
    pairs = tb.rate_pairs(data)
    nodes = " and ".join(str(p) for p in sorted({r["nodes"] for r, _, _ in pairs}))
    first, half = data["conditions"]["link"], tb.rate_words(pairs[0][0]["link"])
    together = any(r["link"] == first for r in data["rates"])
    compared = [x for x in pairs if x[0]["algo"] != "auto"]
    moved = tb.rate_moved(data)
    within = len(compared) - len(moved)
    lines = [
        f"The same star at P = {nodes} at {first} and at half the rate, {half} (cells: n/B at {first} / at {half}; "
        + ("both rates measured one after the other in one run, " if together else "")
        + "`python scripts/cluster_results.py --only rates`): where the link sets the times, their multiples of n/B "
        f"do not depend on the rate. {within} of {len(compared)} rows are within 5% at both rates; the ratios run "
        f"from {lo:.2f} to {hi:.2f}:",
        "",
        *second,
        "",
    ]
    if moved:
        rows = "; ".join(f"{tb._column(r['algo'])} {r['op']} at P = {r['nodes']}, {tb.size_label(r['size'])} "
                         f"({a:.2f} and {b:.2f})" for r, a, b in moved)  # fmt: skip
        lines += [
            f"- Rows more than 5% apart between the rates, the farthest first (each a median of two trials): {rows}.",
            "",
        ]
    return lines


def headline(data: dict) -> list[str] | None:
    speedup = tb.racks_speedup(data, 2, "1/2", 8, ex.BIG)
    if speedup is None:
        return None
    lo, hi, nodes = tb.span(data, "lp", "broadcast", ex.BIG)
    return [
        f"Emulated cluster, 8 nodes in 2 racks, uplinks at half a port, {size_label(ex.BIG)} allreduce",
        f"comm=auto {speedup:.2f}x gloo's own (star: LP broadcast {lo:.2f} to {hi:.2f} n/B, P = {nodes[0]} to "
        f"{nodes[-1]})",
    ]
