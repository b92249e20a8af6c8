"""Profiler ranges: the trainer's phases and each bucket's collective in a Chrome trace
written by ``trainer.profile=STEP_RANGE``; the range is checked before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lptrain.comm.ranges import collective_label
from lptrain.errors import ConfigError
from lptrain.settings.locations import compose_config
from lptrain.train.profiling import parse_step_range
from lptrain.train.trainer import Trainer

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.checkpoint_every=0", "trainer.eval_every=0"]


def test_step_ranges_are_n_or_a_dash_b_counted_from_one():
    assert parse_step_range(None) is None
    assert parse_step_range(3) == (3, 3)
    assert parse_step_range("2-4") == (2, 4)
    for bad in ("0", "4-2", "two", "2:4", "-1"):
        with pytest.raises(ConfigError, match=f"trainer.profile={bad} is not valid"):
            parse_step_range(bad)


def test_a_profile_beyond_the_run_is_refused_before_it_starts(tmp_path):
    with pytest.raises(ConfigError, match="trainer.profile=4-9 is not valid; the run has 5 steps"):
        Trainer(compose_config([*QUIET, "trainer.steps=5", "trainer.profile=4-9"]), tmp_path)


def test_collective_labels_name_op_algorithm_bytes_and_bucket():
    assert collective_label("allreduce", "lp", 1024, 3) == "lptrain allreduce lp 1024 B bucket 3"
    assert collective_label("broadcast", "ring", 8) == "lptrain broadcast ring 8 B"


def _ranges(trace: Path) -> list[dict]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e["name"].startswith("lptrain ")]


def test_the_trace_shows_the_phases_and_each_buckets_collective_on_the_communication_thread(tmp_path):
    overrides = ["trainer.steps=4", "trainer.profile=2-3", "trainer.bucket_mb=0.05", "trainer.overlap=true"]
    trainer = Trainer(compose_config([*QUIET, "trainer.devices=cpu*2", *overrides]), tmp_path)
    trainer.fit()
    trace = tmp_path / "profile" / "trace_rank0.json"
    assert trace.exists() and not list(trace.parent.glob("*.part"))
    ranges = _ranges(trace)
    phases = [e for e in ranges if e["name"].startswith("lptrain phase ")]
    buckets = [e for e in ranges if e["name"].startswith("lptrain allreduce lp ")]
    names = {e["name"].removeprefix("lptrain phase ") for e in phases}
    assert {"data", "compute", "comm", "update"} <= names, names
    assert sum(e["name"] == "lptrain phase compute" for e in phases) == 2  # steps 2 and 3 only
    assert len(buckets) == 2 * len(trainer.buckets)
    sizes = sorted({int(e["name"].split()[3]) for e in buckets})
    assert sizes == sorted({(b - a) * 4 for a, b in trainer.buckets})
    assert {e["name"].split("bucket ")[1] for e in buckets} == {str(k) for k in range(len(trainer.buckets))}
    # with overlap the collectives run on the communication thread, not where the phases are
    assert {e["tid"] for e in buckets}.isdisjoint({e["tid"] for e in phases})
