"""Run under torchrun by tests/test_ddp.py: lptrain.ddp's hook and backend against PyTorch's own.

    torchrun --standalone --nproc-per-node 3 tests/ddp_workers.py --out results.pt

On a gloo default group, each rank trains the same small network for ``--steps`` steps
with DDP: with DDP's own allreduce, with a reversed-order control (a hook that sums the
ranks' buckets last rank first: what reordering the additions alone changes), with
lptrain's hook for every algorithm, and on the lptrain backend (a group opened with
``dist.new_group(backend="lptrain_<algo>")``). It also runs ``all_reduce``, ``broadcast``
and ``reduce`` on that backend against gloo's, passes a few operations through, and
provokes the refusals. Rank 0 saves what it found; the test judges it.
"""

import argparse
import datetime
import faulthandler
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from torch.nn.parallel import DistributedDataParallel

import lptrain.ddp

ALGOS = ("lp", "mst", "be", "ring")


def network() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights everywhere
    return nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def reversed_order_hook(_state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The control: every rank's bucket gathered and summed from the last rank to the first."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    parts = [torch.empty_like(buffer) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, buffer)
    total = parts[-1].clone()
    for part in reversed(parts[:-1]):
        total += part
    buffer.copy_(total)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


def train(steps: int, rank: int, register=None, group=None) -> torch.Tensor:
    model = DistributedDataParallel(network(), bucket_cap_mb=0.02, process_group=group)  # several buckets
    if register is not None:
        register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])


def hook_counts(steps: int, rank: int) -> dict[str, int]:
    """The ring hook's per-step costs, counted: buckets, desync checks (small allreduces) and
    buckets handed to the worker thread."""
    st = lptrain.ddp.state(algo="ring")
    buckets = [0]

    def counting(state, bucket):
        buckets[0] += 1
        return lptrain.ddp.hook(state, bucket)

    train(steps, rank, lambda m: m.register_comm_hook(st, counting))
    return {"steps": steps, "buckets": buckets[0], "checks": st.desync_checks, "handoffs": st.worker.handoffs}


def hook_desync(rank: int) -> str:
    """The hook's step check when the ranks' steps disagree (rank 0 saw other buckets in the
    step before): the error every rank gets."""
    st = lptrain.ddp.state(algo="ring")
    check = {"op": "the allreduces of DDP step", "seq": 3, "buckets of the step before": (64, 64 + rank)}
    return one_line_error(lambda: st.agree(check))


def one_line_error(run) -> str:
    try:
        run()
    except Exception as err:  # noqa: BLE001 - the test reads the type and the message
        return f"{type(err).__name__}: {err}"
    return "no error"


def collectives(group, rank: int, world: int) -> dict[str, float]:
    """Worst difference from gloo's own result of all_reduce (sum, avg), broadcast and reduce."""
    worst: dict[str, float] = {}
    for count in (1, 7, 10_001):
        g = torch.Generator().manual_seed(count * 10 + rank)
        mine = torch.randn(count, generator=g, dtype=torch.float64)
        for what, run in {
            "all_reduce": lambda t: dist.all_reduce(t, group=group),
            "all_reduce_avg": lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group),
            "broadcast": lambda t: dist.broadcast(t, src=world - 1, group=group),
            "reduce": lambda t: dist.reduce(t, dst=1 % world, group=group),
        }.items():
            ours, theirs = mine.clone(), mine.clone()
            run(ours)
            if what == "all_reduce_avg":  # gloo has no average: its sum, divided
                dist.all_reduce(theirs)
                theirs /= world
            elif what == "broadcast":
                dist.broadcast(theirs, src=world - 1)
            elif what == "reduce":  # the root gets the sum, the others keep their input
                total = theirs.clone()
                dist.all_reduce(total)
                if rank == 1 % world:
                    theirs = total
            else:
                dist.all_reduce(theirs)
            worst[what] = max(worst.get(what, 0.0), float((ours - theirs).abs().max()))
    # asynchronous: three in flight, then waited for in the order issued
    ts = [torch.full((5,), float(rank + k)) for k in range(3)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in ts]
    for w in works:
        w.wait()
    expected = [sum(r + k for r in range(world)) for k in range(3)]
    worst["async"] = max(abs(float(t[0]) - e) for t, e in zip(ts, expected))
    return worst


def passed_through(group, rank: int, world: int) -> dict[str, bool]:
    """Operations the backend hands to its inner gloo group."""
    ok: dict[str, bool] = {}
    parts = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(parts, torch.full((2,), float(rank)), group=group)
    ok["all_gather"] = all(float(p[0]) == r for r, p in enumerate(parts))
    dist.barrier(group=group)
    ok["barrier"] = True
    peak = torch.tensor([float(rank)])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    ok["all_reduce_max"] = float(peak) == world - 1
    if rank == 0:
        dist.send(torch.tensor([42.0]), dst=1, group=group)
        ok["send_recv"] = True
    elif rank == 1:
        got = torch.zeros(1)
        dist.recv(got, src=0, group=group)
        ok["send_recv"] = float(got) == 42.0
    else:
        ok["send_recv"] = True
    objects: list = [None] * world
    dist.all_gather_object(objects, {"rank": rank}, group=group)
    ok["all_gather_object"] = [o["rank"] for o in objects] == list(range(world))
    return ok


