"""How much of a message the transport still holds when it reports the send done.

gloo reports a send done once its bytes are written to the socket, not once they have
landed, so a rank that waits for its sends (a tree's parent serving one child at a time)
goes on while the kernel still holds the tail. The simulator prices that with
``Topology.send_buffer``; this measures it. Rank 0 sends one message to rank 1; both note
when their side completes on the host's one clock (every node of lptrain-cluster runs on
this machine), and the gap between them, at the link's rate, is the bytes still on the way
when the sender was told it was done. Run it on two nodes of the link to measure:

    lptrain-cluster --nodes 2 --layout racks --racks 2 --uplink 50mbit -- \\
        python3 scripts/measure_send_buffer.py --rate 50mbit

It prints one line per size and trial, and the median of the held bytes per size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from lptrain.cluster.plan import ClusterSpecError, parse_rate
from lptrain.comm.sizes import format_size, parse_size


def _sides(nbytes: int, rank: int) -> tuple[float, float]:
    """One message of ``nbytes`` from rank 0 to rank 1: this rank's start and end (the
    host's clock), both ranks started together."""
    tensor = torch.ones(nbytes // 4)
    dist.barrier()
    time.sleep(0.2)  # every queue drained of the barrier's messages
    dist.barrier()
    start = time.time()
    work = dist.isend(tensor, 1) if rank == 0 else dist.irecv(tensor, 0)
    work.wait()
    return start, time.time()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", required=True, help="the link's rate between the two nodes (200mbit, 50mbit)")
    parser.add_argument("--sizes", default="1M,4M,16M", help="message sizes (default 1M,4M,16M)")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        rate = parse_rate(args.rate, "--rate") / 8
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    except (ClusterSpecError, ValueError) as err:
        print(f"measure_send_buffer: error: {err}", file=sys.stderr)
        return 2
    dist.init_process_group("gloo")
    if dist.get_world_size() != 2:
        print("measure_send_buffer: error: run it on two ranks (lptrain-cluster --nodes 2)", file=sys.stderr)
        return 2
    rank = dist.get_rank()
    for nbytes in sizes:
        held = []
        for trial in range(args.trials):
            both: list = [None, None]
            dist.all_gather_object(both, _sides(nbytes, rank))
            (start, sent), (_, landed) = both
            held.append(max(0.0, landed - sent) * rate)
            if rank == 0:
                print(f"{format_size(nbytes)} trial {trial}: send done after {(sent - start) * 1e3:.0f} ms, "
                      f"landed after {(landed - start) * 1e3:.0f} ms: {held[-1] / 2**20:.2f} MiB held "
                      f"at {args.rate}", flush=True)  # fmt: skip
        if rank == 0:
            print(f"{format_size(nbytes)}: median {statistics.median(held) / 2**20:.2f} MiB held", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
