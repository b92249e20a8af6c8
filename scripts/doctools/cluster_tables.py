"""The emulated cluster's rows (``cluster_experiment``) as the documents' tables: times as
multiples of n/B, where n is the message and B the nominal rate of one port one way (the
physical limit of a broadcast), so that a reader compares algorithms, node counts and
layouts without the link's rate.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from dataclasses import dataclass

from doctools import cluster_model as model
from doctools.cluster_experiment import (
    DDP_VARIANTS,
    OPS,
    PIPELINE_OPS,
    RACK_TABLE_ALGOS,
    STAR,
    TABLE_ALGOS,
    TRAIN_CASES,
    layout_of,
    parts_measured,
)
from doctools.machine import describe as machine_words
from doctools.markdown import table
from lptrain.cluster.plan import format_rate, parse_rate
from lptrain.comm.algorithms import WITH_VARIANTS
from lptrain.comm.program import pipeline_block_bytes
from lptrain.sim.predict import predict
from lptrain.sim.topology import oneport

DDP_LABELS = {
    "native": "DDP native (gloo allreduce)",
    "hook:auto": 'DDP + lptrain.ddp.state(algo="auto")',
    "hook:ring": 'DDP + lptrain.ddp.state(algo="ring")',
    "trainer:auto": "lptrain trainer, comm=auto",
}


def n_over_b(row: dict) -> float:
    return row["time_us"] / 1e6 / (row["size"] / row["link_nominal"])


def size_label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def be_model(op: str, p: int) -> float:
    """BE's one-port step model in n/B: its own program (``lptrain-sim predict --topology
    oneport``, no latency), which BE is held to. At a power of two that is 2(P-1)/P, the
    ring's; at any other P the extra ranks first hand their whole message to a neighbour
    (reduce, allreduce) and get the result back after (broadcast, allreduce), steps that
    2(P-1)/P leaves out: 2.50 n/B for a reduce at P = 5 to 7."""
    return one_port_multiple("be", op, p)


@functools.cache
def one_port_multiple(algo: str, op: str, p: int) -> float:
    """``algo``'s ``op`` over P one-port nodes in n/B: its own program priced with no latency
    and no cost per message (``lptrain-sim predict --topology oneport``)."""
    nbytes = 1 << 24
    topology = oneport(p, bandwidth=1.0, latency=0.0, overhead=0.0, gamma=0.0)
    return predict(algo, op, topology, nbytes).seconds / nbytes


def one_port_model(op: str, p: int) -> str:
    """The one-port model's multiples of n/B for the algorithms that bound each op (BE's:
    ``be_model``)."""
    be, ring = be_model(op, p), 2 * (p - 1) / p
    if op == "allreduce":
        both = f"ring/BE {ring:.2f}" if math.isclose(be, ring, rel_tol=1e-3) else f"ring {ring:.2f}, BE {be:.2f}"
        return f"{both}, LP ~2"
    return f"LP 1, BE {be:.2f}, MST {math.ceil(math.log2(p))}"


def host_cores(data: dict) -> int | None:
    """The cores of the host that ran every node (older records name them in a sentence,
    "x86_64, 2 cores, ..."); None where the record does not say."""
    machine = data["conditions"].get("machine")
    if isinstance(machine, dict):
        return machine.get("cores")
    found = re.search(r"(\d+) cores", machine or "")
    return int(found.group(1)) if found else None


def rows_of(data: dict, layout=STAR) -> list[dict]:
    """The benchmark's rows of one layout (every layout with None), each with the nominal
    rate of a port in bytes/s, the host's cores and the shaper it was measured under
    (``egress``, ``row_egress``)."""
    nominal = data["conditions"]["link_bytes_per_s"]
    parts, cores = parts_measured(data), host_cores(data)
    rows = [dict(r, link_nominal=nominal, cores=cores, egress=row_egress(parts, r)) for r in data.get("bench", [])]
    return rows if layout is None else [r for r in rows if layout_of(r) == layout]


def _column(algo: str, lp: str = "lp") -> str:
    """An algorithm's column heading: the backend's collective is "gloo's own"."""
    return {"gloo": "gloo's own", "lp": lp, "auto": "comm=auto"}.get(algo, algo)


def _cells(cell: dict[str, float], algos: tuple[str, ...] = TABLE_ALGOS) -> list[str]:
    return [f"{cell[a]:.2f}" if a in cell else "-" for a in algos]


def chose(row: dict) -> str:
    """What comm=auto ran, in a table cell: ``lp block=65536 order=natural`` as ``lp 64K``."""
    algo, values = model.parse_chose(row.get("chose") or "?")
    block = values.get("block")
    text = algo + (f" {int(block) >> 10}K" if block and block.isdigit() else "")
    order = values.get("order", "natural")
    return text + ("" if order == "natural" else f" order {order}")


def bench_table(data: dict, size: int, nodes: tuple[int, ...]) -> list[str]:
    rows = rows_of(data)
    body = []
    for op in OPS:
        for p in nodes:
            cell = {r["algo"]: n_over_b(r) for r in rows if r["op"] == op and r["nodes"] == p and r["size"] == size}
            if cell:
                body.append([op, str(p), *_cells(cell), one_port_model(op, p)])
    header = ["op", "P", *(_column(a, lp="lp (block auto)") for a in TABLE_ALGOS), "one-port model"]
    return table(header, body)


def time_vs_p_table(data: dict, op: str, size: int) -> list[str]:
    rows = [r for r in rows_of(data) if r["op"] == op and r["size"] == size]
    body = []
    for p in sorted({r["nodes"] for r in rows}):
        at_p = [r for r in rows if r["nodes"] == p]
        cell = {r["algo"]: n_over_b(r) for r in at_p}
        auto = next((chose(r) for r in at_p if r["algo"] == "auto"), "-")
        vs = f"{cell['auto'] / cell['gloo']:.2f}" if "auto" in cell and "gloo" in cell else "-"
        body.append([str(p), *_cells(cell), auto, vs])
    return table(["P", *map(_column, TABLE_ALGOS), "auto ran", "auto / gloo"], body)


def rate_pairs(data: dict) -> list[tuple[dict, float, float]]:
    """Each star row measured at both rates (``data["rates"]``, the experiment's rate and half
    of it, one after the other in one run): the row at the second rate and its n/B at each.
    A record from before both rates were measured together holds only the second rate's rows:
    their first is the star's own row."""
    rates = data.get("rates") or []
    link = data["conditions"]["link"]
    first_rows = [r for r in rates if r["link"] == link] or list(rows_of(data))

    def key(r: dict) -> tuple:
        return r["nodes"], r["size"], r["op"], r["algo"]

    def multiple(r: dict) -> float:  # n/B at the row's own nominal rate (a star row's is the experiment's)
        nominal = parse_rate(r["link"]) / 8 if "link" in r else data["conditions"]["link_bytes_per_s"]
        return r["time_us"] / 1e6 / (r["size"] / nominal)

    first = {key(r): multiple(r) for r in first_rows}
    return [(r, first[key(r)], multiple(r)) for r in rates if r["link"] != link and key(r) in first]


