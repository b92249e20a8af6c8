"""Building comm's own communicators: the schedules (lp, mst, be, ring) and nccl.

In one process over a list of devices (``build_in_process``), or across processes over a
``torch.distributed`` group (``build_across_processes``). The public factory,
``lptrain.communicators.build_communicator``, builds on these: it adds ``auto`` (which
lives above comm and sim) and joins the two as a hierarchy. Code inside comm and sim
that needs a communicator of its own (the simulator's calibration) uses these directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lptrain.comm.algorithms import (
    SCHEDULES,
    check_options,
    follows_sizing,
    issue_orders,
    message_rules,
    option_names,
    schedule_builders,
)
from lptrain.comm.algorithms.options import HOST, ONE_GPU, PCIE, Sizing
from lptrain.comm.communicator import DeviceCommunicator, ScheduleCommunicator
from lptrain.comm.cuda_graph import check_cuda_graph
from lptrain.comm.devices import parse_devices
from lptrain.comm.distributed import (
    DEFAULT_TIMEOUT_S,
    DistributedCommunicator,
    checked_timeout,
    link_rate,
    named_peer_failure,
    parse_segment_size,
    segment_bytes,
)
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.nccl import NcclCommunicator
from lptrain.comm.peer_kernel import check_reduce_kernel
from lptrain.comm.program import pipeline_block_bytes
from lptrain.comm.transport import LinkCost, link_of

CONCRETE = (*SCHEDULES, "nccl")  # the communicators comm builds itself
# Accepted across processes for schedules so that one configuration serves both executors,
# but only the in-process executor has them: across processes the backend moves the bytes.
IN_PROCESS_ONLY = ("reduce_kernel", "cuda_graph")
DISTRIBUTED_OPTIONS = ("timeout_s", "check_desync", "segment_size", "window")


def in_process_options(name: str) -> list[str]:
    """The keyword options communicator ``name`` accepts in one process."""
    return ["accumulate_fp32"] if name == "nccl" else ["accumulate_fp32", *option_names(name), *IN_PROCESS_ONLY]


def across_options(own: Sequence[str], schedule: bool) -> list[str]:
    """The options a communicator with options ``own`` accepts across processes."""
    return ["accumulate_fp32", *own, *DISTRIBUTED_OPTIONS, *(IN_PROCESS_ONLY if schedule else ())]


def across_processes_options(name: str) -> list[str]:
    """The keyword options communicator ``name`` accepts across processes."""
    schedule = name in SCHEDULES
    return across_options(option_names(name) if schedule else [], schedule)


def refuse_unknown(options: Mapping[str, Any], valid: Sequence[str], who: str) -> None:
    """One line naming the unknown options and the valid ones."""
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise CollectiveInputError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for {who}; valid options: {', '.join(valid)}"
        )


def refuse_unknown_name(name: str, valid: Sequence[str]) -> None:
    """One line naming an unknown communicator and the valid names."""
    if name not in valid:
        raise CollectiveInputError(f"unknown communicator {name!r}; valid names: {', '.join(valid)}")


def device_sizing(devices: Sequence[torch.device]) -> Sizing:
    """The link figures an in-process schedule sizes its blocks by: a memory copy for CPU
    devices, one GPU's own memory where every replica shares that GPU, else the paper's PCIe."""
    if devices[0].type == "cpu":
        return HOST
    return ONE_GPU if len(set(devices)) == 1 else PCIE


def build_in_process(name: str, devices: Sequence[str | torch.device], **options: Any) -> DeviceCommunicator:
    """Communicator ``name`` over ``devices`` in this process, one tensor per device."""
    refuse_unknown_name(name, CONCRETE)
    refuse_unknown(options, in_process_options(name), name)
    if name == "nccl":
        return NcclCommunicator(devices, **options)
    devices = parse_devices(devices)
    own = {k: options.pop(k) for k in option_names(name) if k in options}
    builders, settled = schedule_builders(name, len(devices), own, device_sizing(devices))
    return ScheduleCommunicator(name, devices, builders, options=settled, **options)


def process_group_of(group: Any) -> dist.ProcessGroup:
    """``group`` itself (``dist.group.WORLD`` as the default group), once torch.distributed is up."""
    if not dist.is_initialized():
        raise CollectiveInputError("torch.distributed is not initialised: call init_process_group() (or use torchrun)")
    return dist.distributed_c10d._get_default_group() if group is dist.group.WORLD else group


def sized_for_link(
    name: str, world_size: int, options: Mapping[str, Any], segment_size: int | str = "auto"
) -> tuple[str, ...]:
    """What of schedule ``name`` across processes follows the transport as measured: the
    segments with ``segment_size=auto``, the algorithm's blocks where its ``options`` size
    them per message (LP's ``block_size=auto``). Nothing: the link is not measured."""
    segments = ("segments",) if parse_segment_size(segment_size) is None else ()
    blocks = (f"{name.upper()}'s blocks",) if follows_sizing(name, check_options(name, world_size, options)) else ()
    return (*segments, *blocks)


def link_sizing(link: LinkCost | None, fixed_segment: int | None, world: int, on_cpu: bool) -> Sizing:
    """What automatic pieces across processes are sized by: the measured ``link`` (else the
    host's or PCIe's figures), floored at the executor's segment and, with
    ``segment_size=auto`` on a slow link, a chain's block as that link sets it."""
    figures = Sizing(link.alpha_s, link.beta_s_per_byte) if link is not None else HOST if on_cpu else PCIE
    # The executor runs each transfer as segments, each forwarded down the chain the moment it
    # is in: the segments already pipeline, so on a fast link a block below a segment only
    # adds messages, and each costs CPU the model's alpha (the fastest exchange) leaves out. On
    # 4 gloo processes sharing two cores LP's blocks floored at the segment took 36.7 ms for a
    # 16 MiB allreduce where the model's 1.8 MiB blocks took 41.9 (2-core machine, 2026-12-03).
    sizing = figures.floored(lambda nbytes: segment_bytes(fixed_segment, nbytes, world, link))
    if fixed_segment is not None:  # a fixed segment_size keeps a chain's blocks at least one segment
        return sizing
    return sizing.on_link(pipeline_block_bytes(link_rate(link)))


def build_across_processes(name: str, group: Any, **options: Any) -> DistributedCommunicator:
    """Communicator ``name`` over the ranks of ``group``, one tensor per rank; ``nccl`` here
    is the backend's own collective."""
    refuse_unknown_name(name, CONCRETE)
    refuse_unknown(options, across_processes_options(name), f"distributed {name}")
    common = {k: options.pop(k) for k in ("accumulate_fp32", *DISTRIBUTED_OPTIONS) if k in options}
    if "reduce_kernel" in options:
        check_reduce_kernel(options.pop("reduce_kernel"))
    if "cuda_graph" in options:
        check_cuda_graph(options.pop("cuda_graph"))
    group = process_group_of(group)
    if name == "nccl":
        return DistributedCommunicator(name, group, None, **common, issue_order={})
    world = dist.get_world_size(group)
    on_cpu = dist.get_backend(group) == "gloo"
    segment_size = common.get("segment_size", "auto")
    fixed = parse_segment_size(segment_size)
    sized = sized_for_link(name, world, options, segment_size)
    link = None
    if world > 1 and sized:
        # segment_size=auto and automatic blocks follow this transport, measured once per group
        device = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())
        bound = checked_timeout(common.get("timeout_s", DEFAULT_TIMEOUT_S))  # each wait of the measurement
        with named_peer_failure(f"rank {dist.get_rank(group)}: measuring the transport at start failed"):
            link = link_of(group, device, bound)
    sizing = link_sizing(link, fixed, world, on_cpu)
    builders, _ = schedule_builders(name, world, options, sizing)
    return DistributedCommunicator(
        name,
        group,
        builders,
        **common,
        link=link,
        sized_for_link=sized,
        issue_order=issue_orders(name, options),
        message_rule=message_rules(name),
    )
