"""What the in-process CUDA path issues per call, counted on the CPU with stand-ins.

LP moves the same bytes as the ring, BE and MST, but on one GPU shared by four replicas
it reached half their bandwidth: it pays per block (a launch, an event, its waits), and
it issued many more blocks. These tests run ``run_cuda`` with recording stand-ins for
CUDA's streams and events (the executor's own code, the tensors on the CPU) and check the
plan's waits against an independent replay of what each stream is known to follow.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch

import lptrain.comm.executor as executor
from lptrain.comm.algorithms import schedule_builders
from lptrain.comm.algorithms.options import PCIE
from lptrain.comm.build import device_sizing
from lptrain.comm.executor import CudaLinks, run_cuda, sync_plan
from lptrain.comm.plan import compile_plan

NBYTES = 64 << 20
P = 4


class _Stream:
    def __init__(self, name: str, device: torch.device, counts: Counter) -> None:
        self.name, self.device, self.counts = name, device, counts

    def wait_event(self, event) -> None:
        self.counts["waits"] += 1
        self.counts[f"waited {id(event)}"] = 1

    def wait_stream(self, stream) -> None:
        self.counts["stream waits"] += 1


class _Event:
    counts: Counter

    def record(self, stream) -> None:
        self.counts["events"] += 1
        self.counts[f"recorded {id(self)}"] = 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA's streams and events as recorders; what ``run_cuda`` issues lands in the Counter."""
    counts: Counter = Counter()
    entries: dict[int, _Stream] = {}
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda d: entries.setdefault(d.index, _Stream("entry", d, counts))
    )
    monkeypatch.setattr(torch.cuda, "Event", type("Event", (_Event,), {"counts": counts}))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(executor, "link_stream", lambda src, dst, dev, role="": _Stream(f"{src}->{dst}", dev, counts))
    return counts


def _plan(algo: str, devices: list[torch.device], op: str = "allreduce"):
    """``algo``'s plan as ``build_in_process`` would size it for ``devices``."""
    builders, _ = schedule_builders(algo, len(devices), {}, device_sizing(devices))
    schedule = builders[op](len(devices), NBYTES // 4, None if op == "allreduce" else 0, 4)
    return compile_plan(schedule)


def _issued(algo: str, counts: Counter) -> tuple[int, Counter]:
    devices = [torch.device("cuda", 0)] * P  # four replicas on one GPU, as on the H200
    plan = _plan(algo, devices)
    tensors = [torch.ones(NBYTES // 4) for _ in range(P)]
    counts.clear()
    run_cuda(plan, tensors, tensors, CudaLinks(devices, "staged"))
    assert all(bool((t == P).all()) for t in tensors), f"{algo}: the allreduce on the stand-ins is wrong"
    return len(plan.instrs), Counter(counts)


def test_lp_on_one_shared_gpu_issues_about_what_the_others_do(fake_cuda):
    """Launches (one per instruction), events recorded and waits per call: LP's within 1.5x
    the ring's at 64 MiB over four replicas of one GPU (it issued 276 launches, 276 events
    and 414 waits against the ring's 24, 24 and 32 with PCIe-sized blocks and an event and
    every dependency's wait per block)."""
    ring_launches, ring = _issued("ring", fake_cuda)
    for algo in ("lp", "be", "mst"):
        launches, counts = _issued(algo, fake_cuda)
        assert launches <= 1.5 * ring_launches, f"{algo}: {launches} launches against the ring's {ring_launches}"
        for what in ("events", "waits"):
            assert counts[what] <= 1.5 * max(ring[what], 1), f"{algo}: {counts[what]} {what}, the ring {ring[what]}"


@pytest.mark.parametrize("algo", ["lp", "ring"])
def test_run_cuda_records_only_events_that_are_waited_for_and_waits_at_most_once_per_block(fake_cuda, algo):
    """Before, every instruction recorded an event and waited for each dependency on another
    stream: 1.0 event and 1.5 waits per LP block on one GPU, most of them never needed."""
    launches, counts = _issued(algo, fake_cuda)
    recorded = {k.split()[1] for k in counts if k.startswith("recorded ")}
    waited = {k.split()[1] for k in counts if k.startswith("waited ")}
    assert recorded == waited, f"{algo}: {len(recorded - waited)} events recorded that nothing waits for"
    assert counts["waits"] <= launches, f"{algo}: {counts['waits']} waits for {launches} blocks"


def test_the_one_gpu_sizing_is_chosen_only_where_every_replica_shares_one_gpu():
    one, two = torch.device("cuda", 0), torch.device("cuda", 1)
    assert device_sizing([one] * 4) is not device_sizing([one, two, one, two])
    assert device_sizing([torch.device("cpu")] * 2).beta_s_per_byte > device_sizing([one] * 4).beta_s_per_byte


def _replay(plan, devices, syncs):
    """Each stream's vector clock, replayed from ``syncs`` alone: every dependency on another
    stream must be known to the stream that runs the instruction, every wait must name a
    recorded event, and no wait may name what the stream already follows."""
    knows: dict[tuple, dict[tuple, int]] = {}
    at: list[dict[tuple, int]] = []
    home: list[tuple] = []
    redundant = []
    for i, (ins, sync) in enumerate(zip(plan.instrs, syncs)):
        s_dst = (ins.src, ins.dst, devices[ins.dst].index)
        s_src = (ins.src, ins.dst, devices[ins.src].index)
        for s, d in sync.waits:
            assert syncs[d].record, f"instruction {i} waits for {d}, which records no event"
            clock = knows.setdefault(s, {})
            if clock.get(home[d], -1) >= d:
                redundant.append((i, d))
            for stream, last in at[d].items():
                clock[stream] = max(clock.get(stream, -1), last)
        for s in {s_src, s_dst}:
            clock = knows.setdefault(s, {})
            for d in ins.deps:
                assert home[d] == s or clock.get(home[d], -1) >= d, f"instruction {i} may run before {d}"
        knows[s_dst][s_dst] = i
        at.append(dict(knows[s_dst]))
        home.append(s_dst)
    return redundant


@pytest.mark.parametrize("ngpus", [1, 2, 4])
@pytest.mark.parametrize("algo", ["lp", "mst", "be", "ring"])
@pytest.mark.parametrize("op", ["allreduce", "broadcast", "reduce"])
def test_every_dependency_is_waited_for_once_and_only_needed_events_are_recorded(algo, op, ngpus):
    devices = [torch.device("cuda", r % ngpus) for r in range(P)]
    builders, _ = schedule_builders(algo, P, {"block_size": 1 << 20} if algo == "lp" else {}, PCIE)
    plan = compile_plan(builders[op](P, NBYTES // 4, None if op == "allreduce" else 0, 4), frozenset(range(P)))
    syncs = sync_plan(plan, devices)
    assert not _replay(plan, devices, syncs)
    waited = {d for sync in syncs for _, d in sync.waits}
    assert {i for i, sync in enumerate(syncs) if sync.record} == waited
