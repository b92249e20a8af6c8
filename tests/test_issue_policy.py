"""The issue policy (lptrain.comm.program): what a send waits for under each issue order,
asked by the executor (lptrain.comm.dataflow) and by its simulator (lptrain.sim.dataflow)
from the same place."""

from __future__ import annotations

import pytest
import torch

from lptrain.comm import program as programs
from lptrain.comm.dataflow import StagingPool, run_program
from lptrain.comm.program import ISSUE_ORDERS, IssuePolicy, Waits, issue_policy, rank_program
from lptrain.comm.schedule import Kind, Schedule, Transfer
from lptrain.sim.dataflow import simulate_dataflow
from lptrain.sim.topology import private

C, R = Kind.COPY, Kind.REDUCE


def _schedule(steps: list[list[tuple[int, int, int, int, Kind]]], count: int = 8) -> Schedule:
    return Schedule("broadcast", "hand-made", 3, count, 0, tuple(tuple(Transfer(*t) for t in s) for s in steps))


# Rank 0's program, one action per transfer (segment 8), sends first within a step:
#   0: step 0 send to 2 [4,8)    1: step 0 receive (add) from 1 [0,4)
#   2: step 1 send to 1 [4,8)    3: step 1 send to 2 [0,4)    4: step 1 receive (add) from 2 [4,8)
#   5: step 2 send to 2 [6,8)    6: step 2 receive from 1 [0,2)
HAND_MADE = [
    [(0, 2, 4, 8, C), (1, 0, 0, 4, R)],
    [(0, 1, 4, 8, C), (0, 2, 0, 4, C), (2, 0, 4, 8, R)],
    [(0, 2, 6, 8, C), (1, 0, 0, 2, C)],
]
# send index -> order -> (applied, sends, receives), worked out by hand from the table above
EXPECTED = {
    0: {order: ((), (), ()) for order in ISSUE_ORDERS},
    2: {"eager": ((), (), ()), "ports": ((), (0,), ()), "steps": ((), (0,), (1,))},  # 0 went to another peer
    3: {"eager": ((1,), (), ()), "ports": ((1,), (), ()), "steps": ((1,), (), (1,))},  # 0 went to the same peer
    5: {"eager": ((4,), (), ()), "ports": ((4,), (2,), ()), "steps": ((4,), (2,), (1, 4))},
}
for _send in EXPECTED.values():  # a gather's sends wait as under "ports"; only its receives differ
    _send["gather"] = _send["ports"]
    # phases: the earlier steps' receives as under "steps", no earlier sends
    _send["phases"] = (_send["eager"][0], (), _send["steps"][2])


def test_the_hand_made_program_is_the_one_the_expectations_describe():
    program = rank_program(_schedule(HAND_MADE), 0, 8)
    shape = [(a.step, a.send, a.peer, a.start, a.stop) for a in program]
    assert shape == [
        (0, True, 2, 4, 8),
        (0, False, 1, 0, 4),
        (1, True, 1, 4, 8),
        (1, True, 2, 0, 4),
        (1, False, 2, 4, 8),
        (2, True, 2, 6, 8),
        (2, False, 1, 0, 2),
    ]


@pytest.mark.parametrize("order", ISSUE_ORDERS)
def test_each_order_says_which_earlier_actions_a_send_waits_for(order):
    program = rank_program(_schedule(HAND_MADE), 0, 8)
    policy = issue_policy(order)
    for index, by_order in EXPECTED.items():
        assert policy.waits(program, program[index]) == Waits(*by_order[order]), f"send {index} under {order}"


def test_an_unknown_order_is_refused_by_the_executor_and_the_simulator_alike():
    with pytest.raises(ValueError, match="unknown issue order 'sideways'"):
        issue_policy("sideways")
    with pytest.raises(ValueError, match="unknown issue order 'sideways'"):
        simulate_dataflow(_schedule(HAND_MADE), private(3), 8, order="sideways")


class _OneSendAtATime(IssuePolicy):
    """Every send waits until every earlier send is done, whatever its step or peer."""

    def sends_first(self, send, issued) -> list[int]:
        return list(issued)


def _fan_out(count: int) -> Schedule:
    """Rank 0 sends the whole message to ranks 1 and 2 in one step: "ports" lets both go at once."""
    return _schedule([[(0, 1, 0, count, C), (0, 2, 0, count, C)]], count)


def _sends_in_flight_at_each_send(order: str) -> list[int]:
    """Run rank 0's program of ``_fan_out``; at each send, how many earlier sends were not yet waited for."""
    pending: set[int] = set()
    seen: list[int] = []

    def isend(buf, peer):
        seen.append(len(pending))
        handle = object()
        pending.add(id(handle))
        return handle

    def done(handle, what):
        pending.discard(id(handle))

    run_program(rank_program(_fan_out(8), 0, 8), torch.zeros(8), isend=isend, irecv=None, wait=done,
                pool=StagingPool(), segment_bytes=32, window=4, num_steps=1, order=order)  # fmt: skip
    return seen


