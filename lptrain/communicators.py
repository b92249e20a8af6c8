"""The one factory: a communicator from a name, the devices and/or a process group.

>>> from lptrain.communicators import build_communicator
>>> comm = build_communicator("lp", ["cpu"] * 4, block_size="1M")   # one process, four devices
>>> comm.allreduce(tensors)                                          # tensors[i] on devices[i], summed in place

``devices`` alone: in this process, one tensor per device. ``process_group`` alone: across
the processes of the group, one tensor per process. Both: a hierarchy, the in-process
communicator over the devices inside and the distributed one over the group across.

It lives above ``lptrain.comm`` (which builds its own communicators, ``lptrain.comm.build``)
and ``lptrain.auto`` (which chooses among them), so that it can build every name,
``auto`` included, while neither of those imports anything above itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from lptrain.auto import AutoCommunicator
from lptrain.auto.probed import PROBE, probed_model
from lptrain.comm.build import (
    CONCRETE,
    DISTRIBUTED_OPTIONS,
    across_options,
    across_processes_options,
    build_across_processes,
    build_in_process,
    in_process_options,
    process_group_of,
    refuse_unknown,
    refuse_unknown_name,
)
from lptrain.comm.devices import parse_devices
from lptrain.comm.distributed import DEFAULT_TIMEOUT_S
from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError
from lptrain.comm.hierarchical import HierarchicalCommunicator
from lptrain.comm.nccl import nccl_available
from lptrain.comm.protocol import Communicator

NAMES = (*CONCRETE, "auto")
AUTO_OPTIONS = ("tuning", "topology")

__all__ = [
    "NAMES",
    "BackendUnavailableError",
    "CollectiveInputError",
    "Communicator",
    "available",
    "build_communicator",
    "options_of",
]


def options_of(name: str) -> list[str]:
    """The keyword options that communicator ``name`` accepts in one process."""
    return ["accumulate_fp32", *AUTO_OPTIONS] if name == "auto" else in_process_options(name)


def _options_across(name: str) -> list[str]:
    return across_options(AUTO_OPTIONS, schedule=False) if name == "auto" else across_processes_options(name)


def available() -> list[str]:
    """The communicator names that can run on this machine."""
    return [n for n in NAMES if n != "nccl" or nccl_available()]


def build_communicator(
    name: str,
    devices: Sequence[str | torch.device] | None = None,
    *,
    process_group: Any = None,
    **options: Any,
) -> Communicator:
    """Build communicator ``name`` (lp, mst, be, ring, nccl or auto).

    In one process: over ``devices``, a list such as ``["cpu"] * 4`` or ``["cuda:0",
    "cuda:1"]``, one tensor per device. Across processes: over ``process_group`` (for
    instance ``torch.distributed.group.WORLD`` under torchrun), one tensor per rank; there
    ``nccl`` means the backend's own collective, and ``timeout_s`` (default 300),
    ``check_desync`` (default True), ``segment_size`` (bytes per message, default "auto") and
    ``window`` (receives posted ahead, default 16) are accepted too. Both: this process's
    devices inside and the group across (``nccl`` inside a CPU process is ``ring``; a tuning
    file describes the processes, so only the part across them reads it). Options are
    algorithm-specific (``options_of(name)`` lists them); every communicator takes
    ``accumulate_fp32`` (default True: float16/bfloat16 sums accumulate in float32).
    """
    refuse_unknown_name(name, NAMES)
    if process_group is None and devices is None:
        raise CollectiveInputError("build_communicator needs devices=[...], process_group=... or both")
    if process_group is None:
        return _in_process(name, devices, options)
    if devices is None:
        return _across(name, process_group, options)
    return _hierarchical(name, devices, process_group, options)


def _in_process(name: str, devices: Sequence[str | torch.device], options: dict[str, Any]) -> Communicator:
    if name != "auto":
        return build_in_process(name, devices, **options)
    refuse_unknown(options, options_of(name), name)
    devices = parse_devices(devices)
    accumulate = options.get("accumulate_fp32", True)

    def build(algo: str, chosen: dict[str, Any]) -> Communicator:
        return build_in_process(algo, devices, accumulate_fp32=accumulate, **chosen)

    return AutoCommunicator(
        build,
        executor="in-process",
        device_type=devices[0].type,
        world_size=len(devices),
        tuning=options.get("tuning"),
        topology=options.get("topology"),
        devices=tuple(devices),
    )


def _across(name: str, group: Any, options: dict[str, Any]) -> Communicator:
    if name != "auto":
        return build_across_processes(name, group, **options)
    refuse_unknown(options, _options_across(name), f"distributed {name}")
    common = {k: v for k, v in options.items() if k not in AUTO_OPTIONS}
    group = process_group_of(group)
    held = weakref.ref(group)  # not the group itself: see DistributedCommunicator.__init__

    def build(algo: str, chosen: dict[str, Any]) -> Communicator:
        return build_across_processes(algo, held(), **{**common, **chosen})

    device_type = "cpu" if dist.get_backend(group) == "gloo" else "cuda"
    topology = options.get("topology")
    if topology == PROBE:  # every rank builds its communicator together: they measure together
        device = torch.device("cpu") if device_type == "cpu" else torch.device("cuda", torch.cuda.current_device())
        topology = probed_model(group, device, options.get("timeout_s", DEFAULT_TIMEOUT_S))
    return AutoCommunicator(
        build,
        executor="distributed",
        device_type=device_type,
        world_size=dist.get_world_size(group),
        tuning=options.get("tuning"),
        topology=topology,
        rank=dist.get_rank(group),
    )


def _hierarchical(
    name: str, devices: Sequence[str | torch.device], group: Any, options: dict[str, Any]
) -> HierarchicalCommunicator:
    """The devices inside this process, the group across the processes."""
    refuse_unknown(options, _options_across(name), f"distributed {name}")
    group = process_group_of(group)  # before anything is built inside
    devices = parse_devices(devices)
    # nccl inside a CPU process: there is no NCCL, and ring is the schedule nearest to it
    inside = "ring" if name == "nccl" and devices[0].type == "cpu" else name
    # the tuning file and the topology describe the processes; the executor's options are the processes' too
    local_options = {k: v for k, v in options.items() if k not in ("tuning", "topology", *DISTRIBUTED_OPTIONS)}
    local = _in_process(inside, devices, local_options)
    remote = _across(name, group, options)
    return HierarchicalCommunicator(local, remote)