def refusals(group) -> dict[str, str]:
    """Bad input: each should be one line naming the cause."""
    said: dict[str, str] = {}
    said["unknown_algorithm"] = one_line_error(lambda: lptrain.ddp.state(algo="lq"))
    said["unknown_grad_dtype"] = one_line_error(lambda: lptrain.ddp.state(algo="lp", grad_dtype="fp8"))
    model = DistributedDataParallel(network())
    model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)
    said["hook_twice"] = one_line_error(
        lambda: model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)
    )
    sparse = torch.sparse_coo_tensor([[0]], [1.0], (3,))
    said["sparse_broadcast"] = one_line_error(lambda: dist.broadcast(sparse, src=0, group=group))  # all_reduce: gloo's
    said["premul_sum"] = one_line_error(
        lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0), group=group)
    )
    return said


def shared_state(rank: int) -> str:
    """One state registered on two models: the second model's first bucket is refused."""
    shared = lptrain.ddp.state(algo="ring")
    first, second = DistributedDataParallel(network()), DistributedDataParallel(nn.Linear(4, 2))
    first.register_comm_hook(shared, lptrain.ddp.hook)
    second.register_comm_hook(shared, lptrain.ddp.hook)
    x, y = batch(0, rank)
    nn.functional.cross_entropy(first(x), y).backward()
    return one_line_error(lambda: second(torch.ones(3, 4)).sum().backward())


def peer_dies(steps: int, die_at: int, out: str, via: str) -> None:
    """Rank 1 leaves at step ``die_at``; rank 0's backward (``via`` the hook or the backend)
    must fail promptly naming the collective, and the worker must not be left waiting."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if via == "hook":
        state = lptrain.ddp.state(algo="lp", timeout_s=20)
        model = DistributedDataParallel(network(), bucket_cap_mb=0.02)
        model.register_comm_hook(state, lptrain.ddp.hook)
        worker = state.worker
    else:
        group = dist.new_group(backend="lptrain_lp", timeout=datetime.timedelta(seconds=20))
        model = DistributedDataParallel(network(), bucket_cap_mb=0.02, process_group=group)
        worker = group._worker
    for step in range(steps):
        if rank == 1 and step == die_at:
            os._exit(0)  # gone without a word, as a killed process
        x, y = batch(step, rank)
        try:
            nn.functional.cross_entropy(model(x), y).backward()
        except Exception as err:  # noqa: BLE001 - what the user's script would print
            Path(out).write_text(f"{type(err).__name__}: {err}")
            worker.close()  # returns at once: nothing is left running
            os._exit(3)


def main() -> None:
    faulthandler.dump_traceback_later(120, exit=True)  # a hang ends with every thread's stack
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    p.add_argument("--die-at", type=int, default=None, help="rank 1 leaves at this step (the peer_dies case)")
    p.add_argument("--via", default="hook", help="peer_dies through the hook or the backend")
    args = p.parse_args()
    if args.die_at is not None:
        peer_dies(args.steps, args.die_at, args.out, args.via)
        return
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    found: dict = {"world": world, "hook": {}, "backend": {}, "collectives": {}, "passed": {}}
    found["native"] = train(args.steps, rank)
    found["control"] = train(args.steps, rank, lambda m: m.register_comm_hook(None, reversed_order_hook))
    found["native_bf16"] = train(args.steps, rank, lambda m: m.register_comm_hook(None, bf16_compress_hook))
    found["hook_bf16"] = train(
        args.steps,
        rank,
        lambda m: m.register_comm_hook(lptrain.ddp.state(algo="lp", grad_dtype="bf16"), lptrain.ddp.hook),
    )
    for algo in ALGOS:
        found["hook"][algo] = train(
            args.steps, rank, lambda m, a=algo: m.register_comm_hook(lptrain.ddp.state(algo=a), lptrain.ddp.hook)
        )
        group = dist.new_group(backend=f"lptrain_{algo}")
        found["collectives"][algo] = collectives(group, rank, world)
        found["passed"][algo] = passed_through(group, rank, world)
        found["backend"][algo] = train(args.steps, rank, group=group)
    auto = lptrain.ddp.state(algo="auto", topology="racks:2@1/2:interleaved")
    found["hook"]["auto"] = train(args.steps, rank, lambda m: m.register_comm_hook(auto, lptrain.ddp.hook))
    found["auto_choice"] = auto.comm.describe("choice")
    found["counts"] = hook_counts(args.steps, rank)
    found["hook_desync"] = hook_desync(rank)
    found["refusals"] = refusals(dist.new_group(backend="lptrain_lp"))
    found["shared_state"] = shared_state(rank)
    if rank == 0:
        torch.save(found, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