def test_a_policy_swapped_in_drives_the_executor_and_the_simulator_both(monkeypatch):
    """The executor and the simulator look the order up in one table: replace "ports" there
    with a policy that lets one send go at a time, and both serialise rank 0's two sends."""
    n, bandwidth = 1 << 10, 1e6
    topology = private(3, bandwidth=bandwidth, latency=0.0, overhead=0.0, gamma=0.0)
    one_send = n * 4 / bandwidth
    assert _sends_in_flight_at_each_send("ports") == [0, 1]
    assert simulate_dataflow(_fan_out(n), topology, n, order="ports") == pytest.approx(one_send)
    monkeypatch.setitem(programs.ISSUE_POLICIES, "ports", _OneSendAtATime("ports", True, False))
    assert _sends_in_flight_at_each_send("ports") == [0, 0]
    assert simulate_dataflow(_fan_out(n), topology, n, order="ports") == pytest.approx(2 * one_send)


def _peers_sending_at_once(schedule: Schedule, rank: int, order: str, window: int = 16) -> int:
    """Run ``rank``'s program of ``schedule``: the most peers it had receives posted from at once."""
    pending: dict[int, int] = {}  # id(handle) -> peer
    most = 0

    def irecv(buf, peer):
        nonlocal most
        handle = object()
        pending[id(handle)] = peer
        most = max(most, len(set(pending.values())))
        return handle

    def done(handle, what):
        pending.pop(id(handle), None)

    program = rank_program(schedule, rank, 64)
    run_program(program, torch.zeros(schedule.count), isend=lambda buf, peer: object(), irecv=irecv, wait=done,
                pool=StagingPool(), segment_bytes=256, window=window, num_steps=schedule.num_steps,
                order=order)  # fmt: skip
    return most


@pytest.mark.parametrize("p, root", [(4, 0), (8, 3), (13, 12)])
def test_the_ring_reduce_root_takes_its_gather_from_two_peers_at_a_time(p, root):
    """The ring's reduce ends with every other rank sending its reduced chunk to the root.
    Posted all at once, the P - 1 senders start together into the root's port and, now and
    then, overflow its queue (TCP incast: one call in four to seven took 1.1 to 1.6 times the median of the
    others on 12 and 16 emulated nodes); the root takes them two peers at a time, in the
    executor and in the simulator alike (they ask the same policy)."""
    from lptrain.comm.algorithms import issue_order, ring

    schedule = ring.reduce(p, 61 * p, root)
    order = issue_order("ring", "reduce")
    assert _peers_sending_at_once(schedule, root, order) == 2
    assert issue_policy(order).receiving_peers == 2
    assert _peers_sending_at_once(schedule, root, "ports") == p - 1  # as the gather was posted before


@pytest.mark.parametrize("p", [3, 8])
def test_the_simulator_prices_the_gather_two_senders_at_a_time(p):
    """On a star of private ports the gather's bytes all cross the root's port, so taking two
    senders at a time costs the ring reduce nothing in the model: (P - 1) / P n/B each half."""
    from lptrain.comm.algorithms import issue_order, ring
    from lptrain.sim.topology import oneport

    n = 1 << 12
    topology = oneport(p, bandwidth=1.0, latency=0.0, overhead=0.0, gamma=0.0)
    schedule = ring.reduce(p, n, 0)
    for order in ("ports", issue_order("ring", "reduce")):
        assert simulate_dataflow(schedule, topology, n, order=order) == pytest.approx(2 * (p - 1) / p * 4 * n, rel=0.02)


def test_lps_reduce_then_broadcast_holds_its_broadcast_until_the_reduce_is_in():
    """LP's allreduce as a reduce, then a broadcast: by data alone the chain's last rank may
    start the broadcast while the reduce's last blocks still come in, into the port of the
    next rank, which needs it for the reduce (the critical path) and forwards the broadcast
    only after the reduce anyway. Its issue order (``phases``) holds every send until the
    earlier steps' receives are in; the simulator prices the difference on a star of
    one-port nodes (4 MiB, 128 KiB blocks, 64 KiB messages): eager, the allreduce costs
    more than a reduce and a broadcast one after the other; held back, it does not."""
    from lptrain.comm.algorithms import issue_order, lp
    from lptrain.sim.topology import oneport

    assert issue_order("lp-rb", "allreduce") == "phases"
    assert issue_order("lp", "allreduce", {"allreduce": "reduce_broadcast"}) == "phases"
    assert issue_order("lp", "allreduce") == "eager" and issue_order("lp-rb", "reduce") == "eager"
    p, count, block, segment = 4, 1 << 20, 32 << 10, 16 << 10  # elements: 4 MiB, 128 KiB, 64 KiB of float32
    topology = oneport(p, bandwidth=25e6, latency=0.0, overhead=0.0, gamma=0.0)
    one_way = sum(simulate_dataflow(getattr(lp, op)(p, count, 0, block=block), topology, segment)
                  for op in ("reduce", "broadcast"))  # fmt: skip
    rb = lp.allreduce(p, count, block=block, mode="reduce_broadcast")
    assert simulate_dataflow(rb, topology, segment, order="eager") > 1.07 * one_way
    assert simulate_dataflow(rb, topology, segment, order=issue_order("lp-rb", "allreduce")) < 1.04 * one_way
