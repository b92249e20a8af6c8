"""lptrain's torch.distributed backend under PyTorch's own distributed tests.

The operations torch calls by their Python names on a group (``all_gather_coalesced``,
sparse ``all_reduce``) are checked on their own, fast; the slow test runs a selection of
``torch.testing._internal.distributed.distributed_test`` (PyTorch's DistributedTest) for
gloo and for lptrain's backends and holds lptrain's to every test gloo passes there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from doctools import torch_suite

HERE = Path(__file__).resolve().parent

# PyTorch's allreduce, broadcast, reduce, barrier, all_gather and communication-hook tests,
# on the CPU: a pattern on their names (doctools.torch_suite leaves out those naming cuda,
# gpu or nccl). scripts/torch_suite.py and docs/distributed.md's table use the same.
SELECTION = r"^test_(all_reduce|sparse_all_reduce|broadcast|reduce|barrier|all_gather)|hook"


def worker(what: str, backend: str, world: int, tmp_path: Path) -> list[str]:
    """backend_ops_worker.py's ``what`` at ``world`` processes: its lines (it ends with "ok")."""
    run = subprocess.run(
        [sys.executable, str(HERE / "backend_ops_worker.py"), what, backend, str(world), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,  # a hang would take the store's 60 s and more
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == "ok", lines
    return lines[:-1]


def test_all_gather_coalesced_sparse_all_reduce_and_recv_from_any_rank_pass_through_to_gloo(tmp_path):
    worker("ops", "lptrain_lp", 2, tmp_path)  # passed through: the same for every algorithm


def test_groups_that_cannot_work_are_refused_in_one_line(tmp_path):
    lines = sorted(worker("refusals", "lptrain_ring", 2, tmp_path))
    assert len(lines) == 3, lines  # rank 0's subgroup; both ranks' new_group beside a bound default group
    subgroup = [line for line in lines if "ranks=[0]" in line]
    assert subgroup == [
        "rank 0: new_group(ranks=[0], backend='lptrain_ring'): the lptrain backend's groups span every "
        "process (all 2); for a group of some of them use backend='gloo' or 'nccl'"
    ]
    for rank in (0, 1):
        bound = f"rank {rank}: new_group(backend='lptrain_ring'): the default group is bound to cuda:{rank}"
        assert [line for line in lines if line.startswith(bound) and "without device_id" in line], lines


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_lptrains_backends_pass_every_test_of_pytorchs_suite_that_gloo_passes(tmp_path, world_size):
    pytest.importorskip("expecttest", reason="PyTorch's test harness needs expecttest (the dev extra)")
    assert SELECTION == torch_suite.SELECTION  # the document's table is this selection's
    gloo = torch_suite.run("gloo", world_size, SELECTION, log=tmp_path / "gloo.log")
    assert torch_suite.counts(gloo)["pass"] >= 40, (
        torch_suite.counts(gloo),
        (tmp_path / "gloo.log").read_text()[-3000:],
    )
    for backend in ("lptrain_lp", "lptrain_ring"):
        found = torch_suite.run(backend, world_size, SELECTION, log=tmp_path / f"{backend}.log")
        assert set(found) == set(gloo), backend  # the same tests, chosen as for gloo
        assert not torch_suite.missing(found, gloo), (backend, torch_suite.missing(found, gloo))
