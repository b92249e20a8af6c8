"""scripts/measure_send_buffer.py: what the transport still holds when it reports a send
done (the simulator's ``Topology.send_buffer``). Its refusals anywhere; one real run on a
two-node emulated cluster, skipped with the reason where namespaces cannot be made."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cluster import needs_namespaces

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(ROOT / "scripts" / "measure_send_buffer.py")]


@pytest.mark.parametrize(
    "args, says",
    [(["--rate", "fast"], "--rate must be a rate such as 200mbit"), (["--rate", "1gbit", "--sizes", "1Q"], "size")],
)
def test_a_bad_rate_or_size_is_one_line_and_exit_code_2(args, says):
    run = subprocess.run([*SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("measure_send_buffer: error: ") and says in line, line


@needs_namespaces
def test_on_two_nodes_it_prints_what_was_held_per_size(tmp_path):
    cluster = [sys.executable, "-m", "lptrain.cluster.cli", "--nodes", "2", "--link", "200mbit", "--fidelity-window",
               "0.3", "--logs", str(tmp_path), "--"]  # fmt: skip
    run = subprocess.run([*cluster, *SCRIPT, "--rate", "200mbit", "--sizes", "1M", "--trials", "2"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr
    said = run.stdout + run.stderr
    assert len(re.findall(r"1M trial \d: send done after \d+ ms, landed after \d+ ms: [\d.]+ MiB held", said)) == 2
    (median,) = re.findall(r"1M: median ([\d.]+) MiB held", said)
    assert 0.0 <= float(median) <= 1.0  # no more than the message itself
