"""``trainer.devices`` and ``trainer.device_type`` to this process's list of devices."""

from __future__ import annotations

from lptrain.comm.devices import SpecSyntax, cuda_device_count, device_list
from lptrain.comm.errors import CollectiveInputError
from lptrain.settings.errors import ConfigError
from lptrain.train.launch import launched_by_torchrun, local_rank

TRAINER_SYNTAX = SpecSyntax(
    option="trainer.devices",
    count_hint="trainer.devices=4 trainer.device_type=cpu, or trainer.devices=cpu*4",
    list_hint="[cuda:0,cuda:2]",
)


def resolve_devices(spec: object, device_type: str = "auto") -> list[str]:
    """This process's devices. Under torchrun ``auto`` is this process's GPU
    (``cuda:LOCAL_RANK``), else one CPU replica per process; elsewhere see ``device_list``."""
    if str(spec) == "auto" and launched_by_torchrun():
        n = cuda_device_count()
        return [f"cuda:{local_rank() % n}"] if n else ["cpu"]
    try:
        return device_list(spec, str(device_type), TRAINER_SYNTAX)
    except CollectiveInputError as err:
        raise ConfigError(str(err)) from None
