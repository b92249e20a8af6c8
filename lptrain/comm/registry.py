"""Names to communicators: ``build_communicator`` and ``available``."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lptrain.comm.algorithms import MODULES, SCHEDULES, issue_orders, lp
from lptrain.comm.communicator import Communicator, ScheduleCommunicator, schedule_builders
from lptrain.comm.cuda_graph import check_cuda_graph
from lptrain.comm.devices import parse_devices
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.nccl import NcclCommunicator, nccl_available
from lptrain.comm.peer_kernel import check_reduce_kernel
from lptrain.comm.sizes import parse_size
from lptrain.comm.transport import LinkCost

# In-process CPU "links": ~10 us of dispatch per transfer, ~13 GB/s per copy (measured
# with lptrain-bench on the 2-core development machine; the current figures are in
# docs/BENCHMARKS.md, "In-process collectives against memcpy").
CPU_ALPHA_S = 10e-6
CPU_BETA_S_PER_BYTE = 1 / 13e9


def lp_builders(
    world_size: int,
    on_cpu: bool,
    block_size="auto",
    order=None,
    allreduce="overlapped",
    link: LinkCost | None = None,
    min_block: Callable[[int], int] | None = None,
):
    """LP's schedule builders for ``world_size`` ranks, and the options as resolved.

    The auto block size follows the cost model with figures for the links: ``link`` where
    the transport was measured (across processes, ``lptrain.comm.transport``), else PCIe
    for GPUs (the paper's) and a memory copy plus Python dispatch for CPU "devices".
    ``min_block(message_bytes)`` is a floor under the automatic block: across processes, the
    executor's segment (a smaller block only adds messages; see ``_distributed``).
    """
    chain = lp.check_order(order, world_size)
    if allreduce not in lp.ALLREDUCE_MODES:
        raise CollectiveInputError(
            f"unknown lp allreduce mode {allreduce!r}; valid modes: {', '.join(lp.ALLREDUCE_MODES)}"
        )
    fixed_bytes = None if block_size == "auto" else parse_size(block_size, "lp block_size")
    if fixed_bytes is not None and fixed_bytes < 1:
        raise CollectiveInputError(f"lp block_size must be at least 1 byte, got {block_size!r}")
    if link is not None:
        alpha, beta = link.alpha_s, link.beta_s_per_byte
    elif on_cpu:
        alpha, beta = CPU_ALPHA_S, CPU_BETA_S_PER_BYTE
    else:
        alpha, beta = lp.DEFAULT_ALPHA_S, lp.DEFAULT_BETA_S_PER_BYTE

    def block(op: str, p: int, n: int, itemsize: int) -> int:
        if fixed_bytes is not None:
            nbytes = fixed_bytes
        else:
            fill = lp.pipeline_fill(op, p, allreduce)
            nbytes = lp.optimal_block_bytes(n * itemsize, p, alpha, beta, fill)
            if min_block is not None:
                nbytes = max(nbytes, min_block(n * itemsize))
        return max(1, nbytes // itemsize)

    def bcast(p, n, root, isz):
        return lp.broadcast(p, n, root, block=block("broadcast", p, n, isz), order=chain)

    def red(p, n, root, isz):
        return lp.reduce(p, n, root, block=block("reduce", p, n, isz), order=chain)

    def allred(p, n, root, isz):
        return lp.allreduce(p, n, block=block("allreduce", p, n, isz), order=chain, mode=allreduce)

    builders = {"broadcast": bcast, "reduce": red, "allreduce": allred}
    return builders, {"block_size": block_size, "order": chain, "allreduce": allreduce}


def _lp(
    devices,
    *,
    accumulate_fp32=True,
    block_size="auto",
    order=None,
    allreduce="overlapped",
    reduce_kernel="auto",
    cuda_graph="auto",
) -> Communicator:
    """lp options: ``block_size`` in bytes (int, "4M", or "auto" for the cost-model optimum),
    ``order`` (the chain, a permutation of the ranks), ``allreduce`` ("overlapped" or
    "reduce_broadcast"), ``reduce_kernel`` (CUDA: "auto", "peer" or "staged"),
    ``cuda_graph`` (replicas sharing a GPU: "auto", "on" or "off")."""
    devices = parse_devices(devices)
    builders, options = lp_builders(len(devices), devices[0].type == "cpu", block_size, order, allreduce)
    return ScheduleCommunicator(
        "lp",
        devices,
        builders,
        accumulate_fp32=accumulate_fp32,
        options=options,
        reduce_kernel=reduce_kernel,
        cuda_graph=cuda_graph,
    )


def _fixed(module) -> Callable[..., Communicator]:
    def make(devices, *, accumulate_fp32=True, reduce_kernel="auto", cuda_graph="auto") -> Communicator:
        return ScheduleCommunicator(
            module.NAME,
            devices,
            schedule_builders(module),
            accumulate_fp32=accumulate_fp32,
            reduce_kernel=reduce_kernel,
            cuda_graph=cuda_graph,
        )

    make.__doc__ = f"{module.NAME}: reduce_kernel, cuda_graph (CUDA, one process) and accumulate_fp32."
    return make


def _nccl(devices, *, accumulate_fp32=True) -> Communicator:
    return NcclCommunicator(devices, accumulate_fp32=accumulate_fp32)


def _auto(devices, *, accumulate_fp32=True, tuning=None, topology=None):
    """auto options: ``tuning`` (a file from lptrain-bench --save-tuning; null: the simulator
    chooses), ``topology`` (the simulator's model where the file has no answer; default host
    for CPU devices, pcie for GPUs)."""
    from lptrain.comm.auto import AutoCommunicator

    devices = parse_devices(devices)

    def build(algo: str, options: dict[str, Any]) -> Communicator:
        return build_communicator(algo, devices, accumulate_fp32=accumulate_fp32, **options)

    return AutoCommunicator(
        build,
        executor="in-process",
        device_type=devices[0].type,
        world_size=len(devices),
        tuning=tuning,
        topology=topology,
        devices=tuple(devices),
    )


FACTORIES: dict[str, Callable[..., Communicator]] = {
    **{name: _lp if name == "lp" else _fixed(module) for name, module in MODULES.items()},
    "nccl": _nccl,
    "auto": _auto,
}
NAMES = tuple(FACTORIES)


def options_of(name: str) -> list[str]:
    """The keyword options that communicator ``name`` accepts."""
    params = inspect.signature(FACTORIES[name]).parameters
    return [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]


DISTRIBUTED_OPTIONS = ("timeout_s", "check_desync", "segment_size", "window")


def build_communicator(
    name: str, devices: Sequence[str | torch.device] | None = None, *, process_group=None, **options: Any
):
    """Build communicator ``name`` (one of lp, mst, be, ring, nccl).

    In one process: over ``devices``, a list such as ``["cpu"] * 4`` or ``["cuda:0",
    "cuda:1"]``, one tensor per device. Across processes: over ``process_group`` (for
    instance ``torch.distributed.group.WORLD`` under torchrun), one tensor per rank;
    there ``nccl`` means the backend's own collective, and ``timeout_s`` (default 300),
    ``check_desync`` (default True), ``segment_size`` (bytes per message, default "auto") and
    ``window`` (receives posted ahead, default 16) are accepted too. Options are algorithm-specific
    (``options_of(name)`` lists them); every communicator takes ``accumulate_fp32``
    (default True: float16/bfloat16 sums accumulate in float32).
    """
    if name not in FACTORIES:
        raise CollectiveInputError(f"unknown communicator {name!r}; valid names: {', '.join(NAMES)}")
    if process_group is not None:
        if devices is not None:
            raise CollectiveInputError("give devices (one process) or process_group (several), not both")
        return _distributed(name, process_group, options)
    if devices is None:
        raise CollectiveInputError("build_communicator needs devices=[...] or process_group=...")
    valid = options_of(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise CollectiveInputError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for {name}; valid options: {', '.join(valid)}"
        )
    return FACTORIES[name](devices, **options)


def _distributed(name: str, group, options: dict[str, Any]):
    import torch.distributed as dist

    from lptrain.comm.distributed import DistributedCommunicator, parse_segment_size, segment_bytes

    schedule = name in SCHEDULES
    in_process_only = ("reduce_kernel", "cuda_graph")
    own = (
        [o for o in options_of(name) if o not in ("accumulate_fp32", *in_process_only)]
        if name in ("lp", "auto")
        else []
    )
    # reduce_kernel and cuda_graph are accepted so that one configuration serves both
    # executors, but only the in-process one has them: across processes the backend moves the bytes.
    valid = ["accumulate_fp32", *own, *DISTRIBUTED_OPTIONS, *(in_process_only if schedule else ())]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise CollectiveInputError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for distributed {name}; valid options: "
            f"{', '.join(valid)}"
        )
    common = {k: options.pop(k) for k in ("accumulate_fp32", *DISTRIBUTED_OPTIONS) if k in options}
    if "reduce_kernel" in options:
        check_reduce_kernel(options.pop("reduce_kernel"))
    if "cuda_graph" in options:
        check_cuda_graph(options.pop("cuda_graph"))
    if not dist.is_initialized():
        raise CollectiveInputError("torch.distributed is not initialised: call init_process_group() (or use torchrun)")
    if group is dist.group.WORLD:
        group = dist.distributed_c10d._get_default_group()
    world = dist.get_world_size(group)
    on_cpu = dist.get_backend(group) == "gloo"
    if name == "auto":
        from lptrain.comm.auto import AutoCommunicator

        held = weakref.ref(group)  # not the group itself: see DistributedCommunicator.__init__
        return AutoCommunicator(
            lambda algo, chosen: _distributed(algo, held(), {**common, **chosen}),
            executor="distributed",
            device_type="cpu" if on_cpu else "cuda",
            world_size=world,
            tuning=options.get("tuning"),
            topology=options.get("topology"),
            rank=dist.get_rank(group),
        )
    link = None
    fixed = parse_segment_size(common.get("segment_size", "auto"))
    lp_auto = name == "lp" and options.get("block_size", "auto") == "auto"
    if name != "nccl" and world > 1 and (fixed is None or lp_auto):
        # segment_size=auto and LP's automatic blocks follow this transport, measured once per group
        from lptrain.comm.transport import link_of

        link = link_of(group, torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device()))
    if name == "nccl":
        builders = None
    elif name == "lp":
        # The executor runs each transfer as segments, each forwarded down the chain the moment
        # it is in: the segments already pipeline, so a block below a segment only adds
        # messages, and each costs CPU the model's alpha (the fastest exchange) leaves out. On
        # 4 gloo processes sharing two cores blocks floored at the segment took 36.7 ms for a
        # 16 MiB allreduce where the model's 1.8 MiB blocks took 41.9 (2-core machine, 2026-12-03).
        builders, _ = lp_builders(
            world, on_cpu, **options, link=link, min_block=lambda nbytes: segment_bytes(fixed, nbytes, world, link)
        )
    else:
        builders = schedule_builders(MODULES[name])
    order = issue_orders(name) if builders else {}
    return DistributedCommunicator(name, group, builders, **common, link=link, issue_order=order)


def available() -> list[str]:
    """The communicator names that can run on this machine."""
    return [n for n in NAMES if n != "nccl" or nccl_available()]
