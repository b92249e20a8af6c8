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

HERE = Path(__file__).resolve().parent


def test_all_gather_coalesced_and_sparse_all_reduce_pass_through_to_gloo(tmp_path):
    backend = "lptrain_lp"  # passed through: the same for every algorithm
    run = subprocess.run(
        [sys.executable, str(HERE / "backend_ops_worker.py"), backend, "2", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"
