"""The benchmark's plumbing: rows, correctness column, and argument errors (not timings)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from lptrain.bench import cli, inprocess, variants


def test_bench_rows_are_correct_for_every_algorithm_and_op(tmp_path, capsys):
    out = tmp_path / "rows.json"
    code = cli.main(
        [
            "--op",
            "all",
            "--algo",
            "lp,lp-rb,mst,be,ring,nccl",
            "--devices",
            "cpu*3",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "1",
            "-w",
            "1",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())
    printed = capsys.readouterr().out
    measured = [r for r in rows if r["algo"] != "memcpy"]
    expected_algos = {"lp", "lp-rb", "mst", "be", "ring"} | ({"nccl"} if "nccl: skipped" not in printed else set())
    assert {r["algo"] for r in measured} == expected_algos
    assert {r["op"] for r in rows} == {"allreduce", "broadcast", "reduce"}
    assert {r["size"] for r in rows} == {1024, 8192, 65536}
    assert all(r["wrong"] == 0 for r in measured), [r for r in measured if r["wrong"]]
    allreduce = next(r for r in measured if r["op"] == "allreduce")
    assert allreduce["busbw"] == pytest.approx(allreduce["algbw"] * 2 * 2 / 3)
    assert "#wrong" in printed and "memcpy" in printed


def test_wrong_count_detects_a_broken_communicator():
    from lptrain.communicators import build_communicator

    comm = build_communicator("ring", ["cpu"] * 3)
    comm.allreduce = lambda tensors: tensors[1].add_(1)  # sabotage: no sum, and rank 1 off by one
    xs = [variants.pattern(r, 100, torch.float32, torch.device("cpu")) for r in range(3)]
    total = xs[0] + xs[1] + xs[2]
    expected = int((xs[0] != total).sum() + (xs[1] + 1 != total).sum() + (xs[2] != total).sum())
    assert expected > 200
    assert inprocess.count_wrong(comm, "allreduce", 100, torch.float32, 0) == expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algo", "lp,tree"], "unknown algorithm"),
        (["-b", "1M", "-e", "1K"], "size range is empty"),
        (["-f", "1"], "step factor"),
        (["--devices", "cpu:4"], r"--devices=cpu:4 is not valid: a CPU device has no index"),
        (["--devices", "0"], r"--devices=0 is not valid: a count is a positive N"),
        (["--devices", "cuda:2"], "CUDA|this machine has"),
        (["--root", "9", "-e", "1K"], "root must be a rank"),
        (["-b", "big"], "number of bytes"),
    ],
)
def test_bad_arguments_give_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_across_processes_an_unknown_algorithm_is_refused_and_gloo_names_the_backends_own():
    from lptrain.bench import distributed

    assert distributed.wanted_algorithms("lp,gloo,native,nccl,mpi") == ["lp", "gloo", "native", "nccl", "mpi"]
    with pytest.raises(ValueError, match="unknown algorithm.*tree.*valid: .*gloo"):
        distributed.wanted_algorithms("lp,tree")


def test_across_processes_the_timeout_reaches_the_process_group(monkeypatch):
    import datetime

    from lptrain.bench import distributed

    joined = {}
    monkeypatch.setattr(distributed, "join_default_group", lambda device, timeout=None: joined.update(t=timeout))
    distributed.join_process_group(timeout_s=7.5)
    assert joined["t"] == datetime.timedelta(seconds=7.5)
