"""The ``lptrain`` command: a Hydra app around the BSP-SGD trainer.

lptrain                                   # the default: small CNN, embedded MNIST, lp on 4 CPU replicas
lptrain +recipe=alexnet comm=mst trainer.devices=8
lptrain -m +recipe=alexnet comm=lp,mst,be  # a sweep; then lptrain-report multirun/...

Before Hydra runs anything, every job of the command line is composed and checked
(``lptrain.settings.preflight``): a bad value is one line on stderr and exit code 2, with
no folder made. A run then writes only into a folder that holds no other run (or the one
``trainer.resume`` continues). Exit codes: 0 done, 2 bad configuration or input, 130
interrupted (Ctrl-C; 143 for SIGTERM), after the checkpoint was saved.
"""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_USAGE = 2
RUN_FILES = ("metrics.jsonl", "steps.jsonl", "summary.json", "config.yaml", "checkpoints", "tb")


def _user_errors() -> tuple[type[BaseException], ...]:
    from lptrain.comm import BackendUnavailableError, CollectiveInputError
    from lptrain.data import DataError
    from lptrain.settings.errors import ConfigError
    from lptrain.train.checkpoint import CheckpointError

    return (ConfigError, CollectiveInputError, BackendUnavailableError, DataError, CheckpointError, ValueError)


def _fail(message: str) -> None:
    print(f"lptrain: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


def existing_run(run_dir: Path) -> list[str]:
    """What of another run ``run_dir`` holds (empty when it holds none)."""
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def continues(run_dir: Path, resume: str | None) -> bool:
    """Whether ``trainer.resume`` points into ``run_dir`` (then the run continues there)."""
    if not resume:
        return False
    target = Path(resume).expanduser().resolve()
    return target == run_dir.resolve() or run_dir.resolve() in target.parents


def write_run_config(cfg, run_dir: Path, overrides: list[str]) -> None:
    """config.yaml (resolved) and overrides.yaml, at the start: what the report labels runs by."""
    from omegaconf import OmegaConf

    if not (run_dir / "config.yaml").exists():
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        (run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))


def run(cfg, run_dir: Path, overrides: list[str] | None = None) -> float | None:
    """Train as configured; print the summary; return the final evaluation accuracy."""
    import json
    from dataclasses import asdict

    from lptrain.models import parameter_count
    from lptrain.train.launch import finish
    from lptrain.train.trainer import Trainer

    held = existing_run(run_dir)
    if held and not continues(run_dir, cfg.trainer.resume):
        _fail(
            f"{run_dir} already holds a run ({', '.join(held)}); nothing was changed. Choose another "
            f"hydra.run.dir, or continue that run with trainer.resume={run_dir}"
        )
    trainer = Trainer(cfg, run_dir)  # every check that needs the data, the devices or the checkpoint
    if trainer.start_step >= trainer.stop_at:
        if trainer.is_main:
            print(
                f"lptrain: the run in {cfg.trainer.resume} already finished step {trainer.start_step} of "
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
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(cfg, run_dir, overrides or [])
    where = f", {trainer.nprocs} processes" if trainer.nprocs > 1 else ""
    print(
        f"lptrain: {cfg.model.name} ({params / 1e6:.2f}M parameters, {trainer.bytes_per_step / 2**20:.1f} MiB "
        f"communicated per step) on {cfg.data.name}, {cfg.comm.name} over {len(trainer.devices)} x "
        f"{trainer.devices[0].type}{where}, global batch {trainer.global_batch}, {trainer.steps} steps\n"
        f"lptrain: {trainer.describe_buckets()}\n"
        f"lptrain: logs in {run_dir} (tensorboard --logdir {run_dir})",
        flush=True,
    )
    summary = trainer.fit()
    print(summary.render(cfg, params), flush=True)
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=1))
    finish()
    if summary.interrupted_by:
        sys.exit(128 + summary.interrupted_by)
    return summary.eval_accuracy


def _task(cfg) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        return run(cfg, run_dir, list(hydra_cfg.overrides.task))
    except _user_errors() as err:
        _fail(str(err))
    finally:
        if run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # Hydra made it for a run that never started: leave nothing behind


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        from lptrain.settings.cli_help import render_help

        print(render_help())
        return
    from lptrain.settings.preflight import preflight

    try:
        preflight(args)
    except _user_errors() as err:  # ConfigError among them
        _fail(str(err))
    import hydra

    from lptrain.settings.locations import configs_dir, register_all

    register_all()
    app = hydra.main(version_base=None, config_path=str(configs_dir()), config_name="config")(_task)
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        app()
    except KeyboardInterrupt:  # a second Ctrl-C: stopped without saving
        print("\nlptrain: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