def rates_table(data: dict) -> list[str]:
    """The star at ``RATE_NODES`` at both rates: each algorithm's n/B at the first and at the
    second side by side, a row per node count, size and op; where the link sets the times,
    the same multiple of n/B at either rate."""
    pairs = [(r, a, b) for r, a, b in rate_pairs(data) if r["algo"] != "auto"]
    if not pairs:
        return []
    cells: dict[tuple, dict[str, str]] = {}
    for r, a, b in pairs:
        cells.setdefault((r["nodes"], r["size"], r["op"]), {})[r["algo"]] = f"{a:.2f} / {b:.2f}"
    algos = [a for a in TABLE_ALGOS if a != "auto"]
    order = sorted(cells, key=lambda k: (k[0], k[1], OPS.index(k[2])))
    body = [[str(p), size_label(size), op, *(cells[p, size, op].get(a, "-") for a in algos)] for p, size, op in order]
    return table(["P", "size", "op", *map(_column, algos)], body)


def pipeline_rows(data: dict) -> list[tuple[dict, float]]:
    """LP's rows of the pipeline part (the star again at a quarter of the rate), each with its
    n/B at its own nominal rate."""
    return [(r, r["time_us"] / 1e6 / (r["size"] / (parse_rate(r["link"]) / 8))) for r in data.get("pipeline") or []]


