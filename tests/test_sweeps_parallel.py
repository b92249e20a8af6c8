"""Parallel sweeps (``hydra/launcher=joblib``): lptrain's failure policy across worker processes.

A joblib sweep runs its jobs in loky worker processes, where nothing the job records in
memory reaches the command that launched it: the launching process learns each job's
outcome from the job's ``failed.json`` and prints the lines and the count itself. How the
devices are shared (one GPU: one job at a time; several: one group of GPUs per job) is
decided by ``lptrain.settings.launchers``, tested here through its decision logic.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lptrain.settings.launchers import GPU_SLOT_VAR, SHARE_VAR, claim_gpus, plan_launch
from lptrain.settings.outcomes import failed_jobs

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0", "trainer.checkpoint_every=0"]
HAS_JOBLIB_LAUNCHER = importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None


def tuning_file(path: Path, world_size: int) -> Path:
    """A tuning file measured for ``world_size`` ranks: a run of another size is refused when
    its communicator is built (at run time, past the preflight)."""
    rows = [{"op": "allreduce", "bytes": 1 << 20, "algo": algo, "options": {}, "time_us": t}
            for algo, t in (("ring", 900.0), ("lp", 1000.0))]  # fmt: skip
    path.write_text(json.dumps({"lptrain_tuning": 1, "executor": "in-process", "device_type": "cpu",
                                "world_size": world_size, "dtype": "float32", "rows": rows}))  # fmt: skip
    return path


@pytest.mark.slow  # about 25 s on two cores: four jobs' start-up, two at a time
@pytest.mark.skipif(not HAS_JOBLIB_LAUNCHER, reason="hydra-joblib-launcher is not installed (pip install '.[sweeps]')")
def test_a_joblib_sweep_of_four_jobs_with_one_failing_gives_three_summaries_one_line_and_the_count(tmp_path):
    """2 x 2 jobs, two at a time: only (4 replicas, the two-rank tuning file) fails, once its
    communicator is built. Before the launcher's workers reported back, the command said
    nothing of it and exited 0."""
    tuning = tuning_file(tmp_path / "two.json", 2)
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, "-m", "lptrain", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         "trainer.devices=4,2", "comm=auto", f"comm.options.tuning=null,{tuning}", "trainer.steps=2",
         "trainer.batch_per_device=8", *QUIET, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr, "the joblib launcher did not run the jobs"
    said = [line for line in result.stderr.splitlines() if line.startswith("lptrain: error:")]
    assert len(said) == 2, result.stderr
    assert said[0].startswith("lptrain: error: job 1 (trainer.devices=4 comm=auto comm.options.tuning=")
    assert "does not describe this run" in said[0], said[0]
    assert said[1] == "lptrain: error: 1 of 4 jobs failed (job 1); the others ran"
    assert "Traceback" not in result.stderr, result.stderr
    assert len(list(sweep.rglob("summary.json"))) == 3
    failed = json.loads((sweep / "1" / "failed.json").read_text())
    assert failed["exit_code"] == 2 and "does not describe this run" in failed["error"]
    report = subprocess.run([sys.executable, "-m", "lptrain.report", str(sweep)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    rows = [line for line in report.stdout.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == 4, report.stdout
    failed_rows = [line for line in rows if "FAILED" in line]
    assert len(failed_rows) == 1 and "trainer.devices=4" in failed_rows[0], report.stdout


def test_the_launching_process_reads_the_failed_jobs_of_this_sweep_in_job_order(tmp_path):
    """Jobs 2 and 0 failed in workers; job 3 was said already (it ran in this process); an
    earlier sweep's folder and an unreadable file are not this sweep's failures."""
    sweep = tmp_path / "sweep"
    for num, code in ((2, 6), (0, 2), (3, 2), (7, 2)):
        (sweep / str(num)).mkdir(parents=True)
        said = {"error": f"error {num}", "exit_code": code, "job_num": num, "job": f"job {num} (x={num})"}
        (sweep / str(num) / "failed.json").write_text(json.dumps(said))
    (sweep / "5").mkdir()
    (sweep / "5" / "failed.json").write_text('{"error": "cut sho')
    earlier = (sweep / "7").resolve()
    jobs = failed_jobs(sweep, lambda folder: folder.resolve() != earlier, known={3})
    assert [(j.num, j.label, j.message, j.code) for j in jobs] == [
        (0, "job 0 (x=0)", "error 0", 2),
        (2, "job 2 (x=2)", "error 2", 6),
    ]


# -- how the devices are shared: the decision, without a GPU --------------------------------------------------


def test_one_gpu_runs_the_jobs_one_at_a_time_and_says_so():
    launch = plan_launch("joblib", 2, gpus_per_job=1, gpus=["0"], cpus=16, share=False)
    assert launch.n_jobs == 1 and launch.overrides == ["hydra.launcher.n_jobs=1"]
    assert launch.gpu_groups == [] and launch.note is not None
    assert "one job at a time" in launch.note and SHARE_VAR in launch.note


def test_one_gpu_is_shared_when_asked():
    launch = plan_launch("joblib", 2, gpus_per_job=1, gpus=["0"], cpus=16, share=True)
    assert launch.n_jobs == 2 and launch.overrides == [] and launch.gpu_groups == []
    assert launch.note is not None and "share" in launch.note


def test_several_gpus_give_each_job_its_own():
    # n_jobs=-1 (joblib's default: as many as CPUs) with 4 GPUs and 2 per job: 2 at a time
    launch = plan_launch("joblib", -1, gpus_per_job=2, gpus=["0", "1", "2", "3"], cpus=16, share=False)
    assert launch.n_jobs == 2 and launch.overrides == ["hydra.launcher.n_jobs=2"]
    assert launch.gpu_groups == [["0", "1"], ["2", "3"]]
    enough = plan_launch("joblib", 2, gpus_per_job=1, gpus=["4", "6", "7"], cpus=16, share=False)
    assert enough.n_jobs == 2 and enough.overrides == [] and enough.note is None
    assert enough.gpu_groups == [["4"], ["6"]]  # the GPUs CUDA_VISIBLE_DEVICES left, by their names


def test_cpu_jobs_divide_the_cores():
    launch = plan_launch("joblib", 2, gpus_per_job=0, gpus=[], cpus=8, share=False)
    assert launch.n_jobs == 2 and launch.threads == 4 and launch.overrides == [] and launch.gpu_groups == []
    assert plan_launch("joblib", -1, gpus_per_job=0, gpus=[], cpus=2, share=False).threads == 1


def test_the_basic_launcher_is_left_alone():
    launch = plan_launch(None, None, gpus_per_job=1, gpus=["0"], cpus=16, share=False)
    assert launch.n_jobs == 1 and launch.overrides == [] and launch.note is None and launch.gpu_groups == []


def test_each_worker_claims_a_group_of_its_own(tmp_path):
    """Two workers take the two groups; a third finds none free and says so within its wait."""
    groups = [["0", "1"], ["2", "3"]]
    first, second, third = {}, {}, {}
    slots = [claim_gpus(groups, tmp_path, env=first), claim_gpus(groups, tmp_path, env=second)]
    try:
        assert first["CUDA_VISIBLE_DEVICES"] == "0,1" and second["CUDA_VISIBLE_DEVICES"] == "2,3"
        assert first[GPU_SLOT_VAR] == "0" and second[GPU_SLOT_VAR] == "1"
        again = claim_gpus(groups, tmp_path, env=first)  # a worker's later job keeps its group
        assert again is None and first["CUDA_VISIBLE_DEVICES"] == "0,1"
        with pytest.raises(TimeoutError, match="no group of GPUs"):
            claim_gpus(groups, tmp_path, env=third, wait_s=0.2)
    finally:
        for slot in slots:
            if slot is not None:
                os.close(slot)


def test_a_launcher_that_is_not_installed_says_what_to_install():
    from hydra.errors import MissingConfigException

    from lptrain.settings.preflight import one_line

    missing = MissingConfigException("not found", missing_cfg_file="hydra/launcher/joblib", options=["basic"])
    said = one_line(missing)
    assert said.startswith("hydra/launcher=joblib is not valid; valid choices: basic")
    assert "pip install 'lptrain[sweeps]'" in said
