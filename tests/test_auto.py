"""comm=auto: the choice from a tuning file, the simulator where it has no answer, and the plumbing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lptrain.auto import AutoCommunicator, TuningTable
from lptrain.communicators import CollectiveInputError, build_communicator
from lptrain.errors import ConfigError
from lptrain.settings.locations import compose

KiB, MiB = 1024, 1024 * 1024
SIZES = [KiB, 16 * KiB, 256 * KiB, 4 * MiB, 64 * MiB]
# Synthetic curves that cross: lp wins small, ring wins large, be in between, mst never;
# lp with a 1M block beats lp's automatic block only at 64M.
CURVES = {
    ("lp", ()): [10, 30, 200, 3000, 60000],
    ("lp", (("block_size", "1M"),)): [40, 60, 260, 3100, 41000],
    ("be", ()): [30, 25, 150, 2500, 52000],
    ("ring", ()): [50, 70, 180, 2000, 40000],
    ("mst", ()): [12, 40, 400, 6000, 99000],
}


def synthetic(world_size: int = 4, executor: str = "in-process", ops=("allreduce",)) -> dict:
    rows = [
        {"op": op, "bytes": n, "algo": algo, "options": dict(opts), "time_us": t}
        for op in ops
        for (algo, opts), times in CURVES.items()
        for n, t in zip(SIZES, times)
    ]
    return {
        "lptrain_tuning": 1,
        "executor": executor,
        "device_type": "cpu",
        "world_size": world_size,
        "dtype": "float32",
        "rows": rows,
    }


@pytest.fixture
def tuning_file(tmp_path) -> Path:
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(synthetic()))
    return path


def test_at_every_measured_size_the_choice_is_the_fastest_measured():
    table = TuningTable.from_dict(synthetic())
    for i, n in enumerate(SIZES):
        choice = table.choose("allreduce", n)
        times = {(a, tuple(sorted(o))): ts[i] for (a, o), ts in CURVES.items()}
        best = min(times.values())
        picked = times[(choice.algo, tuple(sorted(choice.options.items())))]
        assert picked == best and choice.source == "measured"
        # never an algorithm measured more than 10% slower than the best (here: exactly the best)
        assert picked <= 1.10 * best
    assert table.choose("allreduce", KiB).algo == "lp"
    assert table.choose("allreduce", 16 * KiB).algo == "be"
    assert table.choose("allreduce", 4 * MiB).algo == "ring"
    big = table.choose("allreduce", 64 * MiB)
    assert (big.algo, big.options) == ("ring", {})  # 40000 against lp@1M's 41000
    assert "ring 40000 us" in big.detail and "lp@1M 41000" in big.detail


def test_between_measured_sizes_each_curve_is_interpolated_log_log():
    table = TuningTable.from_dict(synthetic())
    n = 64 * KiB  # halfway (in log) between 16K and 256K
    choice = table.choose("allreduce", n)
    assert choice.source == "interpolated"

    def at(times):
        return math.exp((math.log(times[1]) + math.log(times[2])) / 2)

    estimates = {key: at(times) for key, times in CURVES.items()}
    best = min(estimates, key=estimates.get)
    assert (choice.algo, tuple(sorted(choice.options.items()))) == best


def test_outside_the_grid_the_simulator_chooses(tuning_file):
    table = TuningTable.load(tuning_file)
    assert table.choose("allreduce", 512) is None  # below the grid
    assert table.choose("allreduce", 1 << 30) is None  # above it
    assert table.choose("broadcast", MiB) is None  # an operation it did not measure
    auto = build_communicator("auto", ["cpu"] * 4, tuning=str(tuning_file))
    choice = auto.choose("broadcast", MiB)
    assert choice.source == "simulated" and "host model" in choice.detail
    assert choice.algo in ("lp", "mst", "be", "ring")


def test_auto_delegates_sums_correctly_and_remembers_its_choices(tuning_file):
    auto = build_communicator("auto", ["cpu"] * 4, tuning=str(tuning_file))
    for count in (256, 4096, 1_048_576):  # 1K, 16K, 4M of float32: lp, be, ring
        tensors = [torch.full((count,), float(r + 1)) for r in range(4)]
        auto.allreduce(tensors)
        assert all(torch.equal(t, torch.full((count,), 10.0)) for t in tensors)
    assert [(op, n, c.algo) for op, n, c in auto.decisions] == [
        ("allreduce", KiB, "lp"),
        ("allreduce", 16 * KiB, "be"),
        ("allreduce", 4 * MiB, "ring"),
    ]
    tensors = [torch.ones(256) for _ in range(4)]
    auto.allreduce(tensors)  # the same shape again: no new decision
    assert len(auto.decisions) == 3
    assert auto.prepare("allreduce", KiB) is auto.prepare("allreduce", KiB)
    assert any("be (measured" in line for line in auto.describe())
    reduced = [torch.full((5,), float(r)) for r in range(4)]
    auto.reduce(reduced, root=2)
    assert torch.equal(reduced[2], torch.full((5,), 6.0)) and torch.equal(reduced[0], torch.zeros(5))


def test_without_a_tuning_file_the_simulator_chooses_every_size():
    auto = build_communicator("auto", ["cpu"] * 3)
    tensors = [torch.full((1000,), 2.0) for _ in range(3)]
    auto.allreduce(tensors)
    assert torch.equal(tensors[1], torch.full((1000,), 6.0))
    assert auto.decisions[0][2].source == "simulated"


def test_a_tuning_file_for_another_setting_is_refused_with_what_differs(tmp_path):
    path = tmp_path / "eight.json"
    path.write_text(json.dumps(synthetic(world_size=8)))
    with pytest.raises(CollectiveInputError, match="in-process, cpu, 8 ranks, not in-process, cpu, 4"):
        build_communicator("auto", ["cpu"] * 4, tuning=str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not readable JSON"),
        (json.dumps({"rows": []}), "not an lptrain tuning file"),
        (json.dumps({**synthetic(), "executor": "cloud"}), "executor 'cloud' is not one of in-process, distributed"),
        (
            json.dumps({**synthetic(), "rows": [{"op": "allreduce", "bytes": 1, "algo": "tree", "time_us": 1}]}),
            "algorithm 'tree'; valid: lp, mst, be, ring, nccl",
        ),
        (json.dumps({**synthetic(), "rows": [{"op": "allreduce"}]}), "row 0 needs op, bytes, algo and time_us"),
        (json.dumps({**synthetic(), "world_size": "four"}), r"bad\.json.: world_size='four' is not valid; use a whole"),
        (json.dumps({**synthetic(), "world_size": 0}), r"world_size=0 is not valid; use a whole number of ranks"),
        (json.dumps({**synthetic(), "rows": []}), r"bad\.json. has no rows: nothing was measured"),
        (json.dumps({**synthetic(), "rows": {"op": "allreduce"}}), r"rows must be a list of measurements"),
    ],
)
def test_bad_tuning_files_get_one_clear_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(CollectiveInputError, match=message):
        TuningTable.load(path)
    with pytest.raises(CollectiveInputError, match="does not exist; write one with lptrain-bench --save-tuning"):
        TuningTable.load(tmp_path / "missing.json")


def test_the_config_group_and_its_checks(tuning_file):
    from lptrain.settings.checks import check_config

    cfg = check_config(compose(["comm=auto", f"comm.options.tuning={tuning_file}", "trainer.devices=cpu*4"]))
    assert cfg.comm.name == "auto" and cfg.comm.options.tuning == str(tuning_file)
    with pytest.raises(ConfigError, match="comm.options.tuning=/no/such.json is not valid: tuning file"):
        check_config(compose(["comm=auto", "comm.options.tuning=/no/such.json"]))
    with pytest.raises(ConfigError, match="comm.options.topology=pcie3 is not valid; .*neither a model \\(private"):
        check_config(compose(["comm=auto", "comm.options.topology=pcie3"]))


def test_the_bench_writes_a_tuning_file_auto_reads(tmp_path):
    from lptrain.bench.cli import main

    path = tmp_path / "measured.json"
    argv = ["--algo", "lp,ring", "--lp-block", "auto,64K", "--devices", "3", "-b", "1K", "-e", "64K", "-f", "64"]
    main([*argv, "--trials", "1", "-n", "2", "--quiet", "--save-tuning", str(path)])
    table = TuningTable.load(path)
    assert (table.executor, table.device_type, table.world_size) == ("in-process", "cpu", 3)
    labels = {(r["algo"], tuple(sorted(r["options"].items()))) for r in table.rows}
    assert labels == {("lp", ()), ("lp", (("block_size", "64K"),)), ("ring", ())}
    assert {r["bytes"] for r in table.rows} == {1024, 65536}
    auto = AutoCommunicator(
        lambda algo, options: build_communicator(algo, ["cpu"] * 3, **options),
        executor="in-process",
        device_type="cpu",
        world_size=3,
        tuning=str(path),
    )
    assert auto.choose("allreduce", 1024).source == "measured"


def test_a_training_run_says_what_auto_chose(tmp_path, tuning_file):
    result = subprocess.run(
        [sys.executable, "-m", "lptrain", "comm=auto", f"comm.options.tuning={tuning_file}", "trainer.steps=2"]
        + [
            "trainer.devices=cpu*4",
            "trainer.eval_every=0",
            "trainer.progress=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "comm auto: allreduce of 841.3K: be (interpolated" in result.stdout