def pipeline_table(data: dict) -> list[str]:
    """LP's broadcast and reduce at every P: n/B at the experiment's rate (the star's lp
    column) and at a quarter of it side by side, a column per op and size."""
    quarter = {(r["nodes"], r["size"], r["op"]): m for r, m in pipeline_rows(data)}
    if not quarter:
        return []
    star = {(r["nodes"], r["size"], r["op"]): n_over_b(r) for r in rows_of(data) if r["algo"] == "lp"}
    columns = [(op, size) for op in PIPELINE_OPS for size in sorted({k[1] for k in quarter})]

    def cell(key: tuple) -> str:
        if key not in quarter:
            return "-"
        first = f"{star[key]:.2f}" if key in star else "-"
        return f"{first} / {quarter[key]:.2f}"

    body = [[str(p), *(cell((p, size, op)) for op, size in columns)] for p in sorted({k[0] for k in quarter})]
    return table(["P", *(f"{op}, {size_label(size)}" for op, size in columns)], body)


@dataclass(frozen=True)
class ChainCost:
    """What a block of LP's chain costs above n/B at one P, split in two (``chain_costs``)."""

    link_share: float  # the part that grows with a block's time on the link, as a share of that time
    host_s: float  # the part fixed in seconds: the host's
    block: int  # the block, in bytes, at the experiment's rate

    def n_over_b(self, bytes_per_s: float) -> float:
        """n/B of LP's chain at a port rate of ``bytes_per_s`` by these figures: n/B, and for
        each of the n/b blocks the link's share of its time and the host's seconds."""
        return 1 + self.link_share + self.host_s * bytes_per_s / self.block

    def rate_within(self, limit: float = 1.10) -> float | None:
        """The largest port rate (bytes/s) at which LP's chain is within ``limit`` n/B by these
        figures (None: the host's part is nothing, so the rate does not matter)."""
        return (limit - 1 - self.link_share) * self.block / self.host_s if self.host_s > 0 else None


def chain_costs(data: dict) -> dict[int, ChainCost]:
    """LP's broadcast and reduce at each P >= 3 (a chain with a hop between its ends), split
    into what grows with a block's time on the link and what is fixed in seconds, from the
    star's rows at the experiment's rate and the pipeline part's at a quarter of it.

    Each row's time above n/B, over its n/b blocks, is one block's excess e = s b/B + h: s
    the link's share (the chain's fill, mostly drained by the token buckets), h the host's
    seconds per block (a process on its way to a core before it forwards the block). The
    same row at two rates gives two such equations, solved for s and h; each P takes the
    median over its ops and sizes. If the chain's excess were the link's, h would be near 0
    at every P; where h b/B is above a tenth at the experiment's rate, the host alone keeps
    LP above 1.10 n/B there."""
    quarter = {(r["nodes"], r["size"], r["op"]): r for r, _ in pipeline_rows(data)}
    first = parse_rate(data["conditions"]["link"]) / 8
    solved: dict[int, list[tuple[float, float, int]]] = {}
    for r in rows_of(data):
        key = (r["nodes"], r["size"], r["op"])
        if r["algo"] != "lp" or key not in quarter or r["nodes"] < 3:
            continue
        q, n = quarter[key], r["size"]
        low = parse_rate(q["link"]) / 8
        e1 = (r["time_us"] / 1e6 - n / first) * r["block"] / n
        e2 = (q["time_us"] / 1e6 - n / low) * q["block"] / n
        share = (e2 - e1) / (q["block"] / low - r["block"] / first)
        solved.setdefault(r["nodes"], []).append((share, e1 - share * r["block"] / first, r["block"]))
    return {
        p: ChainCost(statistics.median(s for s, _, _ in v), statistics.median(h for _, h, _ in v), v[0][2])
        for p, v in sorted(solved.items())
    }


