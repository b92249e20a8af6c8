"""``RunConfig``: a checked configuration as typed values, with what follows from it worked out once.

Hydra composes a DictConfig; ``lptrain.settings.checks.check_config`` validates it and
returns this: the five groups as the schema's dataclasses (``lptrain.schema``) and the
values every part of a run would otherwise re-derive: this process's devices, the number
of processes and replicas, the batch per replica, and the sync strategy. The trainer, the
command line and the scripts take a ``RunConfig``; nothing below the command line reads a
DictConfig.

Python callers get one from ``lptrain.settings.locations.compose_config(overrides)``. Change
a run by composing it with other overrides: the derived values are not recomputed when a
field is edited afterwards.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from lptrain.schema import CommConfig, DataConfig, ModelConfig, OptimConfig, TrainerConfig
from lptrain.train.sync import SyncStrategy

GROUP_NAMES = ("comm", "model", "data", "optim", "trainer")


@dataclass(frozen=True)
class RunConfig:
    comm: CommConfig
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    trainer: TrainerConfig
    devices: tuple[torch.device, ...]  # this process's devices (trainer.devices, resolved under torchrun)
    processes: int  # processes of the job: torchrun's WORLD_SIZE, else 1
    per_device_batch: int  # images per replica per step (trainer.batch_per_device or a share of global_batch)
    sync: SyncStrategy  # trainer.sync as the strategy the step calls

    @property
    def replicas(self) -> int:
        """Replicas in all processes: the P of the collectives."""
        return len(self.devices) * self.processes

    @property
    def global_batch(self) -> int:
        return self.per_device_batch * self.replicas

    @property
    def local_batch(self) -> int:
        """This process's share of each step's batch."""
        return self.per_device_batch * len(self.devices)

    def groups(self) -> dict[str, Any]:
        """The five groups as plain data (what config.yaml, checkpoints and TensorBoard hold)."""
        groups = (self.comm, self.model, self.data, self.optim, self.trainer)
        return {name: asdict(group) for name, group in zip(GROUP_NAMES, groups)}
