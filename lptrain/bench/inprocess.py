"""``lptrain-bench`` in one process: every replica a device of this process, each
collective run by lptrain's in-process executor beside a ``memcpy`` row of the same bytes.

``moved`` is the bytes the schedule sends over links divided by the time, and
``vs_memcpy`` compares it with the machine's own memcpy bandwidth measured for the same
size in the same run, which is the physical limit of an executor whose "links" are
memory copies. The candidates of a size are timed in round-robin trials and each row
shows its median.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lptrain.auto import AutoCommunicator
from lptrain.bench.table import Row, print_header, print_row
from lptrain.bench.variants import DTYPES, algo_variants, parse_algos, pattern
from lptrain.comm import BackendUnavailableError, CollectiveInputError, Communicator, ScheduleCommunicator
from lptrain.comm.devices import SpecSyntax, device_list
from lptrain.comm.measure import OPS, bus_factor, collective_call
from lptrain.comm.sizes import message_sizes
from lptrain.communicators import build_communicator
from lptrain.train.memory import check_fits, size_text

BENCH_SYNTAX = SpecSyntax(option="--devices", count_hint="--devices 4 --device-type cpu, or --devices cpu*4")


def count_wrong(comm: Communicator, op: str, count: int, dtype: torch.dtype, root: int) -> int:
    """Run ``op`` once on known inputs and count the elements that differ from the reference."""
    inputs = [pattern(r, count, dtype, d) for r, d in enumerate(comm.devices)]
    tensors = [t.clone() for t in inputs]
    if op == "allreduce":
        comm.allreduce(tensors)
    elif op == "reduce":
        comm.reduce(tensors, root=root)
    else:
        comm.broadcast(tensors, root=root)
    total = sum(t.to("cpu", torch.float64) for t in inputs)
    wrong = 0
    for r, (t, x) in enumerate(zip(tensors, inputs)):
        if op == "allreduce" or (op == "reduce" and r == root):
            expected = total
        elif op == "broadcast":
            expected = inputs[root].to("cpu", torch.float64)
        else:
            expected = x.to("cpu", torch.float64)
        wrong += int((t.to("cpu", torch.float64) != expected).sum())
    return wrong


def check_host_memory(devices: Sequence[torch.device | str], maxbytes: int) -> None:
    """Refuse (``TooLarge``) a largest message that this host's memory cannot hold before
    allocating it: one copy per CPU device, and the memcpy row's two."""
    on_host = sum(torch.device(d).type == "cpu" for d in devices)
    if on_host:
        check_fits(
            (on_host + 2) * maxbytes,
            f"-e {size_text(maxbytes)}: a message on each of {on_host} CPU devices and the memcpy row's two buffers",
            "lower -e (--maxbytes)",
        )


def _sync(devices: Sequence[torch.device]) -> None:
    for d in {d for d in devices if d.type == "cuda"}:
        torch.cuda.synchronize(d)


def calls_per_trial(fn, devices: Sequence[torch.device], warmup: int, iters: int | None, target_s: float) -> int:
    """Warm up, then choose how many calls one timed trial makes (``iters`` if given)."""
    one = 0.0
    for _ in range(max(warmup, 1)):
        one = mean_seconds(fn, devices, 1)
    if iters is not None:
        return iters
    return int(min(max(math.ceil(target_s / max(one, 1e-9)), 1), 1000))


def mean_seconds(fn, devices: Sequence[torch.device], calls: int) -> float:
    """Mean wall-clock seconds per call over ``calls`` back-to-back calls."""
    _sync(devices)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(devices)
    return (time.perf_counter() - t0) / calls


@dataclass
class _Candidate:
    """One row being measured: the memcpy reference or an algorithm."""

    algo: str
    call: object
    devices: Sequence[torch.device]
    moved_bytes: int | None
    wrong: int | None
    calls: int = 1
    times: list[float] | None = None


def _measure(candidates: list[_Candidate], args: argparse.Namespace) -> None:
    """Time all candidates in round-robin trials and keep each one's median.

    The machine is shared and noisy: interleaving the candidates exposes them all to the
    same disturbances, and the median discards a trial that was hit by one.
    """
    per_trial = args.target_time / args.trials
    for c in candidates:
        c.calls = calls_per_trial(c.call, c.devices, args.warmup, args.iters, per_trial)
        c.times = []
    for _ in range(args.trials):
        for c in candidates:
            c.times.append(mean_seconds(c.call, c.devices, c.calls))


def run(args: argparse.Namespace) -> list[Row]:
    devices = device_list(args.devices, args.device_type, BENCH_SYNTAX)
    check_host_memory(devices, args.maxbytes)
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    p = len(devices)
    algos = parse_algos(args.algo)
    ops = list(OPS) if args.op == "all" else [args.op]
    comms: dict[str, Communicator] = {}
    if "mpi" in algos:
        print("# mpi: skipped: Open MPI is a multi-process reference (mpirun -np N lptrain-bench ...)", flush=True)
    args.variants = algo_variants([a for a in algos if a != "mpi"], args)
    for label, (name, options) in args.variants.items():
        try:
            comms[label] = build_communicator(name, devices, **options)
        except (BackendUnavailableError, CollectiveInputError) as err:
            print(f"# {label}: skipped: {err}", flush=True)
    args.tuning_context = {
        "executor": "in-process",
        "device_type": torch.device(devices[0]).type,
        "world_size": p,
        "dtype": args.dtype,
    }
    root = args.root
    if not 0 <= root < p:
        raise ValueError(f"--root must be a rank in 0..{p - 1}, got {root}")
    rows: list[Row] = []
    out = None if args.quiet else sys.stdout
    first = torch.device(devices[0])
    for op in ops:
        print_header(out, op, p, devices[0], args.dtype)
        for size in message_sizes(args.minbytes, args.maxbytes, args.stepfactor):
            count = size // itemsize
            nbytes = count * itemsize
            src = torch.ones(max(nbytes, 1), dtype=torch.uint8, device=first)
            dst = torch.empty_like(src)
            candidates = [_Candidate("memcpy", lambda d=dst, s=src: d.copy_(s), [first], nbytes, None)]
            for algo, comm in comms.items():
                wrong = count_wrong(comm, op, count, dtype, root) if args.check else None
                tensors = [torch.zeros(count, dtype=dtype, device=d) for d in comm.devices]
                moved = None
                if isinstance(comm, ScheduleCommunicator):
                    moved = comm.schedule(op, count, root, dtype).elements_moved() * itemsize
                candidates.append(
                    _Candidate(algo, collective_call(comm, op, tensors, root), comm.devices, moved, wrong)
                )
            _measure(candidates, args)
            mem_bw = nbytes / statistics.median(candidates[0].times) / 1e9
            for c in candidates:
                sec = statistics.median(c.times)
                algbw = nbytes / sec / 1e9
                busbw = algbw if c.algo == "memcpy" else algbw * bus_factor(op, p)
                moved = c.moved_bytes / sec / 1e9 if c.moved_bytes is not None else None
                vs = moved / mem_bw if moved is not None and mem_bw > 0 else None
                row = Row(op, nbytes, count, args.dtype, c.algo, p, sec * 1e6, algbw, busbw, moved, vs, c.wrong)
                auto = comms.get(c.algo)
                if isinstance(auto, AutoCommunicator):
                    row.chose = auto.chose(op, nbytes)
                rows.append(print_row(out, row))
    return rows