def chain_cost_words(data: dict, limit: float = 1.10) -> str:
    """What ``chain_costs`` finds, in a few sentences for both documents ('' where the
    pipeline part was not measured)."""
    costs = chain_costs(data)
    if not costs:
        return ""
    first = data["conditions"]["link"]
    rate = parse_rate(first) / 8
    shares = [c.link_share for c in costs.values()]
    top = max(costs, key=lambda p: costs[p].host_s)
    last = max(costs)
    small = [p for p in costs if costs[p].host_s * rate / costs[p].block < 0.02]
    held = [p for p in costs if costs[p].n_over_b(rate) > limit]
    block = costs[last].block
    words = (
        f"Split per block of the chain (the same row at the two rates gives two equations: the median of each P's "
        f"ops and sizes), LP's time above n/B is a share of a block's time on the link, at most {max(shares):.1%} at "
        f"every P from {min(costs)} (the chain's fill, mostly drained by the token buckets), "
        "and seconds that do not follow the rate, the host's: "
    )
    host = f"{costs[last].host_s * 1e3:.2f} ms at P = {last}"
    if top != last:
        host += f", {costs[top].host_s * 1e3:.2f} at P = {top}"
    if len(small) == len(costs):
        host = "under 2% of a block's time at every P"
    elif small:
        host = f"under 2% of a block's time at P = {node_list(small)}, " + host
    words += f"{host}. At {first} a {size_label(block)} block takes {block / rate * 1e3:.1f} ms on the link"
    if not held:
        return words + f", and the two keep LP within {limit:.2f} n/B at every P."
    within = min(c.rate_within(limit) for c in costs.values() if c.host_s > 0)
    return words + (
        f": with the host's part, these figures put LP above {limit:.2f} n/B there at P = {node_list(held)} "
        f"({costs[top].n_over_b(rate):.2f} at P = {top}), the link's share alone at most {1 + max(shares):.2f}. On "
        f"this host, with these blocks, LP's chain is within {limit:.2f} at every P up to about "
        f"{format_rate(int(within * 8 / 1e6) * 10**6)} a port by these medians{_lp_run_spread(data)}."
    )


def _lp_run_spread(data: dict) -> str:
    """LP's broadcast or reduce row that two runs at the experiment's rate read farthest apart
    (the star's own and the rates part's), in words ('' where no row was run twice)."""
    link = data["conditions"]["link"]
    again = {(r["nodes"], r["size"], r["op"]): r for r in data.get("rates") or []
             if r["link"] == link and r["algo"] == "lp" and r["op"] in PIPELINE_OPS}  # fmt: skip
    rate = parse_rate(link) / 8
    pairs = [(r, n_over_b(r), again[k]["time_us"] / 1e6 / (r["size"] / rate)) for r in rows_of(data)
             if r["algo"] == "lp" and (k := (r["nodes"], r["size"], r["op"])) in again]  # fmt: skip
    if not pairs:
        return ""
    r, a, b = max(pairs, key=lambda x: abs(x[1] - x[2]))
    return (
        f"; one row's runs vary more than that (LP's {r['op']} at P = {r['nodes']}, {size_label(r['size'])}: "
        f"{a:.2f} n/B in the star's run, {b:.2f} in the rates part's)"
    )


def pipeline_span(data: dict, op: str, limit: float = 1.10) -> tuple[float, float, list[dict]] | None:
    """The smallest and largest n/B of LP's ``op`` in the pipeline part, over every P and
    size, and the rows above ``limit`` (None: not measured)."""
    rows = [(r, m) for r, m in pipeline_rows(data) if r["op"] == op]
    if not rows:
        return None
    times = [m for _, m in rows]
    return min(times), max(times), [r for r, m in rows if m > limit]


def pipeline_held(above: list[dict]) -> str:
    """Words for the rows of an op above 1.10 n/B (``pipeline_span``'s third)."""
    if not above:
        return "within 1.10 at every P and size"
    return "above 1.10 at " + ", ".join(f"P = {r['nodes']} ({size_label(r['size'])})" for r in above)


def pipeline_above_at_rate(data: dict, limit: float = 1.10) -> list[tuple[dict, float, float]]:
    """LP's broadcast and reduce rows of the star above ``limit`` n/B at the experiment's rate
    that the pipeline part measured again: each with its n/B there and at a quarter of the rate."""
    quarter = {(r["nodes"], r["size"], r["op"]): m for r, m in pipeline_rows(data)}
    rows = [r for r in rows_of(data) if r["algo"] == "lp" and r["op"] in PIPELINE_OPS and n_over_b(r) > limit]
    found = [(r, n_over_b(r), quarter[r["nodes"], r["size"], r["op"]]) for r in rows
             if (r["nodes"], r["size"], r["op"]) in quarter]  # fmt: skip
    return sorted(found, key=lambda x: (x[0]["op"], x[0]["size"], x[0]["nodes"]))


