"""The ``lptrain`` command: a Hydra app around the BSP-SGD trainer.

lptrain                                   # the default: small CNN, embedded MNIST, lp on 4 CPU replicas
lptrain +recipe=alexnet comm=mst trainer.devices=8
lptrain -m +recipe=alexnet comm=lp,mst,be  # a sweep; then lptrain-report multirun/...
lptrain -m hydra/launcher=joblib hydra.launcher.n_jobs=2 comm=lp,ring  # two jobs at a time

Before Hydra runs anything, every job of the command line is composed and checked
(``lptrain.settings.preflight``): a bad value is one line on stderr and exit code 2, with
no folder made. A run then writes only into a folder that holds no other run (or the one
``trainer.resume`` continues), claimed atomically (``lptrain.settings.rundirs``). Every
failure ends in one line and the exit code of ``lptrain.exits``; a sweep runs every job,
reports each failed one in a line, and exits with the first failure's code at the end; a
launcher's workers (joblib) report through each job's ``failed.json``, which this process
reads once they are done, and share the devices as ``lptrain.settings.launchers`` decides.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lptrain.exits import (
    EXIT_BUG,
    EXIT_DIVERGED,
    EXIT_PEER_FAILED,
    EXIT_USAGE,
    EXIT_WRITE_FAILED,
    end_if_reader_gone,
    quiet_on_closed_pipe,
)
from lptrain.settings.outcomes import FAILED_FILE  # a failed run's one line and exit code

if TYPE_CHECKING:
    from lptrain.train.run_config import RunConfig

RUN_FILES = ("metrics.jsonl", "steps.jsonl", "summary.json", "config.yaml", "checkpoints", "tb")
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM)


def _user_errors() -> tuple[type[BaseException], ...]:
    from lptrain.comm import BackendUnavailableError, CollectiveInputError
    from lptrain.data import DataError
    from lptrain.errors import ConfigError
    from lptrain.settings.rundirs import FolderTaken
    from lptrain.train.checkpoint import CheckpointError

    return (
        ConfigError,
        CollectiveInputError,
        BackendUnavailableError,
        DataError,
        CheckpointError,
        FolderTaken,
        ValueError,
    )


def _say(message: str) -> None:
    """One line on stderr, written whole: under torchrun stderr is unbuffered, and a line
    printed as its text and then its newline can have another rank's line land between."""
    sys.stderr.write(f"lptrain: error: {message}\n")
    sys.stderr.flush()


def _fail(message: str) -> None:
    _say(message)
    sys.exit(EXIT_USAGE)


@dataclass
class Outcome:
    """What the jobs of this command line came to: the run folders, and each failed job."""

    jobs: int = 1
    failed: list[tuple[str, int]] = field(default_factory=list)  # (job's label, exit code)
    dirs: object = None  # lptrain.settings.rundirs.RunDirs
    checked: dict[tuple[str, ...], object] = field(default_factory=dict)  # job's overrides -> its RunConfig
    reported: set[int] = field(default_factory=set)  # the numbers of the failed jobs said so far


OUTCOME = Outcome()


@dataclass
class SweepTask:
    """What Hydra calls for each job: ``_task`` with what the launching process decided.

    A launcher that runs jobs in other processes (joblib's loky workers) pickles the task
    and its fields, while ``OUTCOME`` stays behind in the launching process: so the run
    folders lptrain made (which job folders it may write ``failed.json`` into, or remove)
    and the sharing of the devices travel with the task, and a job in another process
    reports its outcome through its folder's ``failed.json``, which the launching process
    reads at the end (``lptrain.settings.outcomes``)."""

    dirs: object = None  # lptrain.settings.rundirs.RunDirs
    launch: object = None  # lptrain.settings.launchers.Launch
    home: int = field(default_factory=os.getpid)  # the launching process

    def __call__(self, cfg) -> float | None:  # Hydra names the job after the task's module: cli
        if self.elsewhere:
            self._enter_worker()
        return _task(cfg, self)

    @property
    def elsewhere(self) -> bool:
        """Whether this job runs in a process other than the launching one."""
        return os.getpid() != self.home

    def _enter_worker(self) -> None:
        """A worker's first step: the group of GPUs it may use, before CUDA starts."""
        launch = self.launch
        if launch is not None and launch.gpu_groups and launch.lock_dir is not None:
            from lptrain.settings.launchers import claim_gpus

            fd = claim_gpus(launch.gpu_groups, launch.lock_dir)
            if fd is not None:
                _WORKER_LOCKS.append(fd)


