"""The simulator held against the emulated cluster: every measured row of
``cluster_experiment`` priced by ``lptrain.sim.dataflow`` on the same layout (star or
racks) and on the emulated ports as shaped (token buckets), so that every row but those
fitted is a prediction. Three figures are fitted, each on a stated subset of rows:

* a port's rate B and the cost of a message with a core per process, on the two-node
  star rows (``calibrate``);
* the cost a message adds for each further process per core (``crowding``), on the star
  rows of the largest P (``fit_crowding``). Every node of the emulated cluster runs on one
  host, so with P processes on C cores a message's CPU work (posting it, issuing it, the
  network stack's share of its packets) waits for a core that P / C processes share; on
  two nodes nothing waits. The rows of every other P, and every racks row, test the law.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from doctools.cluster_experiment import SCHEDULE_ALGOS, STAR, layout_of
from lptrain.comm.algorithms import WITH_VARIANTS
from lptrain.sim.topology import Topology

FRACTIONS = [0.90 + 0.005 * i for i in range(21)]  # of the nominal rate: TCP's payload, the shaper's bucket
OVERHEADS = [0.0, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3]  # seconds per message
# What the sender's kernel still holds of a connection when gloo reports a send done (its
# bytes written to the socket). Measured on the emulated cluster (2026-12-07, 2-core host,
# `lptrain-cluster --nodes 2 [--layout racks --racks 2 --uplink 50mbit|100mbit] --egress
# per-peer|shared -- python3 scripts/measure_send_buffer.py --rate RATE`): the medians of
# three sends of 4 and 16 MiB held 1.6 to 2.6 MiB, 2.1 the median of the twelve, across a
# 50mbit and a 100mbit uplink and a 200mbit port under either shaper; a 1 MiB send was
# reported done in 0 to 3 ms, all of it held.
SEND_BUFFER_BYTES = 2 << 20
CROWDINGS = [0.0, 2.5e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4]  # seconds per message per process per core


@dataclass(frozen=True)
class Fit:
    """The fitted figures and the rows they were fitted on."""

    bandwidth: float  # a port's rate, bytes/s: the two-node star rows
    overhead: float  # seconds per message, a core per process: the two-node star rows
    crowding: float = 0.0  # seconds a message adds per further process per core: the star rows at crowd_nodes
    crowd_nodes: int | None = None  # None: no rows with more processes than cores (or no cores recorded)


@dataclass(frozen=True)
class Run:
    """What a row ran: the algorithm (a variant such as lp-rb), its block and rank order."""

    algo: str
    block: int | None
    order: tuple[int, ...] | None


def _order(text: str) -> tuple[int, ...] | None:
    return None if text == "natural" else tuple(int(x) for x in text.split("-"))


def parse_chose(text: str) -> tuple[str, dict[str, str]]:
    """comm=auto's summary of what it ran (``lp block=65536 order=0-2-1-3``, as
    ``lptrain.auto.tuning.Choice.summary`` writes it): the algorithm and its settings."""
    algo, *settings = text.split()
    return algo, dict(s.split("=", 1) for s in settings)


def run_of(row: dict, rows: list[dict]) -> Run | None:
    """A fixed algorithm's row runs itself; comm=auto's row runs what its ``chose`` names
    (``lp block=65536 order=0-2-1-3``), its block taken from the LP row of the same run
    where auto left it to LP (``block=auto``). None for the backend's own collective."""
    if row["algo"] in WITH_VARIANTS:  # lp-rb too: LP's allreduce as reduce, then broadcast
        return Run(row["algo"], row.get("block"), None)
    if row["algo"] != "auto" or not row.get("chose"):
        return None
    algo, values = parse_chose(row["chose"])
    if algo not in WITH_VARIANTS:
        return None
    block = values.get("block")
    if block == "auto":
        same = [r for r in rows if r["algo"] == "lp" and same_run(r, row)]
        block = same[0]["block"] if same else None
    return Run(algo, int(block) if block else None, _order(values.get("order", "natural")))