def rate_words(link: str) -> str:
    """A rate in tc's notation as the documents write it (100000kbit as 100mbit)."""
    return format_rate(parse_rate(link))


def rates_spread(data: dict) -> tuple[float, float] | None:
    """The lowest and highest ratio of n/B at the second rate over the first (None: not measured)."""
    ratios = [b / a for r, a, b in rate_pairs(data) if r["algo"] != "auto"]
    return (min(ratios), max(ratios)) if ratios else None


def rate_moved(data: dict, tolerance: float = 0.05) -> list[tuple[dict, float, float]]:
    """The rows (comm=auto's aside) whose n/B at the second rate differs from the first's by
    more than ``tolerance`` either way: each with both multiples, the farthest first."""
    moved = [(r, a, b) for r, a, b in rate_pairs(data) if r["algo"] != "auto" and abs(b / a - 1) > tolerance]
    return sorted(moved, key=lambda x: -abs(x[2] / x[1] - 1))


def span(data: dict, algo: str, op: str, size: int) -> tuple[float, float, list[int]]:
    """The smallest and largest n/B of ``algo``'s ``op`` over the star's node counts, and those counts."""
    rows = [r for r in rows_of(data) if r["algo"] == algo and r["op"] == op and r["size"] == size]
    times = [n_over_b(r) for r in rows]
    return min(times), max(times), sorted(r["nodes"] for r in rows)


def against_one_port(data: dict, algo: str, size: int | None = None) -> list[tuple[float, dict]]:
    """``algo``'s rows on the star (at ``size``, every size with None), each with its time over
    its own program's one-port model (``one_port_multiple``: BE's is ``be_model``, the ring's
    2(P-1)/P n/B for each op), the farthest first."""
    rows = [r for r in rows_of(data) if r["algo"] == algo and (size is None or r["size"] == size)]
    ratios = ((n_over_b(r) / one_port_multiple(algo, r["op"], r["nodes"]), r) for r in rows)
    return sorted(ratios, key=lambda x: -x[0])


def auto_against_gloo(data: dict, layout=STAR) -> tuple[float, dict] | None:
    """comm=auto's allreduce time over gloo's own, its largest over the layout's rows, and
    that row; None where no row has both."""
    rows = rows_of(data, layout)
    ratios = []
    for r in rows:
        if r["algo"] == "auto" and r["op"] == "allreduce":
            gloo = next((g for g in rows if g["algo"] == "gloo" and model.same_run(g, r)), None)
            if gloo:
                ratios.append((r["time_us"] / gloo["time_us"], r))
    return max(ratios, key=lambda x: x[0]) if ratios else None


def auto_below_lp_block(data: dict) -> list[dict]:
    """The star's comm=auto rows that ran LP in fixed blocks smaller than LP's own block on
    the link measured (``lptrain.comm.program.pipeline_block_bytes``), which auto no longer
    prices there (``lptrain.auto.simulated``): rows measured before that rule."""
    out = []
    for r in rows_of(data):
        algo, values = model.parse_chose(r.get("chose") or "?") if r["algo"] == "auto" else ("", {})
        block = values.get("block", "")
        own = pipeline_block_bytes(r.get("link_bytes_per_s") or data["conditions"]["link_bytes_per_s"])
        if algo == "lp" and block.isdigit() and own is not None and int(block) < own:
            out.append(r)
    return out


def layouts(data: dict) -> list:
    """The racks layouts the rows hold, in the order measured."""
    seen = []
    for r in data.get("bench", []):
        layout = layout_of(r)
        if layout != STAR and layout not in seen:
            seen.append(layout)
    return seen