_WORKER_LOCKS: list[int] = []  # a worker's hold on its group of GPUs, for the process's life


def classify(err: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for an error the failure policy covers, None for a bug."""
    from lptrain.train.checkpoint import CheckpointWriteError
    from lptrain.train.memory import allocation_failure
    from lptrain.train.numerics import NumericsError

    if isinstance(err, CheckpointWriteError):
        return EXIT_WRITE_FAILED, str(err)
    if isinstance(err, NumericsError):
        return EXIT_DIVERGED, str(err)
    oom = allocation_failure(err)
    if oom is not None:  # the batch (or the model) does not fit where it runs
        return EXIT_USAGE, f"{oom}; lower trainer.batch_per_device (or the model's or the images' size)"
    if isinstance(err, _user_errors()):
        return EXIT_USAGE, str(err)
    if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
        where = f" {err.filename}" if err.filename else ""
        return EXIT_WRITE_FAILED, f"cannot write{where}: {err.strerror}"
    return None


def _ignore_interrupts() -> None:
    """While the process leaves, a further Ctrl-C would only interrupt the interpreter's own
    clean-up (a traceback from an exit handler after the one line)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def peer_failed(err: BaseException, run_dir: Path | None = None) -> None:
    """A collective across processes failed: one line, exit code 3, at once (``failed.json``
    in ``run_dir`` first, where this process holds it). Leaving the process group (or
    letting the interpreter tear it down) would wait on the peer that is gone, so the
    process ends here, its output flushed."""
    from lptrain.comm import liveness

    message = " ".join(str(err).split())
    _say(message)
    if run_dir is not None:
        _record_failure(run_dir, message, EXIT_PEER_FAILED, keep=False)
    sys.stdout.flush()
    liveness.stop()
    os._exit(EXIT_PEER_FAILED)


def existing_run(run_dir: Path) -> list[str]:
    """What of another run ``run_dir`` holds (empty when it holds none)."""
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def continues(run_dir: Path, resume: str | None) -> bool:
    """Whether ``trainer.resume`` points into ``run_dir`` (then the run continues there)."""
    if not resume:
        return False
    target = Path(resume).expanduser().resolve()
    return target == run_dir.resolve() or run_dir.resolve() in target.parents


def _config_text(config: RunConfig) -> str:
    """config.yaml's text: the run's groups, every value resolved."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(config.groups()))


def write_run_config(config: RunConfig, run_dir: Path, overrides: list[str]) -> None:
    """config.yaml (resolved; written when the folder was claimed) and overrides.yaml, at the
    start: what the report labels runs by."""
    from omegaconf import OmegaConf

    from lptrain.settings.rundirs import write_atomically

    if not (run_dir / "config.yaml").exists():
        write_atomically(run_dir / "config.yaml", _config_text(config))
    if not (run_dir / "overrides.yaml").exists():
        write_atomically(run_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(overrides))))


def run(config: RunConfig, run_dir: Path, overrides: list[str] | None = None) -> float | None:
    """Train as ``config`` (checked: ``compose_config`` or the preflight) says; print the
    summary; return the final evaluation accuracy."""
    import json
    from dataclasses import asdict

    from lptrain.models import parameter_count
    from lptrain.settings.rundirs import FolderTaken, hold, write_atomically
    from lptrain.train.launch import finish
    from lptrain.train.trainer import Trainer

    held = existing_run(run_dir)
    continuing = continues(run_dir, config.trainer.resume)
    taken = f"; nothing was changed. Choose another hydra.run.dir, or continue that run with trainer.resume={run_dir}"
    if held and not continuing:
        raise FolderTaken(f"{run_dir} already holds a run ({', '.join(held)}){taken}")
    trainer = Trainer(config, run_dir)  # every check that needs the data, the devices or the checkpoint
    if trainer.start_step >= trainer.stop_at:
        if trainer.is_main:
            print(
                f"lptrain: the run in {config.trainer.resume} already finished step {trainer.start_step} of "
                f"{trainer.stop_at}: nothing to do (to train longer, raise trainer.steps)",
                flush=True,
            )
        finish()
        return None
    params = parameter_count(trainer.replicas.models[0])
    if not trainer.is_main:  # another process of a torchrun job: rank 0 reports
        trainer.fit()
        finish()
        return None
    try:
        hold(run_dir, continuing, _config_text(config))  # atomically: of two runs racing for it, one gets it
    except FolderTaken as err:
        raise FolderTaken(f"{err}{taken}") from None
    write_run_config(config, run_dir, overrides or [])
    where = f", {trainer.nprocs} processes" if trainer.nprocs > 1 else ""
    print(
        f"lptrain: {config.model.name} ({params / 1e6:.2f}M parameters, {trainer.bytes_per_step / 2**20:.1f} MiB "
        f"communicated per step) on {config.data.name}, {config.comm.name} over {len(trainer.devices)} x "
        f"{trainer.devices[0].type}{where}, global batch {trainer.global_batch}, {trainer.steps} steps\n"
        f"lptrain: {trainer.describe_buckets()}\n"
        f"lptrain: logs in {run_dir} (tensorboard --logdir {run_dir})",
        flush=True,
    )
    summary = trainer.fit()
    print(summary.render(config, params), flush=True)
    write_atomically(run_dir / "summary.json", json.dumps(asdict(summary), indent=1))
    (run_dir / FAILED_FILE).unlink(missing_ok=True)  # an earlier failure of the run this one continued
    finish()
    if summary.interrupted_by:
        _ignore_interrupts()  # saved and leaving: a late Ctrl-C has nothing left to abort
        sys.exit(128 + summary.interrupted_by)
    return summary.eval_accuracy


def _checked(cfg, overrides: list[str]) -> RunConfig:
    """This job's RunConfig: the one the preflight checked, or (when a Hydra flag made the
    preflight stand aside) the configuration Hydra composed, checked now."""
    from lptrain.settings.checks import check_config

    config = OUTCOME.checked.get(tuple(overrides))
    return config if config is not None else check_config(cfg)


def _task(cfg, task: SweepTask | None = None) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from lptrain.comm.distributed import CollectiveError

    task = task or SweepTask(dirs=OUTCOME.dirs)
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = list(hydra_cfg.overrides.task)
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    config = None
    try:
        config = _checked(cfg, overrides)
        return run(config, run_dir, overrides)
    except CollectiveError as err:
        peer_failed(err, run_dir)
    except BrokenPipeError as err:  # `lptrain | head`: ends quietly (a SystemExit passes through Hydra)
        end_if_reader_gone(err)
        raise
    except Exception as err:
        said = classify(err)
        if said is None:  # a bug: Hydra prints the traceback; the report reads its last line
            bug = " ".join(f"{type(err).__name__}: {err}".split())
            _record_failure(run_dir, bug, EXIT_BUG, keep=sweep, dirs=task.dirs)
            raise
        code, message = said
        if not sweep:
            _say(message)
            _record_failure(run_dir, message, code, keep=False)
            sys.exit(code)
        num = int(hydra_cfg.job.num)
        label = f"job {num} ({' '.join(overrides) or 'no overrides'})"
        _record_failure(run_dir, message, code, keep=True, dirs=task.dirs, job=(num, label))
        if config is not None and (run_dir / FAILED_FILE).exists():  # what the report labels the job by
            with contextlib.suppress(OSError):
                write_run_config(config, run_dir, overrides)
        if not task.elsewhere:  # a job in a worker: the launching process reads its failed.json
            _say(f"{label}: {message}")
            OUTCOME.failed.append((label, code))
            OUTCOME.reported.add(num)
        return None
    finally:
        from lptrain.settings.rundirs import release

        release(run_dir)
        if task.dirs is not None:
            task.dirs.remove_if_empty(run_dir)  # a run that never started: leave nothing it made


def _record_failure(
    run_dir: Path, message: str, code: int, keep: bool, dirs=None, job: tuple[int, str] | None = None
) -> None:
    """``failed.json`` in the folder this run claimed (or, in a sweep, any job's folder
    lptrain made, as ``dirs`` records them; never in another run's), so that lptrain-report
    marks the run and the launching process of a parallel sweep learns of it (``job``: its
    number and label); written whole or not at all, and never raises."""
    from lptrain.settings.rundirs import holds, write_atomically

    said: dict[str, object] = {"error": message, "exit_code": code}
    if job is not None:
        said["job_num"], said["job"] = job
    try:
        mine = dirs is not None and dirs.ours(run_dir)
        if run_dir.is_dir() and (holds(run_dir) or (keep and mine)):
            write_atomically(run_dir / FAILED_FILE, json.dumps(said) + "\n")
    except OSError:  # a full disk: no failed.json, rather than an empty one
        pass


def _printed_by_hydra(app) -> None:
    """Run ``app`` for what Hydra itself prints (``--cfg job``, ``--info``), its stdout held
    and written here: Hydra would report a failure of its own print (a closed pipe, as
    ``| head`` leaves) as an error with a traceback, where lptrain ends quietly."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            app()
    finally:
        sys.stdout.write(held.getvalue())


@quiet_on_closed_pipe  # `lptrain --help | head`: the reader has what it wanted
def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        from lptrain.settings.cli_help import render_help

        print(render_help(), flush=True)
        return
    from lptrain.settings.preflight import preflight, print_sweep, shows_config, sweep_shown, task_overrides

    try:
        checked = preflight(args)
    except _user_errors() as err:  # ConfigError among them
        _fail(str(err))
    if sweep_shown(args):  # -m ... --cfg job: every job checked above; Hydra would refuse
        print_sweep(checked)
        return
    jobs = 0 if shows_config(args) else len(checked)  # --cfg: checked, printed by Hydra, not run
    import hydra

    from lptrain.settings.locations import configs_dir, register_all
    from lptrain.settings.rundirs import plan

    register_all()
    OUTCOME.jobs, OUTCOME.failed, OUTCOME.reported = max(jobs, 1), [], set()
    OUTCOME.checked = {task_overrides(job.overrides): job.config for job in checked}
    launch = None
    if jobs:  # a job will run (not --cfg, --info ...): its folder, claimed now
        try:
            OUTCOME.dirs = plan(args)
        except OSError as err:  # the run folder cannot be made: a read-only mount, a full disk
            said = classify(err)
            if said is None:
                raise
            _say(said[1])
            sys.exit(said[0])
        launch, args = _shared_devices(args, checked)
        args = [*args, *OUTCOME.dirs.overrides]
    task = SweepTask(dirs=OUTCOME.dirs, launch=launch)
    app = hydra.main(version_base=None, config_path=str(configs_dir()), config_name="config")(task)
    sys.argv = [sys.argv[0], *args]
    try:
        app() if jobs else _printed_by_hydra(app)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped without saving
        _ignore_interrupts()
        print("\nlptrain: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        if launch is not None and launch.lock_dir is not None:
            import shutil

            shutil.rmtree(launch.lock_dir, ignore_errors=True)  # the workers' GPU locks: lptrain's own
    if jobs and any(a in ("-m", "--multirun") for a in args):
        _failed_elsewhere(args)
    if OUTCOME.failed:
        names = ", ".join(label.split(" (")[0] for label, _ in OUTCOME.failed)
        _say(f"{len(OUTCOME.failed)} of {OUTCOME.jobs} jobs failed ({names}); the others ran")
        sys.exit(OUTCOME.failed[0][1])


def _shared_devices(args: list[str], checked) -> tuple[object, list[str]]:
    """How a parallel launcher's jobs share the devices (``lptrain.settings.launchers``): the
    command line as Hydra gets it, and a line when lptrain decided something."""
    import tempfile

    from lptrain.settings.launchers import sweep_launch

    launch, args = sweep_launch(args, [job.config.devices for job in checked])
    if launch.note:
        print(launch.note, flush=True)
    if launch.gpu_groups:
        launch.lock_dir = Path(tempfile.mkdtemp(prefix="lptrain-gpus-"))
    return launch, args


def _failed_elsewhere(args: list[str]) -> None:
    """Each job that failed in another process (a launcher's worker), from its folder's
    failed.json: its line, in job order, and its place in the count."""
    from lptrain.settings.launchers import given
    from lptrain.settings.outcomes import failed_jobs

    sweep_dir = given(args, "hydra.sweep.dir")
    if sweep_dir is None or "${" in sweep_dir or OUTCOME.dirs is None:
        return  # named by an interpolation that Hydra resolved: jobs elsewhere report in their folders
    for job in failed_jobs(Path(sweep_dir), OUTCOME.dirs.ours, OUTCOME.reported):
        _say(f"{job.label}: {job.message}")
        OUTCOME.failed.append((job.label, job.code))
        OUTCOME.reported.add(job.num)


if __name__ == "__main__":
    main()
