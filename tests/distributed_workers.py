"""Functions run inside the processes that tests/test_distributed.py spawns.

Each worker joins a gloo group over loopback (a file store), runs its part, and raises
on any mismatch; ``torch.multiprocessing.spawn`` re-raises a child's error in the parent.
"""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lptrain.communicators import build_communicator

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)


def join(rank: int, world: int, store: str, timeout_s: float = 60) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def inputs(rank: int, count: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + rank * 31 + count)
    if dtype.is_floating_point:
        return (torch.randn(count, generator=g, dtype=torch.float64) * 4).to(dtype)
    return torch.randint(-1000, 1000, (count,), generator=g).to(dtype)


def check_close(got: torch.Tensor, want: torch.Tensor, parts: list[torch.Tensor], what: str) -> None:
    if not got.dtype.is_floating_point:
        assert torch.equal(got.double(), want), what
        return
    mag = sum(p.double().abs() for p in parts)
    eps = torch.finfo(torch.float32 if got.dtype in (torch.float16, torch.bfloat16) else got.dtype).eps
    tol = len(parts) * eps * mag + torch.finfo(got.dtype).eps * mag + torch.finfo(got.dtype).tiny
    assert ((got.double() - want).abs() <= tol).all(), f"{what}: beyond the summation-order tolerance"


def correctness(
    rank: int, world: int, store: str, algos: list[str], counts: list[int], options: dict | None = None
) -> None:
    join(rank, world, store)
    for name in algos:
        block = 40 if max(counts) < 1000 else "64K"  # several blocks either way, not thousands of steps
        extra = dict(options or {}) if name != "nccl" else {}
        batched = extra.pop("batched_steps", None)
        if name == "lp":
            extra["block_size"] = block
        comm = build_communicator(name, process_group=dist.group.WORLD, timeout_s=30, **extra)
        if batched is not None:  # the executor NCCL gets, run over gloo
            comm.batched_steps = batched
        for dtype in DTYPES:
            for count in counts:
                parts = [inputs(r, count, dtype, 1) for r in range(world)]
                total = sum(p.double() for p in parts)
                mine = parts[rank].clone()
                comm.allreduce(mine)
                check_close(mine, total, parts, f"{name} allreduce {dtype} {count}")
                raw = mine.view(torch.uint8)
                gathered = [torch.empty_like(raw) for _ in range(world)]
                dist.all_gather(gathered, raw)
                for g in gathered:  # bitwise identical on every rank
                    assert torch.equal(g, raw), f"{name}: replicas differ"
                for root in range(world):
                    mine = parts[rank].clone()
                    comm.reduce(mine, root=root)
                    if rank == root:
                        check_close(mine, total, parts, f"{name} reduce {dtype} {count} root {root}")
                    else:
                        assert torch.equal(mine, parts[rank]), f"{name} reduce changed rank {rank}'s input"
                    mine = parts[rank].clone()
                    comm.broadcast(mine, root=root)
                    assert torch.equal(mine, parts[root]), f"{name} broadcast {dtype} {count} root {root}"
    dist.destroy_process_group()


def desync(rank: int, world: int, store: str, out: str) -> None:
    join(rank, world, store)
    comm = build_communicator("ring", process_group=dist.group.WORLD, timeout_s=20)
    t = torch.ones(10 if rank != 1 else 12)
    try:
        comm.allreduce(t) if rank != 1 else comm.broadcast(t)
    except Exception as err:
        Path(out, f"rank{rank}.txt").write_text(f"{type(err).__name__}: {err}")
    else:
        Path(out, f"rank{rank}.txt").write_text("no error")
    dist.destroy_process_group()


def fault(rank: int, world: int, store: str, out: str, how: str = "die") -> None:
    """Rank ``world - 1`` dies (or stalls) in the middle of an allreduce; the others must
    stop with a clear error: at once for a death, after the timeout for a stall."""
    join(rank, world, store, timeout_s=20)
    comm = build_communicator("lp", process_group=dist.group.WORLD, timeout_s=3, block_size=4096)
    victim = world - 1

    def misbehave(op: str, step: int) -> None:
        if step == 3:
            if how == "die":
                os._exit(17)
            time.sleep(15)
            os._exit(18)

    if rank == victim:
        comm._step_hook = misbehave
    t = torch.ones(100_000)
    started = datetime.datetime.now()
    try:
        comm.allreduce(t)
    except Exception as err:
        took = (datetime.datetime.now() - started).total_seconds()
        Path(out, f"rank{rank}.txt").write_text(f"{type(err).__name__} after {took:.1f}s: {err}")
        os._exit(0)  # the group is broken: leave without the collective shutdown
    Path(out, f"rank{rank}.txt").write_text("no error")
    os._exit(0)


