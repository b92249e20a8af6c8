"""The cluster experiment's analysis (scripts/doctools/cluster_experiment.py): calibration
recovers a known machine, the tables read the rows they are given. (The document's
sections: tests/test_benchmarks_doc.py.)"""

import pytest

from doctools import cluster_experiment as ex


def _rows(bandwidth: float, overhead: float) -> list[dict]:
    """Rows as the benchmark writes them, timed by the simulator on a known machine."""
    rows = []
    for p in (2, 4):
        for op in ex.OPS:
            for algo in ex.SCHEDULE_ALGOS:
                row = {"op": op, "algo": algo, "nodes": p, "size": 1 << 20, "count": 1 << 18, "segment": 64 << 10,
                       "block": 64 << 10 if algo == "lp" else None, "link_nominal": 25e6}  # fmt: skip
                row["time_us"] = ex._simulate(row, bandwidth, overhead) * 1e6
                rows.append(row)
    return rows


def test_calibration_recovers_the_machine_that_made_the_rows():
    rows = _rows(0.9 * 25e6, 5e-4)
    bandwidth, overhead = ex.calibrate(rows)
    assert bandwidth == pytest.approx(0.9 * 25e6) and overhead == pytest.approx(5e-4)
    _, _, predicted = ex.predictions(rows)
    assert max(abs(r["error"]) for r in predicted) < 1e-6


def test_the_tables_show_multiples_of_n_over_b_per_algorithm():
    rows = [dict(r, link_nominal=None) for r in _rows(25e6, 0.0)]
    rows.append({"op": "broadcast", "algo": "gloo", "nodes": 4, "size": 1 << 20, "time_us": 2 * (1 << 20) / 25e6 * 1e6})
    data = {"conditions": {"link": "200mbit", "link_bytes_per_s": 25e6}, "bench": rows}
    table = ex.bench_table(data, 1 << 20, (2, 4))
    line = next(line for line in table if line.startswith("| broadcast | 4 |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[6] == "2.00" and float(cells[2]) < float(cells[3]), line  # gloo's own; lp below mst
    vs_p = ex.time_vs_p_table(data, "broadcast", 1 << 20)
    assert [line.split("|")[1].strip() for line in vs_p[2:]] == ["2", "4"]