def same_run(a: dict, b: dict) -> bool:
    keys = ("nodes", "size", "op")
    return all(a[k] == b[k] for k in keys) and layout_of(a) == layout_of(b)


def _segment(row: dict, rows: list[dict]) -> int:
    """The row's bytes per message (auto's row takes the one its fixed algorithm's row ran with)."""
    if row.get("segment"):
        return row["segment"]
    same = [r["segment"] for r in rows if same_run(r, row) and r.get("segment")]
    return same[0] if same else row["size"]


def message_cost(row: dict, overhead: float, crowding: float) -> float:
    """Seconds of a rank's time per message in ``row``'s run: ``overhead`` with a core per
    process, and ``crowding`` more for each further process per core of the host that ran
    every node (``row["cores"]``; none added where the row does not say)."""
    cores = row.get("cores")
    return overhead + (crowding * max(0.0, row["nodes"] / cores - 1) if cores else 0.0)


def simulate(
    row: dict,
    bandwidth: float,
    overhead: float,
    rows: list[dict] | None = None,
    crowding: float = 0.0,
    bucket: bool = True,
) -> float | None:
    """The simulator's seconds for ``row`` on its layout, the port at ``bandwidth`` bytes/s
    and ``overhead`` s per message with a core per process (``crowding`` more per further
    process per core: ``message_cost``), on ports shaped as the row's were (``bucket=False``:
    on real links, with no bucket); None where the row's run is not a schedule."""
    from lptrain.comm.algorithms import issue_order
    from lptrain.sim.dataflow import simulate_dataflow
    from lptrain.sim.predict import schedule_for

    rows = rows if rows is not None else [row]
    run = run_of(row, rows)
    if run is None:
        return None
    schedule = schedule_for(run.algo, row["op"], row["nodes"], row["count"], 4, block_bytes=run.block, order=run.order)
    segment = _segment(row, rows)
    topology = topology_of(row, bandwidth, message_cost(row, overhead, crowding), bucket)
    return simulate_dataflow(schedule, topology, max(1, segment // 4), order=issue_order(run.algo, row["op"]))


def bucket_bytes(row: dict) -> int:
    """The token bucket lptrain-cluster shaped the row's ports and uplinks with
    (``lptrain.cluster.plan.Shaping``'s burst at the nominal rate: 128 KiB at 200mbit)."""
    from lptrain.cluster.plan import Shaping

    return Shaping("node", "eth0", round(row["link_nominal"] * 8)).burst_bytes


def topology_of(row: dict, bandwidth: float, overhead: float, bucket: bool = True) -> Topology:
    """The row's emulated cluster as the simulator's topology: its layout (star or racks),
    the port at ``bandwidth``, ``overhead`` s per message, and every node's port the token
    bucket it was shaped with (``bucket_bytes``), which lets an idle port pass that much at
    once (``bucket=False``: real links, no bucket), and every connection's sender the kernel's
    buffer (``SEND_BUFFER_BYTES``: a send is done for what waits for it once no more than
    that of its connection is still on the way). The racks' uplinks are shaped the same
    way but priced with no bucket: priced with theirs, the racks' rows move further off (in
    the grid of 2026-12-06 the largest miss of LP, auto and BE on racks each grew by 2 to 8
    points)."""
    from lptrain.sim.topology import oneport, racks

    p, layout = row["nodes"], layout_of(row)
    burst = bucket_bytes(row) if bucket else 0.0
    if layout == STAR:
        topology = oneport(p, bandwidth=bandwidth, latency=0.0, overhead=overhead, gamma=0.0, burst_bytes=burst)
    else:
        topology = racks(p, layout.racks, bandwidth, bandwidth * layout.uplink_fraction, 0.0, overhead, 0.0,
                         layout.placement, burst_bytes=burst)  # fmt: skip
    return dataclasses.replace(topology, send_buffer=SEND_BUFFER_BYTES)


def _fit_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["nodes"] == 2 and layout_of(r) == STAR and r["algo"] in SCHEDULE_ALGOS]


def calibrate(rows: list[dict]) -> tuple[float, float]:
    """Fit the port's rate B and the cost per message from the two-node star rows alone
    (a grid search for the smallest median error), so that every row with more nodes, and
    every racks row, is a prediction, not a fit."""
    fit_rows = _fit_rows(rows)
    nominal = fit_rows[0]["link_nominal"]
    best = (math.inf, nominal, 0.0)
    for fraction in FRACTIONS:
        for overhead in OVERHEADS:
            errors = [abs(simulate(r, nominal * fraction, overhead) / (r["time_us"] / 1e6) - 1) for r in fit_rows]
            best = min(best, (statistics.median(errors), nominal * fraction, overhead))
    return best[1], best[2]


def _crowd_rows(rows: list[dict]) -> list[dict]:
    """The star's rows at its largest P, where that puts more processes than cores on the host."""
    crowded = [r for r in rows if layout_of(r) == STAR and r.get("cores") and r["nodes"] > r["cores"]]
    top = max((r["nodes"] for r in crowded), default=None)
    return [r for r in crowded if r["nodes"] == top and run_of(r, rows) is not None]


def best_crowding(fit_rows: list[dict], rows: list[dict], bandwidth: float, overhead: float) -> float:
    """The figure of ``CROWDINGS`` that prices ``fit_rows`` with the smallest median error
    (``rows``: every row, where an auto row finds what it ran)."""
    best = (math.inf, 0.0)
    for crowding in CROWDINGS:
        errors = [abs(simulate(r, bandwidth, overhead, rows, crowding) / (r["time_us"] / 1e6) - 1) for r in fit_rows]
        best = min(best, (statistics.median(errors), crowding))
    return best[1]


def fit_crowding(rows: list[dict], bandwidth: float, overhead: float) -> tuple[float, int | None]:
    """The seconds a message adds per further process per core, fitted (a grid search for
    the smallest median error) on the star rows of the largest P alone, with B and the
    two-node cost per message already fitted; and that P (None where no row has more
    processes than cores: nothing to fit)."""
    fit_rows = _crowd_rows(rows)
    if not fit_rows:
        return 0.0, None
    return best_crowding(fit_rows, rows, bandwidth, overhead), fit_rows[0]["nodes"]


def lp_crowding_by_size(rows: list[dict], fit: Fit) -> dict[int, float]:
    """The crowding fitted on LP's own rows among those ``fit``'s figure was fitted on, one
    message size at a time: where the sizes want different figures, a cost per message
    alone cannot price LP's chain (its steady flow weighs most at the larger size, its fill
    of small blocks at the smaller). Empty where no crowding was fitted."""
    if fit.crowd_nodes is None:
        return {}
    lp = [r for r in _crowd_rows(rows) if r["algo"] == "lp" and r["nodes"] == fit.crowd_nodes]
    sizes = sorted({r["size"] for r in lp})
    return {
        size: best_crowding([r for r in lp if r["size"] == size], rows, fit.bandwidth, fit.overhead) for size in sizes
    }


def predictions(rows: list[dict]) -> tuple[Fit, list[dict]]:
    """The fitted figures, and every row the simulator can price with its prediction and
    error (predicted / measured - 1)."""
    bandwidth, overhead = calibrate(rows)
    fit = Fit(bandwidth, overhead, *fit_crowding(rows, bandwidth, overhead))
    out = []
    for r in rows:
        predicted = simulate(r, bandwidth, overhead, rows, fit.crowding)
        if predicted is not None:
            out.append({**r, "predicted_s": predicted, "error": predicted / (r["time_us"] / 1e6) - 1})
    return fit, out


def fitted(row: dict, fit: Fit) -> bool:
    """Whether ``row`` is one the figures were fitted on: the two-node star, and the star at
    the P that fitted the crowding."""
    return layout_of(row) == STAR and row["nodes"] in (2, fit.crowd_nodes)


def held_out(rows: list[dict], fit: Fit) -> list[dict]:
    """The predicted rows: all but those the figures were fitted on (``fitted``)."""
    return [r for r in rows if not fitted(r, fit)]