def measured_blocks(rank: int, world: int, store: str, out: str) -> None:
    """LP with automatic blocks measures the transport; every rank must cut alike."""
    join(rank, world, store)
    comm = build_communicator("lp", process_group=dist.group.WORLD, timeout_s=30)
    link = comm.link
    assert link is not None and link.alpha_s > 0 and link.beta_s_per_byte > 0
    blocks = [comm.schedule("allreduce", n).num_steps for n in (1 << 10, 1 << 20, 1 << 24)]
    t = inputs(rank, 100_003, torch.float32, 5)
    parts = [inputs(r, 100_003, torch.float32, 5) for r in range(world)]
    comm.allreduce(t)
    check_close(t, sum(p.double() for p in parts), parts, "lp with measured blocks")
    # its reduce-then-broadcast allreduce holds the broadcast back until the reduce is in
    rb = build_communicator("lp", process_group=dist.group.WORLD, timeout_s=30, allreduce="reduce_broadcast")
    assert comm.issue_order["allreduce"] == "eager" and rb.issue_order["allreduce"] == "phases", rb.issue_order
    t = inputs(rank, 100_003, torch.float32, 5)
    rb.allreduce(t)
    check_close(t, sum(p.double() for p in parts), parts, "lp reduce_broadcast with measured blocks")
    Path(out, f"rank{rank}.txt").write_text(f"{link.alpha_s!r} {link.beta_s_per_byte!r} {blocks}")
    dist.destroy_process_group()


def released(rank: int, world: int, store: str, out: str) -> None:
    """The communicators must not keep the process group alive past destroy_process_group
    (a group torn down at interpreter exit makes gloo abort some of the time)."""
    import gc
    import weakref

    join(rank, world, store)
    comms = [build_communicator(name, process_group=dist.group.WORLD) for name in ("ring", "nccl", "auto")]
    for comm in comms:
        t = torch.ones(1000)
        comm.allreduce(t)
        assert torch.equal(t, torch.full((1000,), float(world))), comm
    group = weakref.ref(dist.group.WORLD)
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
    try:
        comms[0].allreduce(torch.ones(10))
    except Exception as err:
        said = f"{type(err).__name__}: {err}"
    else:
        said = "no error"
    Path(out, f"rank{rank}.txt").write_text(f"freed={group() is None}\n{said}")


def refusals(comm, tensors_of) -> dict[str, str]:
    """What ``comm`` says to a root that is no rank, an unknown op and an average of integers;
    ``tensors_of(dtype)`` makes this process's tensors. None of them may be touched."""
    said = {}
    p = comm.world_size
    calls = {
        "root": (lambda t: comm.reduce(t, root=p), torch.float32),
        "op": (lambda t: comm.allreduce(t, op="max"), torch.float32),
        "avg": (lambda t: comm.allreduce(t, op="avg"), torch.int32),
    }
    for check, (call, dtype) in calls.items():
        tensors = tensors_of(dtype)
        before = [t.clone() for t in (tensors if isinstance(tensors, list) else [tensors])]
        try:
            call(tensors)
        except Exception as err:  # CollectiveInputError: the text is what is compared
            said[check] = f"{type(err).__name__}: {err}"
        else:
            said[check] = "no error"
        after = tensors if isinstance(tensors, list) else [tensors]
        assert all(torch.equal(a, b) for a, b in zip(before, after)), f"{comm!r} touched its tensors on {check}"
    return said


def expected_refusals(world_size: int) -> dict[str, str]:
    return {
        "root": f"CollectiveInputError: root must be a rank in 0..{world_size - 1}, got {world_size}",
        "op": "CollectiveInputError: unknown op 'max'; valid ops: sum, avg",
        "avg": "CollectiveInputError: op='avg' needs a floating-point dtype, got torch.int32; use op='sum'",
    }


