#!/usr/bin/env python3
"""Where the time of lptrain's schedules across processes goes, beside gloo's own allreduce.

Run under torchrun; every rank reports its share (blocked on the transport, adding or
copying what arrived, the rest: Python and posting messages), and rank 0 prints them, with
the CPU time all ranks spent per call (every thread: on a machine with fewer cores than
ranks, CPU time is what the ranks end up waiting for):

    torchrun --standalone --nproc-per-node 2 scripts/profile_dist.py --size 64M
    torchrun --standalone --nproc-per-node 4 scripts/profile_dist.py --size 64M --algo ring,lp,be
    torchrun --standalone --nproc-per-node 4 scripts/profile_dist.py --size 16M --algo ring:1M,ring:4M

``NAME:SIZE`` runs NAME with ``segment_size=SIZE``. Calls alternate between the algorithms
(round robin), so a busy machine slows all alike. ``--links`` first times every rank's port
alone (one transfer in flight at a time) and names a port slow both ways, the straggler
that slows every collective (on an emulated cluster: ``lptrain-cluster --slow 2=50mbit``):

    lptrain-cluster --nodes 4 --slow 2=50mbit -- python3 scripts/profile_dist.py --links --size 4M
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
import torch.distributed as dist

from lptrain.comm.sizes import parse_size
from lptrain.comm.transport import port_rates, slowest_port
from lptrain.communicators import build_communicator


def _cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process: gloo's too
    return used.ru_utime + used.ru_stime


def report_ports(rank: int, world: int) -> None:
    rates = port_rates(dist.group.WORLD, torch.device("cpu"))
    if rank != 0:
        return
    print(f"# each rank's port alone (1 MiB to the next rank, from the previous), {world} gloo processes")
    for r in rates:
        print(f"port of rank {r.rank}: sends {r.send_bps / 1e6:8.1f} MB/s, receives {r.recv_bps / 1e6:8.1f} MB/s")
    slow = slowest_port(rates)
    if slow is not None:
        print(f"slow: rank {slow.rank}'s port, {slow.best_bps / 1e6:.1f} MB/s at best either way")
    else:
        print("slow: no port stands out" + (" (two ranks share every transfer)" if world < 3 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="64M", help="message size (default 64M)")
    parser.add_argument("--algo", default="ring,lp", help="schedules to profile (default ring,lp)")
    parser.add_argument("--iters", type=int, default=6, help="timed calls per algorithm (default 6)")
    parser.add_argument("--links", action="store_true", help="time every rank's port alone and name a slow one")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.links:
        report_ports(rank, world)
    count = parse_size(args.size, "--size") // 4
    tensor = torch.ones(count)
    world_group = dist.group.WORLD
    names = args.algo.split(",")
    comms = {}
    for name in names:
        algo, _, segment = name.partition(":")
        options = {"segment_size": segment} if segment else {}
        comms[name] = build_communicator(algo, process_group=world_group, check_desync=False, **options)
    native = build_communicator("nccl", process_group=dist.group.WORLD, check_desync=False)
    wall = {name: 0.0 for name in [*comms, "gloo"]}
    cpu = dict.fromkeys(wall, 0.0)
    for comm in [*comms.values(), native]:  # warm-up: schedules, programs, staging buffers
        comm.allreduce(tensor)
    for comm in comms.values():
        comm.profile.__init__()
    for _ in range(args.iters):
        for name, comm in [*comms.items(), ("gloo", native)]:
            dist.barrier()
            c0, t0 = _cpu_seconds(), time.perf_counter()
            comm.allreduce(tensor)
            wall[name] += time.perf_counter() - t0
            cpu[name] += _cpu_seconds() - c0
    report = {name: comm.profile.describe() for name, comm in comms.items()}
    reports: list = [None] * world
    dist.all_gather_object(reports, report)
    clocks: list = [None] * world
    dist.all_gather_object(clocks, (wall, cpu))
    walls = [w for w, _ in clocks]
    cpus = [c for _, c in clocks]
    if rank == 0:
        print(f"# allreduce of {args.size} over {world} gloo processes, {args.iters} calls each, ms per call")
        for name in wall:
            slowest = max(w[name] for w in walls) / args.iters * 1e3
            speed = max(w["gloo"] for w in walls) / max(w[name] for w in walls)
            ratio = "" if name == "gloo" else f" ({speed:.2f}x gloo's speed)"
            spent = sum(c[name] for c in cpus) / args.iters * 1e3
            print(f"{name:8s} {slowest:8.1f} ms (slowest rank), CPU {spent:6.1f} ms (all ranks){ratio}")
        for name in comms:
            for r in range(world):
                print(f"  {name} rank {r}: {reports[r][name]}")
    comms.clear()
    dist.barrier()  # leave together: an early exit can abort in gloo's teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