def racks_table(data: dict, size: int) -> list[str]:
    """Allreduce on racks: each algorithm's n/B (LP in both constructions, lp-rb where the rows
    hold it), what auto ran, and gloo's own over auto's time."""
    ran = racks_ran(data)
    algos = tuple(a for a in RACK_TABLE_ALGOS if a != "lp-rb" or a in ran)
    body = []
    for layout in layouts(data):
        rows = [r for r in rows_of(data, layout) if r["op"] == "allreduce" and r["size"] == size]
        for p in sorted({r["nodes"] for r in rows}):
            at_p = [r for r in rows if r["nodes"] == p]
            cell = {r["algo"]: n_over_b(r) for r in at_p}
            auto = next((chose(r) for r in at_p if r["algo"] == "auto"), "-")
            faster = f"{cell['gloo'] / cell['auto']:.2f}x" if "auto" in cell and "gloo" in cell else "-"
            body.append([f"{layout.racks} racks, uplink {layout.uplink}", str(p), *_cells(cell, algos), auto, faster])
    return table(["racks", "P", *map(_column, algos), "auto ran", "auto vs gloo's own"], body)


def racks_ran(data: dict) -> set[str]:
    """The algorithms some row of the racks ran (the table's and the figure's columns)."""
    return {r["algo"] for r in data.get("bench", []) if layout_of(r) != STAR}


def racks_speedup(data: dict, racks: int, uplink: str, p: int, size: int) -> float | None:
    """gloo's own allreduce time over comm=auto's on one racks layout (above 1: auto faster)."""
    for layout in layouts(data):
        if (layout.racks, layout.uplink) == (racks, uplink):
            rows = [
                r for r in rows_of(data, layout) if r["op"] == "allreduce" and r["size"] == size and r["nodes"] == p
            ]
            cell = {r["algo"]: r["time_us"] for r in rows}
            if "auto" in cell and "gloo" in cell:
                return cell["gloo"] / cell["auto"]
    return None


def prediction_summary(data: dict) -> tuple[list[str], dict]:
    """The simulator against every row it can price: a table of median and largest error per
    layout, op and algorithm (over P and sizes), and the figures of the fit."""
    fit, rows = model.predictions(rows_of(data, None))
    held = model.held_out(rows, fit)
    body = []
    groups: dict[tuple, list[dict]] = {}
    for r in held:
        groups.setdefault((layout_of(r).describe(), r["op"], r["algo"]), []).append(r)
    order = {a: i for i, a in enumerate((*WITH_VARIANTS, "auto"))}
    for (where, op, algo), group in sorted(groups.items(), key=lambda kv: (kv[0][0] != "star", kv[0][0], kv[0][1],
                                                                             order.get(kv[0][2], 9))):  # fmt: skip
        errors = [abs(r["error"]) for r in group]
        worst = max(group, key=lambda r: abs(r["error"]))
        body.append([where, op, _column(algo), str(len(group)), f"{statistics.median(errors):.0%}",
                     f"{worst['error']:+.0%} (P = {worst['nodes']}, {size_label(worst['size'])})"])  # fmt: skip
    lines = table(["layout", "op", "algo", "rows", "median error", "largest (where)"], body)
    errors = [abs(r["error"]) for r in held]
    by_p = {p: [abs(r["error"]) for r in held if r["nodes"] == p] for p in sorted({r["nodes"] for r in held})}
    fitted = [r for r in rows if model.fitted(r, fit)]
    summary = {"fit": fit, "bandwidth": fit.bandwidth, "overhead": fit.overhead, "median": statistics.median(errors),
               "max": max(errors), "count": len(held), "over_15": [r for r in held if abs(r["error"]) > 0.15],
               "by_p": {p: (statistics.median(e), max(e)) for p, e in by_p.items()},
               "slower": sum(r["error"] < 0 for r in held),
               "worst": max(held, key=lambda r: abs(r["error"])),
               "fitted": fitted, "held": held, "bucket": bucket_evidence(rows, fit),
               # a thunk: some 18 simulations, wanted only where LP's crowded chain is a miss
               "lp_crowding": functools.cache(functools.partial(model.lp_crowding_by_size, rows, fit))}  # fmt: skip
    return lines, summary


