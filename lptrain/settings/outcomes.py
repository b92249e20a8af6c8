"""What the jobs of a sweep that ran in other processes came to, read from their folders.

A launcher that runs jobs in worker processes (joblib's loky workers; submitit's SLURM
jobs) returns nothing lptrain can read from the launching process: a failed job's one
line and exit code are in its folder's ``failed.json`` (with its number and label), and
the launching process reads them there once the sweep has ended, to print each failed
job's line and the count as a serial sweep does.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

FAILED_FILE = "failed.json"


@dataclass(frozen=True)
class FailedJob:
    num: int
    label: str  # "job N (its overrides)"
    message: str
    code: int


def failed_jobs(sweep_dir: Path, ours, known: Collection[int] = ()) -> list[FailedJob]:
    """The failed jobs recorded under ``sweep_dir`` in folders this sweep made (``ours``:
    a ``RunDirs.ours``; a folder of an earlier sweep is not this sweep's), leaving out the
    job numbers in ``known`` (said already), in job order. A file that cannot be read is
    skipped: the report marks it."""
    found: dict[int, FailedJob] = {}
    for path in sorted(sweep_dir.rglob(FAILED_FILE)) if sweep_dir.is_dir() else []:
        if not ours(path.parent):
            continue
        try:
            said = json.loads(path.read_text())
            job = FailedJob(int(said["job_num"]), str(said["job"]), str(said["error"]), int(said["exit_code"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if job.num not in known:
            found[job.num] = job
    return [found[num] for num in sorted(found)]
