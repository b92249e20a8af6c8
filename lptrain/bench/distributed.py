"""``lptrain-bench`` under torchrun: the schedules over torch.distributed against the
backend's own collective (gloo's or NCCL's native algorithm), in one run.

    torchrun --nproc-per-node 4 -m lptrain.bench --op allreduce -b 1M -e 256M
    mpirun -np 4 lptrain-bench --algo lp,mst,be,ring,nccl,mpi    # adds Open MPI's own, via mpi4py

One tensor per process (CPU with gloo, ``cuda:LOCAL_RANK`` with NCCL). A row's time is
the slowest rank's, the median of round-robin trials; ``#wrong`` sums every rank's check.
The native collective appears as ``gloo`` or ``nccl``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from lptrain.auto import AutoCommunicator
from lptrain.bench.table import Row, print_header, print_row
from lptrain.bench.variants import DTYPES, algo_variants, parse_algos, pattern
from lptrain.comm.algorithms import WITH_VARIANTS
from lptrain.comm.measure import OPS, bus_factor, collective_call
from lptrain.comm.sizes import message_sizes
from lptrain.communicators import NAMES, Communicator, build_communicator
from lptrain.train.launch import (
    barrier_across,
    bound_collectives,
    join_default_group,
    local_rank,
    max_across,
    sum_across,
)

SCHEDULES = (*WITH_VARIANTS, "auto")  # what runs as lptrain's schedules across processes
BACKENDS_OWN = ("native", "gloo", "nccl")  # each names the backend's own collective (one row)


def wanted_algorithms(text: str) -> list[str]:
    """``--algo`` across processes: lptrain's names, and the backend's own by any of its names."""
    return parse_algos(text, extra=tuple(a for a in BACKENDS_OWN if a not in NAMES))


def launched_by_mpirun() -> bool:
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))) > 1


def _join_from_mpirun() -> None:
    """Under mpirun, torch.distributed learns rank and size from Open MPI's environment."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
    size = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", rank)
    for key, value in (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", local)):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")


class MpiCollectives:
    """Open MPI's own MPI_Allreduce, MPI_Reduce and MPI_Bcast through mpi4py (CPU tensors)."""

    link = None  # nothing of it is sized for a measured transport

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.comm.Allreduce(self.MPI.IN_PLACE, tensor.numpy())

    def reduce(self, tensor: torch.Tensor, root: int = 0) -> None:
        buf = tensor.numpy()
        if self.comm.Get_rank() == root:
            self.comm.Reduce(self.MPI.IN_PLACE, buf, root=root)
        else:
            self.comm.Reduce(buf.copy(), None, root=root)

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        self.comm.Bcast(tensor.numpy(), root=root)


def _build(algo: str, args: argparse.Namespace):
    if algo == "mpi":
        return MpiCollectives()
    if algo == "native":
        return build_communicator("nccl", process_group=dist.group.WORLD, timeout_s=args.timeout, check_desync=False)
    name, options = args.variants[algo]
    options = dict(options)
    if args.segment_size is not None:
        options["segment_size"] = args.segment_size
    if args.window is not None:
        options["window"] = args.window
    group = dist.group.WORLD
    return build_communicator(name, process_group=group, timeout_s=args.timeout, check_desync=False, **options)


def _wrong(comm, op: str, count: int, dtype: torch.dtype, root: int, device: torch.device) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = pattern(rank, count, dtype, device)
    original = mine.clone()
    collective_call(comm, op, mine, root)()
    if op == "broadcast":
        expected = pattern(root, count, dtype, device)
    elif op == "allreduce" or rank == root:
        expected = torch.zeros_like(mine)  # small integers: their sum is exact in every dtype
        for r in range(world):
            expected += pattern(r, count, dtype, device)
    else:
        expected = original
    return int(sum_across([float((mine != expected).sum())], device, f"the check of {op}'s result")[0])


def _slowest(seconds: float, device: torch.device) -> float:
    return max_across([seconds], device, "the slowest rank's time")[0]


def _time(fn, calls: int, device: torch.device) -> float:
    barrier_across("the barrier before a timed call")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _slowest((time.perf_counter() - t0) / calls, device)


