"""``lptrain-bench``: time the collectives the way nccl-tests does.

One row per message size and algorithm: size, count, dtype, algorithm, time, algbw,
busbw (nccl-tests' factors: allreduce 2(P-1)/P, broadcast 1, reduce 1) and the number
of wrong elements found by a correctness check run before the timing. Two columns go
beyond nccl-tests: ``moved`` is the bytes the schedule sends over links divided by the
time, and ``vs_memcpy`` compares it with the machine's own memcpy bandwidth, measured
for the same size in the same run (a ``memcpy`` row), which is the physical limit of
an in-process executor whose "links" are memory copies.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from lptrain.bench_common import (
    DTYPES,
    OPS,
    Row,
    algo_variants,
    bus_factor,
    collective_call,
    message_sizes,
    pattern,
    print_header,
    print_row,
    save_tuning,
)
from lptrain.comm import NAMES, BackendUnavailableError, CollectiveInputError, build_communicator
from lptrain.comm.communicator import Communicator, ScheduleCommunicator
from lptrain.comm.devices import DEVICE_TYPES, SpecSyntax, device_list
from lptrain.comm.distributed import CollectiveError
from lptrain.comm.sizes import parse_size
from lptrain.exits import EXIT_PEER_FAILED
from lptrain.train.launch import finish, launched_by_torchrun

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
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    p = len(devices)
    algos = _parse_algos(args.algo)
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
                rows.append(print_row(out, row))
    return rows


def _parse_algos(text: str) -> list[str]:
    valid = list(NAMES) + ["lp-rb", "mpi"]  # NAMES includes auto
    algos = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in algos if a not in valid]
    if bad or not algos:
        raise ValueError(
            f"unknown algorithm(s) {', '.join(bad) or '(none)'}; valid: {', '.join(valid)} "
            "(lp-rb is lp with the reduce-then-broadcast allreduce)"
        )
    return algos


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lptrain-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="allreduce", choices=[*OPS, "all"], help="collective to time (default allreduce)")
    p.add_argument(
        "--algo",
        default="lp,mst,be,ring,nccl",
        help="comma-separated algorithms: lp, lp-rb, mst, be, ring, nccl (default: all but lp-rb)",
    )
    p.add_argument(
        "--devices",
        default="4",
        help="a count N (of --device-type), cpu*N, cuda*N, cuda (every GPU), cuda:0, or a list like cuda:0,cuda:2 "
        "(a device may repeat: replicas then share it); default 4",
    )
    p.add_argument(
        "--device-type",
        default="cpu",
        choices=DEVICE_TYPES,
        help="what a count in --devices counts (default cpu; auto: cuda where there is a GPU)",
    )
    p.add_argument("-b", "--minbytes", default="1K", help="smallest message (default 1K)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest message (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows (default 4)")
    p.add_argument("-d", "--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("-w", "--warmup", type=int, default=1, help="untimed calls per row (default 1)")
    p.add_argument("-n", "--iters", type=int, default=None, help="timed calls per row (default: fill --target-time)")
    p.add_argument("--target-time", type=float, default=0.3, help="seconds of timed calls per row when -n is not set")
    p.add_argument(
        "--trials", type=int, default=3, help="round-robin trials per size; rows show the median (default 3)"
    )
    p.add_argument("--root", type=int, default=0, help="root of broadcast and reduce (default 0)")
    p.add_argument(
        "--lp-block",
        default="auto",
        help="lp block size in bytes, e.g. 1M, or auto (default); a list (256K,1M,4M) times each as lp@SIZE",
    )
    p.add_argument("--lp-allreduce", default="overlapped", choices=["overlapped", "reduce_broadcast"])
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the correctness check")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    p.add_argument("--quiet", action="store_true", help="print no table (with --json)")
    p.add_argument("--timeout", type=float, default=300, help="seconds before a silent peer is an error (torchrun)")
    p.add_argument(
        "--segment-size", default=None, help="bytes per message of the schedules across processes, e.g. 1M (torchrun)"
    )
    p.add_argument("--window", type=int, default=None, help="receives posted ahead across processes (torchrun)")
    p.add_argument(
        "--save-tuning",
        metavar="FILE",
        help="write the measured rows as a tuning file for comm=auto (lptrain comm=auto comm.options.tuning=FILE)",
    )
    p.add_argument("--tuning", metavar="FILE", help="the tuning file --algo auto reads (default: the simulator picks)")
    p.add_argument(
        "--reduce-kernel",
        default=None,
        help="CUDA, one process: how lp/mst/be/ring add another GPU's blocks: auto, peer, staged, or a list "
        "(peer,staged: one row each, ring/peer and ring/staged)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.minbytes = parse_size(args.minbytes, "-b")
        args.maxbytes = parse_size(args.maxbytes, "-e")
        message_sizes(args.minbytes, args.maxbytes, args.stepfactor)
        if args.iters is not None and args.iters < 1:
            raise ValueError(f"-n must be at least 1, got {args.iters}")
        if args.trials < 1:
            raise ValueError(f"--trials must be at least 1, got {args.trials}")
        from lptrain.bench_dist import launched_by_mpirun, run_distributed

        several_processes = launched_by_torchrun() or launched_by_mpirun()  # then one tensor per process
        rows = run_distributed(args) if several_processes else run(args)
    except (ValueError, BackendUnavailableError) as err:
        parser.error(str(err))
    except CollectiveError as err:  # a peer died, stalled or desynced: the group is broken
        print(f"lptrain-bench: error: {err}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_PEER_FAILED)  # leaving the group would wait on the peer that is gone
    if args.json and int(os.environ.get("RANK", "0")) == 0:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    if args.save_tuning and int(os.environ.get("RANK", "0")) == 0:
        written = save_tuning(args.save_tuning, rows, args.variants, **args.tuning_context)
        print(f"# wrote {written} rows to {args.save_tuning} (use: comm=auto comm.options.tuning={args.save_tuning})")
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
