"""``lptrain-bench``: time the collectives the way nccl-tests does.

One row per message size and algorithm: size, count, dtype, algorithm, time, algbw,
busbw (nccl-tests' factors: allreduce 2(P-1)/P, broadcast 1, reduce 1) and the number
of wrong elements found by a correctness check run before the timing. Two columns go
beyond nccl-tests: ``moved`` is the bytes the schedule sends over links divided by the
time, and ``vs_memcpy`` compares it with the machine's own memcpy bandwidth, measured
for the same size in the same run (a ``memcpy`` row), which is the physical limit of
an in-process executor whose "links" are memory copies.

This module is the command: its options, and the choice between the measurement in one
process (``lptrain.bench.inprocess``) and, under torchrun or mpirun, the one across
processes (``lptrain.bench.distributed``); both print ``lptrain.bench.table``'s rows.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from lptrain.bench.inprocess import run
from lptrain.bench.table import write_json
from lptrain.bench.variants import DTYPES, save_tuning
from lptrain.comm import BackendUnavailableError
from lptrain.comm.devices import DEVICE_TYPES
from lptrain.comm.distributed import CollectiveError
from lptrain.comm.measure import OPS
from lptrain.comm.sizes import parse_size_range
from lptrain.exits import EXIT_PEER_FAILED, EXIT_USAGE, quiet_on_closed_pipe
from lptrain.train.launch import finish, launched_by_torchrun
from lptrain.train.memory import TooLarge, allocation_failure


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
        "--topology",
        help="the machine --algo auto prices on: a model (host, pcie ...), racks such as racks:2@1/2, or probe "
        "(measured across processes at start)",
    )
    p.add_argument(
        "--reduce-kernel",
        default=None,
        help="CUDA, one process: how lp/mst/be/ring add another GPU's blocks: auto, peer, staged, or a list "
        "(peer,staged: one row each, ring/peer and ring/staged)",
    )
    return p


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.minbytes, args.maxbytes = parse_size_range(args.minbytes, args.maxbytes, args.stepfactor)
        if args.iters is not None and args.iters < 1:
            raise ValueError(f"-n must be at least 1, got {args.iters}")
        if args.trials < 1:
            raise ValueError(f"--trials must be at least 1, got {args.trials}")
        from lptrain.bench.distributed import launched_by_mpirun, run_distributed

        several_processes = launched_by_torchrun() or launched_by_mpirun()  # then one tensor per process
        rows = run_distributed(args) if several_processes else run(args)
    except TooLarge as err:  # a size this machine cannot hold: one line, no usage
        sys.stderr.write(f"lptrain-bench: error: {err}\n")
        sys.exit(EXIT_USAGE)
    except (ValueError, BackendUnavailableError) as err:
        parser.error(str(err))
    except CollectiveError as err:  # a peer died, stalled or desynced: the group is broken
        sys.stderr.write(f"lptrain-bench: error: {err}\n")  # whole: ranks share the pipe, unbuffered
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_PEER_FAILED)  # leaving the group would wait on the peer that is gone
    except RuntimeError as err:  # torch could not allocate a message: one line, as a bad size is
        oom = allocation_failure(err)
        if oom is None:
            raise
        sys.stderr.write(f"lptrain-bench: error: {oom}; lower -e (--maxbytes) or --devices\n")
        sys.exit(EXIT_USAGE)
    if args.json and int(os.environ.get("RANK", "0")) == 0:
        write_json(args.json, rows)
    if args.save_tuning and int(os.environ.get("RANK", "0")) == 0:
        written = save_tuning(args.save_tuning, rows, args.variants, **args.tuning_context)
        print(f"# wrote {written} rows to {args.save_tuning} (use: comm=auto comm.options.tuning={args.save_tuning})")
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