def join_process_group(timeout_s: float) -> None:
    """NCCL where there are GPUs, each process on ``cuda:LOCAL_RANK``; gloo on the CPU. The
    group's own collectives (the desync check, the backend's rows, the barriers) wait at most
    ``timeout_s`` (``--timeout``), like lptrain's messages, instead of the backend's 30 minutes."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = torch.device("cuda", local_rank() % gpus) if gpus else torch.device("cpu")
    join_default_group(device, datetime.timedelta(seconds=timeout_s))


def _say_what_was_measured(comms: dict[str, Communicator]) -> None:
    """The transport as the schedules measured it, and the machine auto prices on."""
    links = {a: comm.link for a, comm in comms.items() if comm.link is not None}
    if links:
        link = next(iter(links.values()))
        print(
            f"# the transport as measured: {link.describe()}; segment_size=auto and lp's block_size=auto "
            f"follow it ({', '.join(links)})"
        )
    for a, comm in comms.items():
        if isinstance(comm, AutoCommunicator):
            print(f"# {a} prices on the {comm.machine()}")


def run_distributed(args: argparse.Namespace) -> list[Row]:
    if launched_by_mpirun():
        _join_from_mpirun()
    if not dist.is_initialized():
        join_process_group(args.timeout)
    bound_collectives(datetime.timedelta(seconds=args.timeout))  # a group made elsewhere too
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if backend == "nccl" else torch.device("cpu")
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    wanted = wanted_algorithms(args.algo)
    args.variants = algo_variants([a for a in wanted if a in SCHEDULES], args)
    args.tuning_context = {
        "executor": "distributed",
        "device_type": "cpu" if backend == "gloo" else "cuda",
        "world_size": world,
        "dtype": args.dtype,
    }
    algos = list(args.variants) + (["native"] if any(a in BACKENDS_OWN for a in wanted) else [])
    if "mpi" in wanted:
        if launched_by_mpirun() and importlib.util.find_spec("mpi4py") is not None and backend == "gloo":
            algos.append("mpi")
        elif rank == 0:
            print("# mpi: skipped: needs CPU tensors, mpi4py, and a launch by mpirun (mpirun -np N lptrain-bench ...)")
    comms = {a: _build(a, args) for a in algos}
    if rank == 0 and not args.quiet:
        _say_what_was_measured(comms)
    label = {a: (backend if a == "native" else a) for a in algos}
    ops = list(OPS) if args.op == "all" else [args.op]
    out = sys.stdout if rank == 0 and not args.quiet else None
    rows: list[Row] = []
    for op in ops:
        print_header(out, op, world, f"{backend} process", args.dtype, f"{backend} = the backend's own {op}")
        for size in message_sizes(args.minbytes, args.maxbytes, args.stepfactor):
            count = size // itemsize
            nbytes = count * itemsize
            tensor = torch.zeros(count, dtype=dtype, device=device)
            candidates = []
            for algo, comm in comms.items():
                wrong = _wrong(comm, op, count, dtype, args.root, device) if args.check else None
                fn = collective_call(comm, op, tensor, args.root)
                one = max(_time(fn, 1, device) for _ in range(max(args.warmup, 1)))
                calls = args.iters or int(min(max(args.target_time / args.trials / max(one, 1e-9), 1), 1000))
                candidates.append([algo, comm, fn, calls, wrong, []])
            for _ in range(args.trials):
                for c in candidates:
                    c[5].append(_time(c[2], c[3], device))
            for algo, comm, _, _, wrong, times in candidates:
                sec = statistics.median(times)
                algbw = nbytes / sec / 1e9
                moved = segment = block = None
                if algo in args.variants and args.variants[algo][0] != "auto":
                    schedule = comm.schedule(op, count, args.root, dtype)
                    moved = schedule.elements_moved() * itemsize / sec / 1e9
                    segment = comm.segment_elements(count, itemsize, op) * itemsize
                    if args.variants[algo][0] == "lp" and schedule.steps:
                        block = schedule.steps[0][0].count * itemsize
                link = comm.link
                row = Row(
                    op,
                    nbytes,
                    count,
                    args.dtype,
                    label[algo],
                    world,
                    sec * 1e6,
                    algbw,
                    algbw * bus_factor(op, world),
                    moved,
                    None,
                    wrong,
                    segment,
                    block,
                    link.alpha_s if link else None,
                    1 / link.beta_s_per_byte if link else None,
                    comm.chose(op, nbytes) if isinstance(comm, AutoCommunicator) else None,
                    1 / link.port_beta_s_per_byte if link and link.port_beta_s_per_byte else None,
                )
                rows.append(print_row(out, row))
    return rows
