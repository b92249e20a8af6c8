"""comm=auto with the probe across processes, on an emulated 4-node cluster (namespaces).

On racks joined by 100 Mbit/s uplinks under 200 Mbit/s ports, the probe finds the racks
(lptrain-cluster places ranks 0-1 and 2-3 together, so the probe's groups are checked
against them, whatever order auto then picks) and the uplink at about half a port, and auto
runs LP in a rack-contiguous order; with the nodes interleaved (node i in rack i % 2) the
probe finds racks [0 2] and [1 3], which the natural order crosses at every hop, and auto
reorders the chain so that each rack is contiguous; on a star it finds one switch and runs
the ring. Each cluster run takes about 30 s on two cores (4 nodes, a 4 MiB allreduce at
200 Mbit/s and the probe), so these are marked slow; they skip with lptrain-cluster
--check's reason where namespaces cannot be made.
"""

from __future__ import annotations

import json
import re

import pytest
from test_cluster import Watched, needs_namespaces
from test_topology_auto import rack_contiguous

BENCH = ["lptrain-bench", "--op", "allreduce", "--algo", "auto", "--topology", "probe", "-b", "4M", "-e", "4M",
         "-n", "1", "--trials", "1"]  # fmt: skip


def run_auto(tmp_path, layout: list[str]) -> tuple[str, dict]:
    rows_file = tmp_path / "rows.json"
    run = Watched(["--nodes", "4", *layout, "--logs", str(tmp_path / "logs"), "--", *BENCH,
                   "--json", str(rows_file)], cwd=tmp_path)  # fmt: skip
    code, out, err = run.finish()
    assert code == 0, err[-3000:]
    (row,) = json.loads(rows_file.read_text())
    assert row["algo"] == "auto" and row["wrong"] == 0, row
    machine = next(line for line in out.splitlines() if line.startswith("# auto prices on the "))
    return machine, row


@pytest.mark.slow
@needs_namespaces
def test_on_thin_uplink_racks_the_probe_finds_them_and_auto_runs_lp_rack_contiguous(tmp_path):
    machine, row = run_auto(tmp_path, ["--layout", "racks", "--link", "200mbit", "--uplink", "100mbit"])
    assert "measured at start: 2 racks [0 1] [2 3]" in machine, machine  # the probe's groups are the racks
    fraction = float(re.search(r"\(([0-9.]+) of a port\)", machine).group(1))
    assert 0.3 < fraction < 0.7, machine
    chose = row["chose"]
    assert chose.startswith("lp block=") and chose.endswith("order=natural"), chose  # 0-1-2-3: racks contiguous


@pytest.mark.slow
@needs_namespaces
def test_on_interleaved_racks_the_probe_finds_them_and_auto_orders_each_rack_contiguous(tmp_path):
    layout = ["--layout", "racks", "--placement", "interleaved", "--link", "200mbit", "--uplink", "100mbit"]
    machine, row = run_auto(tmp_path, layout)
    assert "measured at start: 2 racks [0 2] [1 3]" in machine, machine
    fraction = float(re.search(r"\(([0-9.]+) of a port\)", machine).group(1))
    assert 0.3 < fraction < 0.7, machine
    algo, *settings = row["chose"].split()
    order_text = dict(s.split("=", 1) for s in settings)["order"]
    assert order_text != "natural", row["chose"]  # 0-1-2-3 would cross the uplink at every hop
    order = [int(r) for r in order_text.split("-")]
    assert sorted(order) == [0, 1, 2, 3] and rack_contiguous(order, ((0, 2), (1, 3))), row["chose"]
    assert algo == "lp", row["chose"]


@pytest.mark.slow
@needs_namespaces
def test_on_a_star_the_probe_finds_one_switch_and_auto_runs_the_ring(tmp_path):
    machine, row = run_auto(tmp_path, ["--link", "200mbit"])
    assert "measured at start: 1 rack [0 1 2 3]" in machine, machine
    assert row["chose"] == "ring order=natural", row
