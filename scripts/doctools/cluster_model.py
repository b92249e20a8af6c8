"""The simulator held against the emulated cluster: every measured row of
``cluster_experiment`` priced by ``lptrain.sim.dataflow`` on the same layout (star or
racks), the machine's two figures (a port's rate, the cost per message) fitted on the
two-node star rows alone, so that every other row is a prediction, not a fit.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from doctools.cluster_experiment import SCHEDULE_ALGOS, STAR, layout_of
from lptrain.comm.algorithms import WITH_VARIANTS
from lptrain.sim.topology import Topology

FRACTIONS = [0.90 + 0.005 * i for i in range(21)]  # of the nominal rate: TCP's payload, the shaper's bucket
OVERHEADS = [0.0, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3]  # seconds per message


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
    if row["algo"] in SCHEDULE_ALGOS:
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


def simulate(row: dict, bandwidth: float, overhead: float, rows: list[dict] | None = None) -> float | None:
    """The simulator's seconds for ``row`` on its layout, the port at ``bandwidth`` bytes/s
    and ``overhead`` s per message; None where the row's run is not a schedule."""
    from lptrain.comm.algorithms import issue_order
    from lptrain.sim.dataflow import simulate_dataflow
    from lptrain.sim.predict import schedule_for

    rows = rows if rows is not None else [row]
    run = run_of(row, rows)
    if run is None:
        return None
    schedule = schedule_for(run.algo, row["op"], row["nodes"], row["count"], 4, block_bytes=run.block, order=run.order)
    segment = _segment(row, rows)
    topology = topology_of(row, bandwidth, overhead)
    return simulate_dataflow(schedule, topology, max(1, segment // 4), order=issue_order(run.algo, row["op"]))


def topology_of(row: dict, bandwidth: float, overhead: float) -> Topology:
    """The row's emulated cluster as the simulator's topology: its layout (star or racks),
    the port at ``bandwidth``, ``overhead`` s per message, and every port and uplink the
    token bucket lptrain-cluster shaped it with (``lptrain.cluster.plan.Shaping``'s burst at
    the nominal rate: 128 KiB at 200mbit), which lets an idle port pass that much at once."""
    from lptrain.cluster.plan import Shaping
    from lptrain.sim.topology import oneport, racks

    p, layout = row["nodes"], layout_of(row)
    burst = Shaping("node", "eth0", round(row["link_nominal"] * 8)).burst_bytes
    if layout == STAR:
        return oneport(p, bandwidth=bandwidth, latency=0.0, overhead=overhead, gamma=0.0, burst_bytes=burst)
    return racks(p, layout.racks, bandwidth, bandwidth * layout.uplink_fraction, 0.0, overhead, 0.0, layout.placement,
                 burst_bytes=burst)  # fmt: skip


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


def predictions(rows: list[dict]) -> tuple[float, float, list[dict]]:
    """The fitted figures, and every row the simulator can price with its prediction and
    error (predicted / measured - 1)."""
    bandwidth, overhead = calibrate(rows)
    out = []
    for r in rows:
        predicted = simulate(r, bandwidth, overhead, rows)
        if predicted is not None:
            out.append({**r, "predicted_s": predicted, "error": predicted / (r["time_us"] / 1e6) - 1})
    return bandwidth, overhead, out


def held_out(rows: list[dict]) -> list[dict]:
    """The predicted rows: all but the two-node star rows the figures were fitted on."""
    return [r for r in rows if not (r["nodes"] == 2 and layout_of(r) == STAR)]
