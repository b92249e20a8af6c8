"""Pure tests of the schedules: no tensors, only symbols and step counts."""

from __future__ import annotations

import math
import random

import pytest

from lptrain.comm.algorithms import MODULES, WITH_VARIANTS, be, lp, mst, ring, schedule_builders
from lptrain.comm.algorithms.order import relabel
from lptrain.comm.schedule import Kind, Schedule, Transfer
from lptrain.comm.verify import ScheduleError, verify

# Every module in MODULES with its default options (an algorithm added there is verified
# here), and LP with small blocks and in both allreduce modes.
BUILDERS = {
    **{name: (module, {}) for name, module in MODULES.items()},
    "lp": (lp, {"block": 3}),
    "lp-one-element-blocks": (lp, {"block": 1}),
    "lp-rb": (lp, {"block": 4, "mode": "reduce_broadcast"}),
}


def _rooted_kwargs(module, kw):
    return {k: v for k, v in kw.items() if k != "mode"}


def _roots(p: int) -> list[int]:
    return list(range(p)) if p <= 9 else sorted({0, 1, p // 2, p - 1})


@pytest.mark.parametrize("key", BUILDERS)
@pytest.mark.parametrize("p", range(1, 65))
def test_every_destination_gets_every_contribution_exactly_once(key, p):
    module, kw = BUILDERS[key]
    for count in sorted({1, 2, p - 1 or 1, p + 3, 2 * p + 1, 23}):
        verify(module.allreduce(p, count, **kw))
        for root in _roots(p):
            verify(module.reduce(p, count, root, **_rooted_kwargs(module, kw)))
            verify(module.broadcast(p, count, root, **_rooted_kwargs(module, kw)))


@pytest.mark.parametrize("key", BUILDERS)
def test_empty_message_has_no_transfers(key):
    module, kw = BUILDERS[key]
    for p in (1, 4):
        assert module.allreduce(p, 0, **kw).transfers == ()
        assert module.broadcast(p, 0, 0, **_rooted_kwargs(module, kw)).num_steps == 0


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_lp_step_counts_match_the_paper(p, k):
    n = 10 * k
    assert lp.broadcast(p, n, 0, block=10).num_steps == p - 2 + k
    assert lp.reduce(p, n, 0, block=10).num_steps == p - 2 + k
    assert lp.allreduce(p, n, block=10, mode="overlapped").num_steps == 2 * p - 3 + k
    assert lp.allreduce(p, n, block=10, mode="reduce_broadcast").num_steps == 2 * (p - 2 + k)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_lp_overlapped_uses_both_directions_of_each_link_at_once(p):
    s = lp.allreduce(p, 80, block=10, mode="overlapped")
    middle = s.steps[s.num_steps // 2]
    directions = {(t.src, t.dst) for t in middle}
    assert any((b, a) in directions for a, b in directions), "no link carries traffic both ways in one step"


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13, 16, 33, 64])
def test_mst_takes_ceil_log2_p_rounds_of_whole_messages(p):
    rounds = math.ceil(math.log2(p))
    for s in (mst.broadcast(p, 100, 0), mst.reduce(p, 100, p - 1)):
        assert s.num_steps == rounds
        assert all(t.count == 100 for t in s.transfers)
    assert mst.allreduce(p, 100).num_steps == 2 * rounds


def test_mst_pairs_like_caffe():
    steps = mst.reduce(4, 8, 0).steps
    assert {(t.src, t.dst) for t in steps[0]} == {(1, 0), (3, 2)}
    assert {(t.src, t.dst) for t in steps[1]} == {(2, 0)}


@pytest.mark.parametrize("p", [2, 4, 8, 16, 32, 64])
def test_be_power_of_two_moves_2_p_minus_1_over_p_of_the_message_per_rank(p):
    n = 64 * p
    s = be.allreduce(p, n)
    assert s.num_steps == 2 * int(math.log2(p))
    sent = [0] * p
    for t in s.transfers:
        sent[t.src] += t.count
    assert sent == [2 * (p - 1) * n // p] * p


@pytest.mark.parametrize("p", [3, 5, 6, 7, 12])
def test_be_non_power_of_two_folds_extras_in_and_out(p):
    s = be.allreduce(p, 10 * p)
    pof2 = 1 << (p.bit_length() - 1)
    assert s.num_steps == 2 * int(math.log2(pof2)) + 2
    assert all(t.count == 10 * p for t in s.steps[0]) and len(s.steps[0]) == p - pof2


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_ring_allreduce_sends_2_p_minus_1_over_p_per_rank(p):
    n = 7 * p
    s = ring.allreduce(p, n)
    assert s.num_steps == 2 * (p - 1)
    sent = [0] * p
    for t in s.transfers:
        sent[t.src] += t.count
        assert (t.dst - t.src) % p == 1, "ring transfers go to the next rank only"
    assert sent == [2 * (p - 1) * 7] * p


def test_broadcasts_never_send_into_the_root():
    for module, kw in BUILDERS.values():
        for root in range(5):
            assert all(t.dst != root for t in module.broadcast(5, 50, root, **_rooted_kwargs(module, kw)).transfers)


def test_lp_chain_order_is_followed():
    s = lp.broadcast(4, 10, 2, block=10, order=[3, 1, 2, 0])
    assert [(t.src, t.dst) for t in s.transfers] == [(2, 0), (0, 3), (3, 1)]
    with pytest.raises(ValueError, match="permutation of 0..3, the ranks"):
        lp.broadcast(4, 10, 0, block=10, order=[0, 1, 1, 2])
    with pytest.raises(ValueError, match="valid modes: overlapped, reduce_broadcast"):
        lp.allreduce(4, 10, block=10, mode="tree")


def test_optimal_block_size_follows_the_cost_model():
    # PAPER.md's example: PCIe Gen3, n = 240 MB, P = 4 -> b* ~ 4.5 MB.
    b = lp.optimal_block_bytes(240_000_000, 4)
    assert 4.0e6 < b < 5.0e6
    assert lp.optimal_block_bytes(1000, 8) == lp.MIN_AUTO_BLOCK_BYTES
    assert lp.optimal_block_bytes(10**10, 3) == lp.MAX_AUTO_BLOCK_BYTES


def test_schedules_print_readably():
    text = str(lp.allreduce(3, 4, block=2))
    assert text.splitlines()[0] == "lp(block=2, overlapped) allreduce P=3 count=4: 5 steps, 8 transfers"
    assert "step 0: 1[0:2] += 0" in text


# -- the checker itself must catch broken schedules -------------------------------------


def _sched(op, p, count, root, steps):
    return Schedule(op, "hand-made", p, count, root, tuple(tuple(Transfer(*t) for t in step) for step in steps))


def test_checker_catches_a_contribution_counted_twice():
    bad = _sched(
        "reduce", 3, 4, 0, [[(1, 0, 0, 4, Kind.REDUCE)], [(2, 1, 0, 4, Kind.REDUCE)], [(1, 0, 0, 4, Kind.REDUCE)]]
    )
    with pytest.raises(ScheduleError, match="a second time"):
        verify(bad)


def test_checker_catches_a_missing_contribution():
    bad = _sched(
        "allreduce", 3, 4, None, [[(1, 0, 0, 4, Kind.REDUCE)], [(0, 1, 0, 4, Kind.COPY), (0, 2, 0, 4, Kind.COPY)]]
    )
    with pytest.raises(ScheduleError, match=r"holds only \[0, 1\]"):
        verify(bad)


def test_checker_catches_replicas_that_are_not_bitwise_identical():
    # Both ranks end with 0+1, but each computed its own sum: equal numbers, not equal bits.
    bad = _sched("allreduce", 2, 4, None, [[(1, 0, 0, 4, Kind.REDUCE), (0, 1, 0, 4, Kind.REDUCE)]])
    with pytest.raises(ScheduleError):
        verify(bad)


def test_checker_catches_a_race_within_a_step():
    bad = _sched("broadcast", 3, 4, 0, [[(0, 1, 0, 4, Kind.COPY), (1, 2, 0, 4, Kind.COPY)]])
    with pytest.raises(ScheduleError, match="same step"):
        verify(bad)


def test_checker_catches_a_broadcast_that_misses_a_rank():
    bad = _sched("broadcast", 3, 4, 0, [[(0, 1, 0, 4, Kind.COPY)]])
    with pytest.raises(ScheduleError, match="rank 2"):
        verify(bad)


def test_schedule_rejects_malformed_transfers():
    with pytest.raises(ValueError, match="outside 0..1"):
        _sched("broadcast", 2, 4, 0, [[(0, 2, 0, 4, Kind.COPY)]])
    with pytest.raises(ValueError, match="to itself"):
        _sched("broadcast", 2, 4, 0, [[(0, 0, 0, 4, Kind.COPY)]])
    with pytest.raises(ValueError, match="out-of-range"):
        _sched("broadcast", 2, 4, 0, [[(0, 1, 2, 9, Kind.COPY)]])
    with pytest.raises(ValueError, match="valid ops"):
        Schedule("gather", "x", 2, 4, 0, ())


# -- rank orders: every algorithm over a permutation of the ranks ----------------------------


def _orders(p: int) -> dict[str, list[int]]:
    """Reversed; evens then odds (racks of interleaved ranks made contiguous); a shuffle."""
    shuffled = list(range(p))
    random.Random(p).shuffle(shuffled)
    return {
        "reversed": list(reversed(range(p))),
        "evens-then-odds": [*range(0, p, 2), *range(1, p, 2)],
        "shuffled": shuffled,
    }


@pytest.mark.parametrize("algo", WITH_VARIANTS)
@pytest.mark.parametrize("p", [*range(1, 18), 31, 32, 33, 64])
def test_every_algorithm_over_any_order_is_still_its_collective(algo, p):
    for name, order in _orders(p).items():
        builders, settled = schedule_builders(algo, p, {"order": order, **({"block_size": 8} if "lp" in algo else {})})
        assert settled["order"] == order, name
        for count in sorted({1, p + 3, 23}):
            verify(builders["allreduce"](p, count, None, 4))
            for root in _roots(p):
                verify(builders["reduce"](p, count, root, 4))
                verify(builders["broadcast"](p, count, root, 4))


@pytest.mark.parametrize("module", MODULES.values(), ids=list(MODULES))
def test_an_order_puts_rank_order_i_in_place_i_and_roots_stay_ranks(module):
    order = [2, 0, 3, 1]
    keywords = {"block": 5} if module is lp else {}
    builders, _ = schedule_builders(module.NAME, 4, {"order": order, **({"block_size": 20} if module is lp else {})})
    place = {rank: i for i, rank in enumerate(order)}
    for op in ("allreduce", "broadcast", "reduce"):
        for root in [None] if op == "allreduce" else range(4):
            ordered = builders[op](4, 50, root, 4)
            plain = (
                getattr(module, op)(4, 50, **keywords)
                if root is None
                else getattr(module, op)(4, 50, place[root], **keywords)
            )
            assert ordered.root == root
            assert [(place[t.src], place[t.dst], t.start, t.stop, t.kind) for t in ordered.transfers] == [
                (t.src, t.dst, t.start, t.stop, t.kind) for t in plain.transfers
            ]


def test_a_ring_over_a_rack_contiguous_order_crosses_between_racks_twice_per_step():
    """Racks {0, 2} and {1, 3}: the natural ring crosses at every hop; evens-then-odds twice."""
    rack = {0: 0, 2: 0, 1: 1, 3: 1}
    for order, crossings in (([0, 1, 2, 3], 4), ([0, 2, 1, 3], 2)):
        schedule = schedule_builders("ring", 4, {"order": order})[0]["allreduce"](4, 400, None, 4)
        for step in schedule.steps:
            assert sum(rack[t.src] != rack[t.dst] for t in step) == crossings


def test_lps_own_order_and_the_generic_order_give_the_same_chain():
    order = [3, 1, 0, 2]
    for root in range(4):
        own = lp.broadcast(4, 40, root, block=10, order=order)
        built = schedule_builders("lp", 4, {"order": order, "block_size": 40})[0]["broadcast"](4, 40, root, 4)
        assert own.transfers == built.transfers
    own = lp.allreduce(4, 40, block=10, order=order)
    assert own.transfers == relabel(lp.allreduce(4, 40, block=10), order).transfers
