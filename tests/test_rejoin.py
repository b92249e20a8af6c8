"""Several lptrain jobs in a row inside one torchrun (``torchrun --no-python bash -c 'lptrain-bench
...; lptrain-bench ...'``, or one lptrain-cluster run of a script). torchrun's agent keeps one
store for all of them, so without a store of its own each later job finds the last one's keys
there: a rank that starts it early reads its peers' old addresses and gloo fails to connect,
after a hundred seconds, with a traceback instead of a line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

JOB = textwrap.dedent(
    """
    import datetime, sys
    import torch, torch.distributed as dist
    from lptrain.train.launch import join_default_group
    join_default_group(torch.device("cpu"), datetime.timedelta(seconds=30))
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print(f"job {sys.argv[1]} rank {dist.get_rank()} sum {t[0].item():g}", flush=True)
    dist.destroy_process_group()
    """
)


def test_jobs_in_a_row_under_one_torchrun_each_get_a_store_of_their_own(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    # rank 0 starts every later job late, so rank 1 always reaches the store first
    script = "; ".join(f'{{ [ "$RANK" = 0 ] && sleep 2; {sys.executable} {job} {n} || exit 1; }}' for n in (1, 2, 3))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
           "bash", "-c", script]  # fmt: skip
    try:
        run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as err:
        raise AssertionError("a later job hung joining the group") from err
    assert run.returncode == 0, run.stderr[-2000:]
    for n in (1, 2, 3):
        for rank in (0, 1):
            assert f"job {n} rank {rank} sum 3" in run.stdout