def protocol_and_hierarchy(rank: int, world: int, store: str, tuning: str) -> None:
    """Every kind of communicator across processes follows the protocol; the factory given
    devices and a group builds the hierarchy (nccl inside a CPU process as ring, the tuning
    file across only), which sums right and says where each part's choices were made; and
    every executor refuses bad arguments with the same sentence."""
    import protocol_check

    from lptrain.auto import AutoCommunicator
    from lptrain.comm.communicator import ScheduleCommunicator
    from lptrain.comm.distributed import DistributedCommunicator
    from lptrain.comm.hierarchical import HierarchicalCommunicator

    join(rank, world, store)
    group, inside = dist.group.WORLD, 2
    comms = {
        "lp across": build_communicator("lp", process_group=group, timeout_s=30, block_size=64),
        "nccl across": build_communicator("nccl", process_group=group, timeout_s=30),
        "auto across": build_communicator("auto", process_group=group, timeout_s=30, tuning=tuning),
        "lp hierarchy": build_communicator("lp", ["cpu"] * inside, process_group=group, timeout_s=30, block_size=64),
        "nccl hierarchy": build_communicator("nccl", ["cpu"] * inside, process_group=group, timeout_s=30),
        "auto hierarchy": build_communicator("auto", ["cpu"] * inside, process_group=group, tuning=tuning),
    }
    for what, comm in comms.items():
        assert protocol_check.problems(comm) == [], (what, protocol_check.problems(comm))
    assert isinstance(comms["lp across"], DistributedCommunicator)
    lp = comms["lp hierarchy"]
    assert isinstance(lp, HierarchicalCommunicator) and isinstance(lp.local, ScheduleCommunicator)
    assert (lp.local.name, lp.remote.name, lp.world_size, lp.link) == ("lp", "lp", inside * world, lp.remote.link)
    assert (comms["nccl hierarchy"].local.name, comms["nccl hierarchy"].remote.name) == ("ring", "nccl")
    auto = comms["auto hierarchy"]
    assert isinstance(auto.local, AutoCommunicator) and isinstance(auto.remote, AutoCommunicator)
    assert auto.local.table is None and auto.remote.table is not None  # the file describes the processes

    # What each says: the fixed block follows no link, the automatic segments do.
    (line,) = lp.describe("execution")
    assert line.startswith("lp across processes: segments sized for this transport as measured, "), line
    assert lp.describe("choice") == [] and lp.describe() == [line]
    auto.prepare("allreduce", 4096)
    choices = auto.describe("choice")
    assert [c.split(":")[0] for c in choices] == [
        "inside the process, allreduce of 4K",
        "across processes, allreduce of 4K",
    ], choices
    assert "(measured" in choices[1] and "(simulated" in choices[0]
    assert auto.describe("execution") == []

    # The hierarchy sums every process's every device.
    p = inside * world
    total = float(p * (p + 1) // 2)
    for what in ("lp hierarchy", "nccl hierarchy", "auto hierarchy"):
        comm = comms[what]

        def mine(offset: float = 1.0) -> list[torch.Tensor]:
            return [torch.full((10,), float(rank * inside + i) + offset) for i in range(inside)]

        tensors = mine()
        comm.allreduce(tensors)
        assert all(torch.equal(t, torch.full((10,), total)) for t in tensors), what
        tensors = mine()
        comm.allreduce(tensors, op="avg")
        assert all(torch.allclose(t, torch.full((10,), total / p)) for t in tensors), what
        tensors, original = mine(), mine()
        comm.reduce(tensors, root=0)
        want = [torch.full((10,), total), *original[1:]] if rank == 0 else original
        assert all(torch.equal(t, w) for t, w in zip(tensors, want)), what
        tensors = [torch.full((10,), 7.0 if rank == 0 and i == 0 else 0.0) for i in range(inside)]
        comm.broadcast(tensors, root=0)
        assert all(torch.equal(t, torch.full((10,), 7.0)) for t in tensors), what

    # The same refusals from every executor, before anything is touched or sent.
    for what, comm in comms.items():
        if "hierarchy" in what:
            said = refusals(comm, lambda dtype: [torch.zeros(10, dtype=dtype) for _ in range(inside)])
        else:
            said = refusals(comm, lambda dtype: torch.zeros(10, dtype=dtype))
        assert said == expected_refusals(comm.world_size), (what, said)
    # across processes, this rank's tensor in a list of one is the same call as the tensor bare
    assert refusals(comms["lp across"], lambda dtype: [torch.zeros(10, dtype=dtype)]) == expected_refusals(world)
    try:
        lp.reduce([torch.zeros(10) for _ in range(inside)], root=1)
    except Exception as err:
        assert str(err) == "the hierarchical reduce goes to replica 0, got root=1", err
    else:
        raise AssertionError("the hierarchy reduced to replica 1")
    dist.barrier()
    dist.destroy_process_group()


def link_on_racks(rank: int, world: int, store: str, out: str) -> None:
    """``measure_link`` over two racks of two, its exchanges' times replaced by what such racks
    give (a port at 25 MB/s, the uplink at half that): every exchange of the ring crosses the
    uplink one way or the other, and only ranks 1 and 3 receive from a rank in their rack."""
    import json

    from lptrain.comm import transport

    join(rank, world, store)
    port, uplink = 25e6, 12.5e6

    def exchange(buf_out, buf_in, r, w, group, timeout):
        if buf_out.numel() < 1024:
            return 50e-6, 50e-6
        received = buf_out.numel() / (port if r % 2 else uplink)
        return received, buf_out.numel() / uplink

    transport._exchange = exchange
    link = transport.measure_link(dist.group.WORLD, torch.device("cpu"))
    Path(out, f"rank{rank}.json").write_text(json.dumps([link.beta_s_per_byte, link.port_beta_s_per_byte]))
    dist.barrier()
    dist.destroy_process_group()


def link_rules(rank: int, world: int, store: str, out: str) -> None:
    """The executor's message rules on a link measured fast and on one measured slow (the
    measurement replaced by each figure): messages, waits and paced sends per call."""
    import json

    import lptrain.comm.build as build
    from lptrain.comm.transport import LinkCost

    join(rank, world, store)
    counts = {}
    # BE's slow link is slower still: its pacing shows only where a step's bytes take longer
    # to drain at the link's rate (here 0.13 s) than the peer's reply takes on a busy machine
    # and BE's fast link is barely fast, where pacing at its rate would hold a 4 MiB
    # allreduce's second step back (its first step's 2 MiB take 3.5 ms to drain at 600 MB/s)
    # and on "racks" the ring's slowest link is as slow, its fastest (a port) so fast that the
    # port drains a step's bytes (at most 512 KiB: 1.7 us) before any reply can come back
    # through gloo, so nothing is held (the messages are the slow link's). At 3 GB/s (175 us)
    # a quick reply on an idle machine was now and then faster, and one send was held.
    rates = {"fast": {"ring": 3e9, "be": 600e6}, "slow": {"ring": 25e6, "be": 2e6}, "racks": {"be": (2e6, 3e11)}}
    sizes = {"fast": {"ring": 16 << 20, "be": 4 << 20}, "slow": {"ring": 16 << 20, "be": 1 << 18}}
    sizes["racks"] = {"be": 1 << 18}
    for speed, rate_of in rates.items():
        for name, count in sizes[speed].items():
            slowest, port = rate_of[name] if isinstance(rate_of[name], tuple) else (rate_of[name], None)
            link = LinkCost(80e-6, 1 / slowest, 1 / port if port else None)
            build.link_of = lambda group, device, timeout=None, link=link: link
            comm = build_communicator(name, process_group=dist.group.WORLD, timeout_s=60, check_desync=False)
            t = torch.full((count,), float(rank + 1))
            comm.allreduce(t)
            assert torch.equal(t, torch.full((count,), float(world * (world + 1) // 2))), f"{name} on a {speed} link"
            prof = comm.profile
            counts[f"{name} {speed}"] = [prof.messages, prof.waits, prof.paced, prof.calls, prof.staged_copies]
            if name == "be":  # its broadcast keeps the link's messages where its allreduce takes the share
                before = prof.messages
                comm.broadcast(t, 0)
                counts[f"be {speed} broadcast"] = prof.messages - before
    Path(out, f"rank{rank}.json").write_text(json.dumps(counts))
    dist.barrier()
    dist.destroy_process_group()


def reduce_page_faults(rank: int, world: int, store: str, out: str) -> None:
    """Minor page faults per reduce call on each rank, after a first call: a rank that is not the
    root runs the schedule on a copy of its tensor, and a fresh 16 MiB copy faults its 4096
    pages in on every call (the ranks then enter the schedule late, one after another)."""
    import json
    import resource

    join(rank, world, store)
    faults = {}
    for name in ("be",):
        comm = build_communicator(name, process_group=dist.group.WORLD, timeout_s=60, check_desync=False)
        t = torch.full((4 << 20,), float(rank + 1))
        expected = torch.full_like(t, float(world * (world + 1) // 2) if rank == 0 else float(rank + 1))
        comm.reduce(t, 0)  # the first call builds the program and fills the staging pool
        faulted = 0
        for _ in range(3):
            t.fill_(float(rank + 1))
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            comm.reduce(t, 0)
            faulted += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            assert torch.equal(t, expected), f"{name}: rank {rank}'s tensor after reduce"
        faults[name] = faulted / 3
    Path(out, f"rank{rank}.json").write_text(json.dumps(faults))
    dist.barrier()
    dist.destroy_process_group()
