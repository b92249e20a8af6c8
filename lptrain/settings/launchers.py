"""How a parallel sweep (``hydra/launcher=joblib``) shares the machine's devices among its jobs.

Hydra's joblib launcher runs ``hydra.launcher.n_jobs`` jobs at a time in worker processes
(loky) and knows nothing of GPUs: two jobs on one GPU would share its memory and its
time, and each job's communication figures would include the other's. So, before Hydra
starts, ``plan_launch`` decides:

- **one GPU group or fewer** (a group: the GPUs one job uses): the jobs run one at a time
  (``hydra.launcher.n_jobs=1``), with one line saying so, unless ``LPTRAIN_SHARE_GPUS=1``
  asks for them to share;
- **several groups**: at most one job per group at a time, and each worker process claims
  a group of its own (``claim_gpus``: a lock file per group, held for the worker's life)
  and sees only it through ``CUDA_VISIBLE_DEVICES``, so every job's ``cuda:0`` is its own;
- **CPU jobs**: ``n_jobs`` as asked; joblib gives each worker ``cores // n_jobs`` threads
  (``OMP_NUM_THREADS``, which torch reads), so the jobs divide the cores.

Any other launcher (the basic one: in series; submitit: one allocation per job) is left
alone. The decision is a pure function of the counts, so it is tested without a GPU.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PARALLEL_LAUNCHERS = ("joblib",)  # launchers that run several jobs on this machine at once
SHARE_VAR = "LPTRAIN_SHARE_GPUS"  # =1: parallel jobs share the GPUs rather than wait for one
GPU_SLOT_VAR = "LPTRAIN_GPU_SLOT"  # set in a worker once it holds a group of GPUs
N_JOBS_KEY = "hydra.launcher.n_jobs"


@dataclass
class Launch:
    """What a sweep's launcher is told, and what each of its workers does first."""

    n_jobs: int = 1  # jobs at a time
    overrides: list[str] = field(default_factory=list)  # replace the user's hydra.launcher.n_jobs
    note: str | None = None  # one line for the user, when lptrain changed or decided something
    gpu_groups: list[list[str]] = field(default_factory=list)  # one per worker: its CUDA_VISIBLE_DEVICES
    threads: int | None = None  # CPU threads per job
    lock_dir: Path | None = None  # where the workers' group locks are (made and removed by the launcher)


def given(args: Sequence[str], key: str) -> str | None:
    """The value of ``key=VALUE`` on the command line (the last one), or None."""
    value = None
    for arg in args:
        name, sep, rest = arg.lstrip("+~").partition("=")
        if sep and name == key:
            value = rest
    return value


def effective_jobs(requested: int | None, cpus: int) -> int:
    """What joblib makes of ``n_jobs``: -1 all the CPUs, -2 all but one...; at least 1."""
    if requested is None:
        requested = -1  # the joblib launcher's default
    return max(cpus + 1 + requested if requested < 0 else requested, 1)


def plan_launch(
    launcher: str | None,
    requested: int | None,
    gpus_per_job: int,
    gpus: Sequence[str],
    cpus: int,
    share: bool,
) -> Launch:
    """The sweep's sharing of the devices (see the module docstring). ``gpus_per_job`` is
    the most GPUs one job addresses (0 for CPU jobs), ``gpus`` the names of those visible."""
    if launcher not in PARALLEL_LAUNCHERS:
        return Launch()
    n_jobs = effective_jobs(requested, cpus)
    if gpus_per_job == 0:
        return Launch(n_jobs=n_jobs, threads=max(cpus // n_jobs, 1))
    groups = len(gpus) // gpus_per_job
    if share or groups == 0:  # groups == 0: the jobs' own device check refuses them
        note = f"lptrain: {n_jobs} jobs at a time share {len(gpus)} GPU(s) ({SHARE_VAR}=1)" if share else None
        return Launch(n_jobs=n_jobs, note=note if n_jobs > 1 else None)
    slots = min(n_jobs, groups)
    launch = Launch(n_jobs=slots)
    if slots < n_jobs:
        launch.overrides = [f"{N_JOBS_KEY}={slots}"]
        how = "one job at a time" if slots == 1 else f"{slots} jobs at a time, each on GPUs of its own"
        launch.note = (
            f"lptrain: {len(gpus)} GPU(s), {gpus_per_job} per job: the sweep runs {how} ({N_JOBS_KEY}={slots}, "
            f"not {n_jobs}); {SHARE_VAR}=1 makes the jobs share them"
        )
    if slots > 1:
        launch.gpu_groups = [list(gpus[i * gpus_per_job : (i + 1) * gpus_per_job]) for i in range(slots)]
    return launch


def visible_gpus() -> list[str]:
    """The GPUs this process may use, by the names a child's ``CUDA_VISIBLE_DEVICES`` takes."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name.strip() for name in listed.split(",") if name.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def claim_gpus(
    groups: Sequence[Sequence[str]],
    lock_dir: Path,
    env: MutableMapping[str, str] = os.environ,
    wait_s: float = 60.0,
) -> int | None:
    """Take the first free group of ``groups`` for this worker: lock ``lock_dir/gpusN.lock``
    (released when the worker ends) and set ``CUDA_VISIBLE_DEVICES`` in ``env``. Returns the
    lock's descriptor (kept open for the worker's life), or None when this worker already
    holds a group (its later jobs keep it: CUDA reads the variable once per process).

    Call it before CUDA is initialised in the process. A group frees when a worker ends (a
    loky worker replaced after a crash); past ``wait_s`` with none free, ``TimeoutError``."""
    if GPU_SLOT_VAR in env:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        for index, group in enumerate(groups):
            fd = os.open(lock_dir / f"gpus{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            env["CUDA_VISIBLE_DEVICES"] = ",".join(group)
            env[GPU_SLOT_VAR] = str(index)
            return fd
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"no group of GPUs free for this sweep's worker after {wait_s:.0f} s ({len(groups)} groups, "
                f"locks in {lock_dir})"
            )
        time.sleep(min(0.5, wait_s / 4))


def gpus_addressed(devices: Sequence) -> int:
    """How many GPUs a job's devices (``torch.device``) address: ``cuda:3`` needs four
    visible, as a job sees its group renumbered from ``cuda:0``; 0 for CPU devices."""
    indices = [d.index or 0 for d in devices if d.type == "cuda"]
    return max(indices) + 1 if indices else 0


def sweep_launch(args: Sequence[str], job_devices: Sequence[Sequence]) -> tuple[Launch, list[str]]:
    """The sharing for the command line ``args`` whose jobs use ``job_devices`` (each job's
    ``RunConfig.devices``), and ``args`` with ``hydra.launcher.n_jobs`` replaced where it
    changed. Reads the launcher from the command line (``hydra/launcher=joblib``)."""
    launcher = given(args, "hydra/launcher")
    requested = given(args, N_JOBS_KEY)
    try:
        n_jobs = int(requested) if requested is not None else None
    except ValueError:  # Hydra refuses it in its own words
        n_jobs = None
    per_job = max((gpus_addressed(devices) for devices in job_devices), default=0)
    gpus = visible_gpus() if launcher in PARALLEL_LAUNCHERS and per_job else []
    share = os.environ.get(SHARE_VAR, "") not in ("", "0")
    launch = plan_launch(launcher, n_jobs, per_job, gpus, os.cpu_count() or 1, share)
    if launch.overrides:
        args = [a for a in args if a.lstrip("+~").partition("=")[0] != N_JOBS_KEY] + launch.overrides
    return launch, list(args)