def bucket_evidence(rows: list[dict], fit: model.Fit) -> dict | None:
    """LP's pipeline at 4 MiB on the stars of P >= 8, where the fill is a large part of the
    time: the smallest and largest error priced on the ports as shaped (``shaped``) and on
    real links with no bucket (``real``), and the bucket; None where no such row was measured."""
    lp = [r for r in rows if layout_of(r) == STAR and r["algo"] == "lp" and r["size"] == 4 << 20 and r["nodes"] >= 8]
    if not lp:
        return None
    real = [model.simulate(r, fit.bandwidth, fit.overhead, rows, fit.crowding, bucket=False) / (r["time_us"] / 1e6) - 1
            for r in lp]  # fmt: skip
    shaped = [r["error"] for r in lp]
    return {"count": len(lp), "real": (min(real), max(real)), "shaped": (min(shaped), max(shaped)),
            "bucket": model.bucket_bytes(lp[0]), "nodes": sorted({r["nodes"] for r in lp})}  # fmt: skip


def misses_table(summary: dict) -> list[str]:
    """Every predicted row more than 15% off, measured beside predicted."""
    body = [
        [layout_of(r).describe(), size_label(r["size"]), r["op"], str(r["nodes"]), r["algo"],
         f"{n_over_b(r):.2f}", f"{r['predicted_s'] / (r['size'] / r['link_nominal']):.2f}", f"{r['error']:+.0%}"]
        for r in sorted(summary["over_15"], key=lambda r: (layout_of(r).describe(), r["op"], r["algo"], r["nodes"]))
    ]  # fmt: skip
    return table(["layout", "size", "op", "P", "algo", "measured n/B", "predicted n/B", "error"], body)


def ddp_table(data: dict) -> list[str]:
    """Real training on the cluster: each variant's best wall clock over its steps and its
    speed against DDP native's (above 1: faster)."""
    body = []
    warmups = {run.get("warmup_steps") for run in data["ddp"]}
    for run in data["ddp"]:
        best = {v: min(t) for v, t in run["rounds"].items() if t}
        warm = run.get("warmup") or {}
        where = f"P = {run['nodes']}, {layout_of(run).describe()}" + (f", {run['link']}" if run.get("link") else "")
        native = best.get("native")
        for v in DDP_VARIANTS:
            if v in best:
                ratio = f"{native / best[v]:.2f}x" if native else "-"
                row = [where, DDP_LABELS[v], f"{best[v]:.2f}", f"{1e3 * best[v] / run['steps']:.0f}", ratio]
                if warmups != {None}:
                    row.append(f"{min(warm[v]):.2f}" if warm.get(v) else "-")
                body.append(row)
    header = ["cluster", "training", "steps (s)", "ms per step", "speed vs DDP native"]
    if warmups != {None}:
        header.append(f"first {'/'.join(str(w) for w in sorted(w for w in warmups if w))} steps (s)")
    return table(header, body)


def ddp_speedup(data: dict, variant: str, racks: int) -> float | None:
    """``variant``'s speed against DDP native on the first run whose layout has ``racks``."""
    for run in data.get("ddp", []):
        if layout_of(run).racks == racks:
            best = {v: min(t) for v, t in run["rounds"].items() if t}
            if variant in best and "native" in best:
                return best["native"] / best[variant]
    return None


def train_table(data: dict) -> list[str]:
    train = data["train"]
    nodes = sorted({t["nodes"] for t in train})
    body = []
    for case in TRAIN_CASES:
        cells = {t["nodes"]: t["comm_ms"] for t in train if t["case"] == case.label}
        body.append([case.label, *(f"{cells[p]:.0f}" if p in cells else "-" for p in nodes)])
    return table(["communication", *(f"P={p}" for p in nodes)], body)


def auto_table(data: dict) -> list[str]:
    auto = data["auto"]
    sizes = sorted({r["size"] for r in auto["rows"]})
    body = []
    for size in sizes:
        rows = {r["algo"]: r["time_us"] / 1e6 for r in auto["rows"] if r["size"] == size}
        fixed = {a: t for a, t in rows.items() if a != "auto"}
        best = min(fixed, key=fixed.get)
        ratio = rows["auto"] / fixed[best]
        body.append([size_label(size), f"{rows['auto']:.3f}", f"{fixed[best]:.3f}", best, f"{ratio:.2f}"])
    return table(["size", "auto (s)", "best fixed (s)", "best fixed", "auto / best"], body)


