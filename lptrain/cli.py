"""The ``lptrain`` command: a Hydra app around the BSP-SGD trainer.

lptrain                                   # the default: small CNN, embedded MNIST, lp on cpu:4
lptrain +recipe=alexnet comm=mst trainer.devices=8
lptrain -m +recipe=alexnet comm=lp,mst,be  # a sweep; then lptrain-report multirun/...
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from lptrain.comm import BackendUnavailableError, CollectiveInputError
from lptrain.data import DataError
from lptrain.models import parameter_count
from lptrain.train.checkpoint import CheckpointError
from lptrain.train.launch import finish
from lptrain.train.trainer import ConfigError, Trainer

USER_ERRORS = (ConfigError, CollectiveInputError, BackendUnavailableError, DataError, CheckpointError, ValueError)


def run(cfg: DictConfig, run_dir: Path) -> float | None:
    """Train as configured; print the summary; return the final evaluation accuracy."""
    trainer = Trainer(cfg, run_dir)
    params = parameter_count(trainer.replicas.models[0])
    if not trainer.is_main:  # another process of a torchrun job: rank 0 reports
        trainer.fit()
        finish()
        return None
    where = f", {trainer.nprocs} processes" if trainer.nprocs > 1 else ""
    print(
        f"lptrain: {cfg.model.name} ({params / 1e6:.2f}M parameters, {trainer.bytes_per_step / 2**20:.1f} MiB "
        f"communicated per step) on {cfg.data.name}, {cfg.comm.name} over {len(trainer.devices)} x "
        f"{trainer.devices[0].type}{where}, global batch {trainer.global_batch}, {trainer.steps} steps\n"
        f"lptrain: logs in {run_dir} (tensorboard --logdir {run_dir})",
        flush=True,
    )
    summary = trainer.fit()
    print(summary.render(cfg, params), flush=True)
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=1))
    finish()
    return summary.eval_accuracy


@hydra.main(version_base=None, config_path="configs", config_name="config")
def _app(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        return run(cfg, run_dir)
    except USER_ERRORS as err:
        print(f"lptrain: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def main() -> None:
    _app()


if __name__ == "__main__":
    main()
