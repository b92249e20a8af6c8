"""``trainer.devices`` and ``trainer.device_type`` to this process's list of devices."""

from __future__ import annotations

from lptrain.comm.devices import SpecSyntax, cuda_device_count, device_list, is_count
from lptrain.comm.errors import CollectiveInputError
from lptrain.errors import ConfigError
from lptrain.train.launch import launched_by_torchrun, local_rank, local_world_size

TRAINER_SYNTAX = SpecSyntax(
    option="trainer.devices",
    count_hint="trainer.devices=4 trainer.device_type=cpu, or trainer.devices=cpu*4",
    list_hint="[cuda:0,cuda:2]",
)


def resolve_devices(spec: object, device_type: str = "auto") -> list[str]:
    """This process's devices. Under torchrun ``auto`` is this process's GPU
    (``cuda:LOCAL_RANK``), else one CPU replica per process, and other GPU specs are shared
    out between the node's processes (``share_of_node``); elsewhere see ``device_list``."""
    if str(spec) == "auto" and launched_by_torchrun():
        n = cuda_device_count()
        return [f"cuda:{local_rank() % n}"] if n else ["cpu"]
    try:
        names = device_list(spec, str(device_type), TRAINER_SYNTAX)
    except CollectiveInputError as err:
        raise ConfigError(str(err)) from None
    if not launched_by_torchrun():
        return names
    return share_of_node(names, is_count(spec), local_rank(), local_world_size(), cuda_device_count(), spec)


def share_of_node(
    names: list[str], counted: bool, rank: int, processes: int, gpus: int, spec: object = None
) -> list[str]:
    """The GPUs of process ``rank`` of the ``processes`` that torchrun started on this node.

    Every process reads the same command line, so without this they would all take the
    same GPUs (and NCCL refuses two ranks on one GPU). A count (``trainer.devices=2
    trainer.device_type=cuda``) is per process: process k takes the next N GPUs,
    ``cuda:kN`` to ``cuda:kN+N-1``. A list (``[cuda:0,cuda:1,cuda:2,cuda:3]``, or ``cuda``
    for all) names the node's GPUs, dealt out in order, an equal share each. CPU
    replicas are not shared out: each process has its own.
    """
    if processes <= 1 or not names or not names[0].startswith("cuda"):
        return names
    shown = names if spec is None else spec
    if counted:
        n = len(names)
        if n * processes > gpus:
            raise ConfigError(
                f"trainer.devices={shown} asks for {n} GPU(s) per process, {n * processes} for the {processes} "
                f"processes on this node, but it has {gpus}; ask for at most {max(gpus // processes, 0)} per process"
            )
        return [f"cuda:{rank * n + i}" for i in range(n)]
    if len(names) % processes:
        raise ConfigError(
            f"trainer.devices={shown} lists {len(names)} GPU(s) for the {processes} processes on this node: "
            f"give a multiple of {processes} (an equal share each), or trainer.devices=auto for one GPU each"
        )
    share = len(names) // processes
    return names[rank * share : (rank + 1) * share]