def fidelity_phrase(data: dict) -> str | None:
    """The fidelity checks of the benchmark's runs in a few words; None where the rows
    predate the check."""
    checks = [r["fidelity"] for r in data.get("bench", []) if r.get("fidelity")]
    if not checks:
        return None
    worst = [c["worst_ratio"] for c in checks]
    softirq = [c["softirq"] for c in checks]
    return (
        f"before each run lptrain-cluster's fidelity check (every port sending and receiving at once) had the "
        f"slowest port at {min(worst):.1%} to {max(worst):.1%} of its rate, softirq {min(softirq):.0%} to "
        f"{max(softirq):.0%} of the CPU"
    )


def describe(data: dict) -> str:
    c = data["conditions"]
    loads = [r["load"] for r in data.get("bench", []) if "load" in r]
    load = f"load average {min(loads):.1f} to {max(loads):.1f} at the starts of the runs" if loads else ""
    if c.get("nice"):
        load += f" (the runs at {nice_phrase(data)}; ahead of the machine's other work)"
    check = fidelity_phrase(data)
    return (f"{c['link']} per port (B = {c['link_bytes_per_s'] / 1e6:.1f} MB/s one way); {provenance(data)}; "
            f"{load or 'load average ' + format(c['load_before'], '.1f')}"
            + (f"; {check}" if check else ""))  # fmt: skip


PART_NAMES = {
    "bench": "the star",
    "racks": "the racks",
    "rates": "the star at P = 8 and 16 at two rates",
    "pipeline": "LP's broadcast and reduce at a quarter of the rate",
    "auto": "auto's tuning",
    "ddp": "the training runs",
    "train": "the paper's iteration",
}


def node_list(nodes: list[int]) -> str:
    """Node counts in words, runs of consecutive ones as ranges: 2 to 8, 10, 12, 16."""
    runs: list[list[int]] = []
    for p in nodes:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return ", ".join(f"{r[0]} to {r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def nice_phrase(data: dict) -> str:
    """The runs' nice values ("nice -10", or "nice -10, the star's be allreduce at -20"): each
    part's own where its stamp says, else the record's (stamps before parts kept their own)."""
    c = data["conditions"]
    if not c.get("nice"):
        return ""
    apart = [
        f", {PART_NAMES[part]}" + (f"'s {stamp['rows']}" if stamp.get("rows") else "") + f" at {stamp['nice']}"
        for part, stamps in parts_measured(data).items()
        for stamp in stamps
        if stamp.get("nice") is not None and stamp["nice"] != c["nice"]
    ]
    return f"nice {c['nice']}" + "".join(apart)


def provenance(data: dict) -> str:
    """Which part was measured when, on which machine and under which shaper, grouped by
    machine and shaper (the parts of one record can be measured on different days and
    machines: ``--only``; a stamp without ``egress`` predates ``--egress``: ``shared``)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for part, stamps in sorted(parts_measured(data).items(), key=lambda kv: list(PART_NAMES).index(kv[0])):
        for stamp in stamps:
            words = machine_words(stamp["machine"]) if stamp.get("machine") else "machine not recorded"
            nodes = f" (P = {node_list(stamp['nodes'])})" if stamp.get("nodes") else ""
            rows = f"'s {stamp['rows']}" if stamp.get("rows") else ""
            key = (words, egress_of(stamp))
            groups.setdefault(key, []).append(f"{PART_NAMES[part]}{rows}{nodes} {stamp['date']}")
    return "; ".join(f"{', '.join(items)} on {words}, `--egress {egress}`" for (words, egress), items in groups.items())


def row_egress(parts: dict[str, list[dict]], row: dict) -> str:
    """The shaper ``row`` was measured under: that of the newest stamp of its part (the racks
    or the star) in ``parts`` (``parts_measured``) that covers its node count and, where the
    stamp names rows, its algorithm and op."""
    part = "bench" if layout_of(row) == STAR else "racks"
    covering = [
        stamp
        for stamp in parts.get(part, [])
        if (stamp.get("nodes") is None or row["nodes"] in stamp["nodes"])
        and (not stamp.get("rows") or {row["algo"], row["op"]} <= set(stamp["rows"].split()))
    ]
    return egress_of(covering[-1]) if covering else "shared"


def egress_of(stamp: dict) -> str:
    """How the run's ports queued what they sent: every run before 2026-12-07 had one shaper,
    ``shared``, and its stamp does not say."""
    return stamp.get("egress", "shared")
