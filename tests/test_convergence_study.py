"""scripts/convergence.py: every communicator trains the same curve, the report says so, and a
study that was stopped continues from the runs it had finished."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "convergence.py"
QUICK = ["--networks", "small", "--long-steps", "6", "--short-steps", "3"]
SMALL_RUNS = ["trainer.devices=cpu*3", "trainer.batch_per_device=8", "optim.schedule=cosine", "optim.lr=0.05"]


def study(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *QUICK, "--out", str(tmp_path), "--work", str(tmp_path / "work"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def table_rows(text: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] in ("allreduce", "reduce"):
            rows[(cells[0], cells[1])] = cells
    return rows


@pytest.mark.slow  # nine short training runs, three times over (about 45 s): CI time
def test_every_communicator_follows_lp_and_the_report_and_figure_are_written(tmp_path):
    # A cosine schedule depends on the run's length: the short runs must still follow the
    # long run's schedule, or their curves would differ for a reason that is not the sum.
    out = study(tmp_path, *SMALL_RUNS)
    text = (tmp_path / "CONVERGENCE.md").read_text()
    rows = table_rows(text)
    expected = {(c, s) for c in ("lp", "mst", "be", "ring") for s in ("allreduce", "reduce")}
    expected.add(("lp, chain reversed", "allreduce"))
    assert set(rows) == expected, rows
    assert rows[("lp", "allreduce")][2] == "6" and rows[("mst", "reduce")][2] == "3"
    for key, cells in rows.items():
        if key == ("lp", "allreduce"):
            assert cells[5] == "reference"
            continue
        # Same batches, same schedule: over three steps only the order of additions differs.
        assert float(cells[5]) < 1e-4, (key, cells)
        assert float(cells[6]) >= 0  # comm ms per iteration was measured
    assert re.search(r"Reordering alone \(the control\) moves the loss by up to", text)
    assert (tmp_path / "figures" / "convergence_small.png").read_bytes()[:4] == b"\x89PNG"
    assert "python scripts/convergence.py" in text and "trainer.devices=auto" in text
    assert out.stdout.count(" ...") == len(expected)  # every run trained once

    # Run again: the finished runs are reused, nothing is trained a second time.
    (tmp_path / "CONVERGENCE.md").unlink()
    again = study(tmp_path, *SMALL_RUNS)
    assert " ..." not in again.stdout
    assert table_rows((tmp_path / "CONVERGENCE.md").read_text()) == rows

    # A kept run whose configuration no longer matches (an edited recipe, say) trains again.
    kept = tmp_path / "work" / "small-mst-reduce" / "result.json"
    data = json.loads(kept.read_text())
    data["config"]["optim"]["lr"] = 0.5
    kept.write_text(json.dumps(data))
    third = study(tmp_path, *SMALL_RUNS)
    assert (
        third.stdout.count(" ...") == 1 and "small-mst-reduce: the kept run had another configuration" in third.stdout
    )


def test_bad_arguments_are_refused_with_the_valid_choices(tmp_path):
    for args, words in (
        (["--networks", "resnet"], "unknown network 'resnet'"),
        (["--comms", "lp,tree"], "unknown communicator 'tree'"),
        (["--short-steps", "1"], "at least 2"),
        (["--bogus"], "unknown argument '--bogus'"),
    ):
        out = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert out.returncode == 2, (args, out.stderr)
        assert words in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


def test_a_kept_run_is_reused_only_for_the_same_configuration():
    import importlib.util

    spec = importlib.util.spec_from_file_location("convergence_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    kept = {"comm": {"name": "lp", "options": {"block_size": "auto"}}, "optim": {"lr": 0.01}}
    grown = {"comm": {"name": "lp", "options": {"block_size": "auto", "reduce_kernel": "auto"}}, "optim": {"lr": 0.01}}
    assert module.same_config(kept, kept, ["comm=lp"])
    assert module.same_config(kept, grown, ["comm=lp"])  # an option added since, at its default
    assert not module.same_config(kept, grown, ["comm=lp", "comm.options.reduce_kernel=auto"])  # set by the run
    changed = {**grown, "optim": {"lr": 0.02}}
    assert not module.same_config(kept, changed, ["comm=lp"])
    assert not module.same_config(grown, kept, ["comm=lp"])  # an option the kept run had is gone
