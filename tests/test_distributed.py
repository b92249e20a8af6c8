"""The schedules over torch.distributed (gloo on loopback): correctness, desync, faults."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import distributed_workers as workers  # tests/ is on the path: pyproject's pytest pythonpath
import pytest
import torch.multiprocessing as mp

from lptrain.comm.algorithms import SCHEDULES

ALGOS = [*SCHEDULES, "nccl"]  # nccl here: the backend's own collective


@pytest.mark.parametrize("world, counts", [(2, [0, 1, 7, 101]), (3, [0, 1, 7, 101]), (5, [1, 13]), (8, [1, 13])])
def test_collectives_across_processes_match_the_reference(tmp_path, world, counts):
    mp.spawn(workers.correctness, args=(world, str(tmp_path / "store"), ALGOS, counts), nprocs=world)


def test_a_large_message_across_processes(tmp_path):
    mp.spawn(workers.correctness, args=(4, str(tmp_path / "store"), ["lp", "be", "ring"], [100_003]), nprocs=4)


def test_small_segments_and_a_short_window_across_processes(tmp_path):
    """Messages cut into many segments, few receives posted ahead: still the reference sums."""
    options = {"segment_size": 64, "window": 2}
    mp.spawn(
        workers.correctness,
        args=(3, str(tmp_path / "store"), ["lp", "mst", "be", "ring", "auto"], [1, 257], options),
        nprocs=3,
    )


def test_every_algorithm_over_a_rank_order_across_processes(tmp_path):
    """A permutation of the ranks (racks made contiguous): still the reference sums, every root."""
    options = {"order": [3, 1, 0, 2], "segment_size": 64}
    mp.spawn(workers.correctness, args=(4, str(tmp_path / "store"), list(SCHEDULES), [1, 257], options), nprocs=4)


def test_each_step_as_one_batch_across_processes(tmp_path):
    """The step-by-step batched executor that NCCL gets, here over gloo: the reference sums."""
    options = {"segment_size": 64, "batched_steps": True}
    mp.spawn(
        workers.correctness, args=(3, str(tmp_path / "store"), ["lp", "mst", "be", "ring"], [1, 257], options), nprocs=3
    )


def test_a_rank_calling_a_different_collective_fails_on_every_rank(tmp_path):
    mp.spawn(workers.desync, args=(3, str(tmp_path / "store"), str(tmp_path)), nprocs=3)
    for rank in range(3):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        assert text.startswith("DesyncError"), text
        assert "'op': 'allreduce', 'shape': (10,)" in text and "'op': 'broadcast', 'shape': (12,)" in text


def test_a_destroyed_group_is_freed_and_a_communicator_on_it_says_so(tmp_path):
    mp.spawn(workers.released, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        freed, said = (tmp_path / f"rank{rank}.txt").read_text().split("\n", 1)
        assert freed == "freed=True", "a communicator kept the process group alive"
        assert said.startswith("CollectiveError") and "destroy_process_group" in said, said


def _run_fault(tmp_path: Path, how: str) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=workers.fault, args=(r, 3, str(tmp_path / "store"), str(tmp_path), how)) for r in range(3)
    ]
    for p in procs:
        p.start()
    deadline = time.time() + 90
    for p in procs[:2]:
        p.join(max(1, deadline - time.time()))
    procs[2].kill()  # the stalled victim, if still asleep
    for p in procs:
        p.join(10)
        assert not p.is_alive(), "a process hung"
    return [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]


# Bounds, not timings: a death is noticed at once, a stall at the 3 s timeout, both well before
# the stalled victim would exit by itself (15 s), which is what would end a hang.
@pytest.mark.parametrize("how, within", [("die", 10.0), ("stall", 12.0)])
def test_survivors_of_a_dead_or_stalled_rank_stop_with_a_clear_error(tmp_path, how, within):
    for text in _run_fault(tmp_path, how):
        assert text.startswith("CollectiveError after"), text
        took = float(text.split("after ")[1].split("s:")[0])
        assert took < within, text
        assert "allreduce #0 (lp) step" in text and "rank" in text.split("failed")[0]


def test_automatic_segments_are_a_ranks_share_within_1_to_4_mib():
    from lptrain.comm.distributed import auto_segment_bytes

    mib = 1 << 20
    assert auto_segment_bytes(16 * mib, 4) == 4 * mib  # the share: a ring's chunk goes as one message
    assert auto_segment_bytes(8 * mib, 4) == 2 * mib
    assert auto_segment_bytes(256 * mib, 2) == 4 * mib  # at most 4 MiB
    assert auto_segment_bytes(mib, 4) == mib  # at least 1 MiB
    assert auto_segment_bytes(7, 3) == mib


def test_a_fast_link_gets_the_share_per_message_unpaced_and_a_slow_one_short_paced_segments():
    """Where the CPU sets the time (a fast measured link) a message is a rank's share (1 to
    4 MiB) and sends are not paced; on a slow link a message holds the link for as long as it
    carries 10 ms, and sends are paced at its rate. The messages per call tell them apart."""
    from lptrain.comm.algorithms import ring
    from lptrain.comm.distributed import auto_segment_bytes
    from lptrain.comm.program import pacing_rate, rank_program
    from lptrain.comm.transport import LinkCost

    mib, n, p = 1 << 20, 64 << 20, 2
    fast, slow = LinkCost(80e-6, 1 / 3e9), LinkCost(80e-6, 1 / 25e6)
    schedule = ring.allreduce(p, n // 4)
    messages = {
        name: len(rank_program(schedule, 0, auto_segment_bytes(n, p, link) // 4))
        for name, link in (("fast", fast), ("slow", slow), ("none", None))
    }
    assert messages == {"fast": 4 * 8, "slow": 4 * (32 * mib // (256 << 10)), "none": 4 * 8}
    assert pacing_rate(3e9) == 0.0 and pacing_rate(500e6) == 0.0 and pacing_rate(None) == 0.0
    assert pacing_rate(25e6) == 25e6
    # Racks joined by a thinner uplink: the ring's slowest link is the uplink's, its fastest a
    # port's, and a rank's port drains at the port's rate (PortQueue).
    assert pacing_rate(6.25e6, 25e6) == 25e6 and pacing_rate(3e9, 3e9) == 0.0


def test_the_link_measured_keeps_the_fastest_receive_of_the_ring_as_a_ports_rate():
    """The ranks cut their messages by the ring's slowest link, and pace their sends at its
    fastest receive (a port's, where some neighbours share a rack); where it is not 1.25x
    apart from the slowest, the two are one figure."""
    from lptrain.comm.distributed import link_rate, port_rate
    from lptrain.comm.transport import link_cost

    mib4 = 4 << 20
    racks = link_cost(100e-6, 100e-6 + mib4 / 6.25e6, fastest_large_s=100e-6 + mib4 / 25e6)
    assert link_rate(racks) == pytest.approx(6.25e6) and port_rate(racks) == pytest.approx(25e6)
    assert racks.describe() == "100 us per message, 6.2 MB/s (a port 25.0 MB/s)"
    star = link_cost(100e-6, 100e-6 + mib4 / 25e6)
    assert port_rate(star) == pytest.approx(25e6) and star.describe() == "100 us per message, 25.0 MB/s"
    assert port_rate(None) is None


def test_the_link_measured_on_two_racks_of_two_finds_the_port_by_the_fastest_receive(tmp_path):
    """On two racks of two every exchange of the ring crosses the uplink one way or the other,
    so exchange times alone find no port; a receive crosses one link, and two of the four are
    in a rack: the ranks agree on the uplink's rate for the link and the port's for pacing."""
    import json

    p = 4
    mp.spawn(workers.link_on_racks, args=(p, str(tmp_path / "store"), str(tmp_path)), nprocs=p)
    figures = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(p)]
    assert all(f == figures[0] for f in figures), figures
    beta, port_beta = figures[0]
    assert 1 / beta == pytest.approx(12.5e6, rel=1e-3) and port_beta is not None
    assert 1 / port_beta == pytest.approx(25e6, rel=1e-3)


def test_the_executor_follows_the_measured_link_across_processes(tmp_path):
    """Four gloo processes, the link's measurement replaced by a fast and a slow figure: per
    call, a 64 MiB ring allreduce sends 4 MiB messages on the fast link and 256 KiB ones on
    the slow link, and copies none of its allgather out of staging slots on the fast link;
    BE's sends are paced on a slow link and never on a fast one (at 600 MB/s, barely fast,
    the rule before paced BE's later steps), nor where only the ring's slowest link is slow
    (racks of fast ports: a port drains at its own rate); BE's allreduce takes a rank's share per message
    on either link, its broadcast the slow link's short messages."""
    import json

    p = 4
    mp.spawn(workers.link_rules, args=(p, str(tmp_path / "store"), str(tmp_path)), nprocs=p)
    for r in range(p):
        counts = json.loads((tmp_path / f"rank{r}.json").read_text())
        share = 4 * (p - 1) * 4  # 2 (P - 1) steps, each 16 MiB cut into four 4 MiB sends and receives
        # and its allgather's receives land in place on the fast link; on the slow one some are
        # posted ahead into staging slots, so that their notices go before this rank's sends
        assert counts["ring fast"] == [share, share, 0, 1, 0], counts
        assert counts["ring slow"][0] == 4 * (p - 1) * (16 << 20) // (256 << 10), counts
        assert counts["ring slow"][4] > 0, counts
        assert counts["be fast"][2] == 0 and counts["be slow"][2] > 0, counts
        # a slow uplink between racks of fast ports: the messages of the slow link, paced at the port's rate
        assert counts["be racks"][0] == counts["be slow"][0] and counts["be racks"][2] == 0, counts
        # BE's allreduce of 1 MiB over 4 on the slow link (steps of 512, 256, 256 and 512 KiB
        # each way) in 1 MiB messages (the share's floor), one send and one receive a step, where
        # the link's own 64 KiB messages made 48 (lptrain.comm.program.MESSAGE_RULES); of 16 MiB
        # on the fast link, in 4 MiB messages (8, 4, 4 and 8 MiB steps)
        assert counts["be slow"][0] == 8 and counts["be fast"][0] == 12, counts
        if r == 0:  # the root of its broadcast sends 1.5 n: in 64 KiB messages on the slow link
            assert counts["be slow broadcast"] == 24 and counts["be fast broadcast"] == 6, counts


def test_reduce_keeps_its_copy_of_a_non_roots_tensor_from_call_to_call(tmp_path):
    """A rank other than the root reduces a copy of its tensor (its own is left as it was).
    A fresh copy per call faulted all of its pages in every time (4096 for 16 MiB) and, with
    more ranks than cores, made those ranks enter the schedule tens of milliseconds after the
    root (BE's reduce over 8 emulated nodes: 1.82 to 2.13 n/B against the model's 1.75); the
    copy is now kept, so a call faults in a small fraction of the message's pages."""
    import json

    p = 3
    mp.spawn(workers.reduce_page_faults, args=(p, str(tmp_path / "store"), str(tmp_path)), nprocs=p)
    pages = (16 << 20) // 4096
    for r in range(p):
        faults = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert all(f < pages / 8 for f in faults.values()), (r, faults)


def test_distributed_options_are_checked():
    from lptrain.communicators import CollectiveInputError, build_communicator

    # devices and a group together make a hierarchy, which needs torch.distributed to be up
    with pytest.raises(CollectiveInputError, match="torch.distributed is not initialised"):
        build_communicator("lp", ["cpu"], process_group=object())
    with pytest.raises(CollectiveInputError, match="needs devices"):
        build_communicator("lp")


def test_lp_sizes_its_blocks_for_the_measured_transport_and_every_rank_agrees(tmp_path):
    mp.spawn(workers.measured_blocks, args=(3, str(tmp_path / "store"), str(tmp_path)), nprocs=3)
    seen = {(tmp_path / f"rank{r}.txt").read_text() for r in range(3)}
    assert len(seen) == 1, seen  # the same figures, so the same blocks, on every rank


def test_a_link_cost_comes_from_a_small_and_a_large_exchange():
    from lptrain.comm.algorithms import lp, schedule_builders
    from lptrain.comm.algorithms.options import Sizing
    from lptrain.comm.transport import LinkCost, link_cost

    cost = link_cost(50e-6, 50e-6 + (4 << 20) / 2e9)
    assert cost.alpha_s == 50e-6 and cost.beta_s_per_byte == pytest.approx(1 / 2e9)
    assert cost.describe() == "50 us per message, 2.00 GB/s"
    noisy = link_cost(2.6e-3, 2.0e-3)  # the large exchange no slower than the small one
    assert noisy.beta_s_per_byte == pytest.approx(2.0e-3 / (4 << 20))  # a finite bandwidth, not 1000 GB/s
    # The blocks follow the figures: a dearer message means fewer, larger blocks.
    n = 64 << 20
    cheap, dear = LinkCost(10e-6, 1 / 2e9), LinkCost(200e-6, 1 / 2e9)
    blocks = {}
    for name, link in (("cheap", cheap), ("dear", dear)):
        builders, _ = schedule_builders("lp", 8, sizing=Sizing(link.alpha_s, link.beta_s_per_byte))
        blocks[name] = builders["allreduce"](8, n // 4, None, 4).num_steps
    assert blocks["dear"] < blocks["cheap"]
    assert lp.optimal_block_bytes(n, 8, dear.alpha_s, dear.beta_s_per_byte) > lp.optimal_block_bytes(
        n, 8, cheap.alpha_s, cheap.beta_s_per_byte
    )


def test_lp_blocks_on_a_slow_link_are_what_it_carries_in_a_few_ms_not_a_segment():
    """On a slow link a chain's fill costs P - 2 blocks of link time, and a message's cost
    overlaps the transfer: LP's automatic block is what the link carries in 5 ms (128 KiB at
    200 Mbit/s, half the 256 KiB segment), not the cost model's block floored at the segment,
    which measured 1.48 n/B against 1.15 for a 4 MiB broadcast on 16 emulated nodes."""
    from lptrain.comm.algorithms import schedule_builders
    from lptrain.comm.build import link_sizing
    from lptrain.comm.distributed import segment_bytes
    from lptrain.comm.transport import LinkCost

    slow = LinkCost(1.7e-3, 1 / 25e6)  # 200 Mbit/s as lptrain-cluster's ports measure
    n = 4 << 20

    def blocks(link, world, op="broadcast", fixed=None) -> int:
        builders, _ = schedule_builders("lp", world, {}, link_sizing(link, fixed, world, on_cpu=True))
        steps = builders[op](world, n // 4, 0, 4).num_steps
        fill = 2 * world - 3 if op == "allreduce" else world - 2
        return steps - fill

    assert segment_bytes(None, n, 8, slow) == 256 << 10
    assert blocks(slow, 8) == blocks(slow, 16) == n // (128 << 10)
    assert blocks(slow, 8, "reduce") == blocks(slow, 8, "allreduce") == n // (128 << 10)
    assert blocks(slow, 8, fixed=256 << 10) == n // (256 << 10)  # a fixed segment stays the floor
    fast = LinkCost(100e-6, 1 / 1.8e9)  # loopback: the CPU sets the time, blocks stay large
    assert blocks(fast, 8) <= n // (1 << 20)


def test_the_simulator_prices_lp_at_the_block_the_executor_runs_on_a_measured_link():
    """auto prices LP at the block the executor would run: on a model measured across
    processes (overlapped) at 200 Mbit/s, the link's 128 KiB block; on a model of GPUs in one
    process the cost model's."""
    from lptrain.sim.predict import lp_block_bytes
    from lptrain.sim.topology import oneport

    measured = oneport(8, bandwidth=25e6, latency=1e-4, overhead=1.7e-3)
    measured.overlapped, measured.link_rate = True, 25e6
    assert lp_block_bytes(measured, 4 << 20, "broadcast") == 128 << 10
    assert lp_block_bytes(measured, 16 << 20, "allreduce") == 128 << 10
    assert lp_block_bytes(oneport(8), 4 << 20, "broadcast") >= 256 << 10


def test_lp_blocks_across_processes_are_no_smaller_than_a_segment():
    """The executor pipelines a transfer by segments already: LP's automatic block is floored
    at the segment, and a larger model block is kept."""
    from lptrain.comm.algorithms import schedule_builders
    from lptrain.comm.algorithms.options import HOST, Sizing
    from lptrain.comm.transport import LinkCost

    link = LinkCost(100e-6, 1 / 1e9)  # the model's block for 16 MiB over 4 ranks: about 0.9 MiB
    n = (16 << 20) // 4

    def steps(link=None, min_block=None, **options) -> int:
        figures = HOST if link is None else Sizing(link.alpha_s, link.beta_s_per_byte)
        builders, _ = schedule_builders("lp", 4, options, figures.floored(min_block))
        return builders["allreduce"](4, n, None, 4).num_steps

    floored = steps(link=link, min_block=lambda nbytes: nbytes // 4)
    assert floored == steps(block_size="4M") < steps(link=link)
    assert steps(link=link, min_block=lambda nbytes: 1) == steps(link=link)  # a low floor changes nothing
