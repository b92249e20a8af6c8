"""``lptrain-report``: ranks a sweep by what its runs measured, labels runs by what was swept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lptrain.report import find_runs, label_runs, main, rank, read_run


def fake_run(
    folder: Path, overrides: list[str], comm_ms: list[float], compute_ms: float = 100.0, finished: bool = True
) -> None:
    """A run folder as lptrain writes it, with known per-step times (the first step is a warm-up);
    ``finished=False``: as a run still running, or killed, leaves it (no summary.json)."""
    folder.mkdir(parents=True)
    comm = dict(o.split("=", 1) for o in overrides).get("comm", "lp")
    config = {
        "comm": {"name": comm, "options": {"block_size": "auto"}},
        "model": {"name": "small"},
        "trainer": {"devices": 4, "device_type": "cpu", "sync": "allreduce"},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    rows = [
        {
            "step": i + 1,
            "loss": 2.3 - 0.01 * i,
            "accuracy": 0.1,
            "data_ms": 0.1,
            "compute_ms": compute_ms,
            "comm_ms": ms,
            "step_ms": compute_ms + ms,
            "warmup": i == 0,
        }
        for i, ms in enumerate(comm_ms)
    ]
    (folder / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # What a one-step interval log would show: a reader of this alone would rank the runs wrongly.
    last = rows[-1]
    (folder / "metrics.jsonl").write_text(json.dumps({**last, "comm_bytes": 1e6, "eval_accuracy": 0.5}) + "\n")
    if finished:
        (folder / "summary.json").write_text(json.dumps({"steps": len(rows), "mean_comm_ms": 1.0}, indent=1))


def test_a_sweep_with_known_timings_is_ranked_and_labelled_right(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    # lp is faster over its timed steps (mean 2.0) than ring (mean 3.0), though its warm-up
    # step is slow and its last step is slower than ring's: the old report averaged what was
    # left after dropping the first *logged* step, and read the ranking backwards.
    fake_run(sweep / "0", ["comm=lp", "comm.options.block_size=64K", "trainer.steps=4"], [90.0, 1.0, 2.0, 3.0])
    fake_run(sweep / "1", ["comm=lp", "comm.options.block_size=1M", "trainer.steps=4"], [50.0, 4.0, 4.0, 4.0])
    fake_run(sweep / "2", ["comm=ring", "comm.options.block_size=64K", "trainer.steps=4"], [1.0, 3.5, 3.5, 2.0])
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line[:2].strip().isdigit()]
    assert [line.split()[1:3] for line in lines] == [
        ["comm=lp", "comm.options.block_size=64K"],
        ["comm=ring", "comm.options.block_size=64K"],
        ["comm=lp", "comm.options.block_size=1M"],
    ]
    assert "2.00 ± 0.82" in lines[0] and "3.00 ± 0.71" in lines[1] and "4.00 ± 0.00" in lines[2]
    assert "trainer.steps" not in out  # the same in every run: not part of a label
    png = sweep / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_labels_hold_every_swept_override_and_nothing_else(tmp_path):
    fake_run(tmp_path / "a", ["comm=lp", "trainer.devices=2", "optim.lr=0.1"], [1.0, 1.0])
    fake_run(tmp_path / "b", ["comm=lp", "trainer.devices=4", "optim.lr=0.1"], [1.0, 1.0])
    records = [read_run(p) for p in find_runs(tmp_path)]
    assert label_runs(records) == ["trainer.devices"]
    assert [r.label for r in rank(records)] == ["trainer.devices=2", "trainer.devices=4"]


@pytest.mark.parametrize("steps", [4])
def test_a_real_sweep_reports_every_run(tmp_path, steps):
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lptrain",
            "-m",
            "comm=lp,ring",
            f"trainer.steps={steps}",
            "trainer.eval_every=4",
            "trainer.devices=cpu*2",
            "trainer.progress=false",
            "trainer.checkpoint_every=0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summaries = {json.loads((p / "summary.json").read_text())["mean_comm_ms"] for p in find_runs(sweep)}
    report = subprocess.run([sys.executable, "-m", "lptrain.report", str(sweep)], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    rows = [line.split() for line in report.stdout.splitlines() if line[:2].strip().isdigit()]
    assert sorted(r[1] for r in rows) == ["comm=lp", "comm=ring"]
    # The report's means are the runs' own summaries' means (same steps, same rule).
    assert {round(float(r[5]), 2) for r in rows} == {round(m, 2) for m in summaries}
    assert all(r[3] == str(steps) and r[4] == str(steps - 1) for r in rows)


def test_broken_files_and_a_half_written_run_are_marked_with_one_line_per_bad_file(tmp_path):
    """A broken config.yaml, a steps.jsonl that is not UTF-8, a summary.json cut short, a run
    with no summary.json: every run is listed, each bad file in one line, and no traceback."""
    sweep = tmp_path / "sweep"
    for n in range(5):
        fake_run(sweep / str(n), [f"comm={['lp', 'mst', 'be', 'ring', 'lp-rb'][n]}"], [9.0, 1.0 + n, 1.0 + n])
    (sweep / "1" / "config.yaml").write_text("comm: [lp, {name: \n  - :\n")  # not YAML
    with open(sweep / "2" / "steps.jsonl", "ab") as f:
        f.write(b"\xff\xfe\x00 not text\n")  # not UTF-8, between two good lines
        f.write(json.dumps({"step": 4, "comm_ms": 3.0, "compute_ms": 100.0, "step_ms": 103.0}).encode() + b"\n")
    (sweep / "3" / "summary.json").write_text('{"steps": 3, "mean_')  # cut short
    (sweep / "4" / "summary.json").unlink()  # half-written: still running, or killed
    result = subprocess.run([sys.executable, "-m", "lptrain.report", str(sweep)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr  # before the fix: a traceback and exit code 1
    assert result.stderr == ""
    out = result.stdout
    rows = {line.split()[1]: line for line in out.splitlines() if line[:2].strip().isdigit()}
    assert set(rows) == {"comm=lp", "comm=mst", "comm=be", "comm=ring", "comm=lp-rb"}, out
    assert "BAD FILE" not in rows["comm=lp"] and "UNFINISHED" not in rows["comm=lp"]
    for label in ("comm=mst", "comm=be", "comm=ring"):
        assert "BAD FILE" in rows[label], rows[label]
    assert "UNFINISHED" in rows["comm=lp-rb"] and "BAD FILE" not in rows["comm=lp-rb"], rows["comm=lp-rb"]
    assert rows["comm=be"].split()[3] == "4"  # the good lines around the bad one are read
    bad = [line.strip() for line in out.splitlines() if line.startswith("  ") and ": " in line]
    assert len([b for b in bad if b.startswith(str(sweep))]) == 3, out
    assert any(b.startswith(f"{sweep / '1' / 'config.yaml'}: not valid YAML") for b in bad), out
    assert any(b.startswith(f"{sweep / '2' / 'steps.jsonl'}: 1 line") for b in bad), out
    assert any(b.startswith(f"{sweep / '3' / 'summary.json'}: not valid JSON") for b in bad), out
