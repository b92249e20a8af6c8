"""Communication, exposed communication, hand-off and the comm share: each measured once, on
one clock, the exposed part never above the whole, and every reader showing the same figure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from handoff_worker import QUIET, RUNS, slow_handoff

from lptrain.report import read_run, render_table
from lptrain.settings.locations import compose_config
from lptrain.train.commtime import comm_times, covered_ms
from lptrain.train.timing import StepTimeline
from lptrain.train.trainer import Trainer

DELAY_S = 0.03  # the communication thread's lateness in taking each bucket (slow_handoff)


def steps_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def check_steps(name: str, rows: list[dict]) -> None:
    """Every step: exposed within the whole, the hand-off its own figure (none without a thread)."""
    assert rows, name
    for r in rows:
        assert 0 <= r["comm_exposed_ms"] <= r["comm_ms"], (name, r)
        assert r["comm_handoff_ms"] >= 0, (name, r)
        assert r["step_ms"] >= r["compute_ms"] + r["comm_exposed_ms"] + r["comm_handoff_ms"] - 1e-9, (name, r)
        assert r["wall_ms"] >= r["step_ms"] - 1e-9, (name, r)  # the clock's whole iteration holds every phase
        if name.startswith("serial"):  # no thread: all of the communication is waited for, nothing handed off
            assert r["comm_exposed_ms"] == r["comm_ms"] and r["comm_handoff_ms"] == 0.0, (name, r)
        else:  # the thread took the last bucket DELAY_S late, after backward had ended
            assert r["comm_handoff_ms"] >= 0.5 * DELAY_S * 1e3, (name, r)


# -- the definitions, on a known timeline ------------------------------------------------------------


def test_covered_counts_the_part_of_the_collectives_inside_the_wait():
    assert covered_ms([(0.0, 4.0), (5.0, 9.0)], (3.0, 7.0)) == 3.0  # 3-4 and 5-7
    assert covered_ms([(0.0, 2.0)], (3.0, 7.0)) == 0.0  # all of it ran during backward
    assert covered_ms([(2.0, 6.0), (4.0, 8.0)], (0.0, 10.0)) == 6.0  # what overlaps counts once
    assert covered_ms([], (0.0, 1.0)) == 0.0


def test_an_overlapped_step_splits_its_wait_into_exposed_communication_and_hand_off():
    # Backward ends at 10 ms; the wait lasts to 20. Bucket 1 ran 6-9 (hidden), bucket 2 ran
    # 13-18: the step waited 3 ms before it started and 2 ms after it ended with nothing running.
    timeline = StepTimeline(
        phases={"comm_buffers": (0.0, 1.0), "compute": (1.0, 10.0), "comm": (10.0, 20.0), "update": (20.0, 21.0)},
        spans=[(6.0, 9.0), (13.0, 18.0)],
    )
    times = comm_times(timeline, overlapped=True)
    assert (times.comm_ms, times.exposed_ms, times.handoff_ms) == (1.0 + 8.0, 1.0 + 5.0, 5.0)
    assert sum(timeline.durations().values()) == 21.0  # the step: compute + exposed + hand-off + update
    serial = comm_times(StepTimeline(phases=timeline.phases, spans=[]), overlapped=False)
    assert (serial.comm_ms, serial.exposed_ms, serial.handoff_ms) == (11.0, 11.0, 0.0)


# -- the trainer: every step, in one process and under torchrun -----------------------------------------


@pytest.mark.parametrize("name", list(RUNS))
def test_exposed_never_exceeds_communication_and_the_hand_off_is_its_own_figure(tmp_path, name):
    small = ["trainer.devices=cpu*2", "trainer.steps=4", "trainer.batch_per_device=8", *QUIET]
    with slow_handoff(DELAY_S):
        Trainer(compose_config([*small, *RUNS[name]]), tmp_path).fit()
    check_steps(name, steps_of(tmp_path))


@pytest.mark.slow  # two processes, four short runs: some 40 s on the 2-core machine
def test_exposed_never_exceeds_communication_under_torchrun(tmp_path):
    worker = Path(__file__).with_name("handoff_worker.py")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(worker)]
        + [str(tmp_path), str(DELAY_S)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for name in RUNS:
        check_steps(name, steps_of(tmp_path / name))


# -- one comm share, wherever it is read -----------------------------------------------------------------


def test_the_summary_and_the_report_give_the_same_comm_share(tmp_path):
    config = compose_config(["trainer.devices=cpu*2", "trainer.steps=4", "trainer.batch_per_device=8", *QUIET])
    trainer = Trainer(config, tmp_path)
    summary = trainer.fit()
    said = re.search(r"; ([\d.]+%) of the step\)", summary.render(config, trainer.replicas.numel))
    record = read_run(tmp_path)
    assert record.comm_share == summary.comm_fraction  # the same steps, the same definition
    row = render_table([record]).splitlines()[2]
    assert said is not None and said.group(1) in row.split(), (said, row)
