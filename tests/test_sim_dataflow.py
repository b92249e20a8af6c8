"""The event simulator of the multi-process executor (lptrain.sim.dataflow) against the
one-port model's closed forms: a full-duplex port, max-min fair sharing, FIFO per pair."""

import pytest

from lptrain.comm.algorithms import be, lp, mst, ring
from lptrain.comm.schedule import Kind, Schedule, Transfer
from lptrain.sim.dataflow import _Flow, fair_rates, simulate_dataflow
from lptrain.sim.topology import Link, oneport, racks

B = 25e6  # bytes per second, one way, per port
N = 1 << 22  # elements (16 MiB of float32)
SEGMENT = 1 << 16  # elements (256 KiB)
ORDERS = ("steps", "eager")


def _port(p: int):
    return oneport(p, bandwidth=B, latency=0.0, overhead=0.0, gamma=0.0)


def _multiple(schedule, p: int, order: str) -> float:
    return simulate_dataflow(schedule, _port(p), SEGMENT, order=order) / (N * 4 / B)


def test_fair_rates_split_a_link_and_give_what_one_flow_cannot_use_to_the_other():
    fast, slow = Link("fast", 10.0, 0.0), Link("slow", 2.0, 0.0)
    a = _Flow(0, 1, (0, 1, 0), (fast,), 1.0, 0.0)
    b = _Flow(2, 1, (2, 1, 0), (fast, slow), 1.0, 0.0)
    fair_rates([a, b])
    assert b.rate == pytest.approx(2.0) and a.rate == pytest.approx(8.0)
    c = _Flow(3, 1, (3, 1, 0), (fast,), 1.0, 0.0)
    fair_rates([a, c])
    assert a.rate == pytest.approx(5.0) and c.rate == pytest.approx(5.0)


def test_an_exchange_costs_one_direction_on_a_full_duplex_port():
    step = (Transfer(0, 1, 0, N, Kind.COPY), Transfer(1, 0, 0, N, Kind.COPY))
    schedule = Schedule(op="allreduce", algorithm="exchange", world_size=2, count=N, root=None, steps=(step,))
    assert simulate_dataflow(schedule, _port(2), SEGMENT) == pytest.approx(N * 4 / B, rel=1e-6)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_be_and_ring_allreduce_meet_the_one_port_bound(p):
    bound = 2 * (p - 1) / p
    assert _multiple(be.allreduce(p, N), p, be.ISSUE_ORDER["allreduce"]) == pytest.approx(bound, rel=0.02)
    assert _multiple(ring.allreduce(p, N), p, ring.ISSUE_ORDER["allreduce"]) == pytest.approx(bound, rel=0.02)


def test_lp_broadcast_is_flat_in_p_and_mst_pays_log_p():
    block = SEGMENT
    lp_times = [_multiple(lp.broadcast(p, N, 0, block=block), p, lp.ISSUE_ORDER["broadcast"]) for p in (2, 4, 8)]
    assert all(1.0 <= t < 1.12 for t in lp_times), lp_times
    assert _multiple(mst.broadcast(8, N, 0), 8, mst.ISSUE_ORDER["broadcast"]) == pytest.approx(3.0, rel=0.03)


def test_eager_issue_lets_be_sends_to_two_partners_share_a_port():
    """Eager, BE's later-step sends start before their step and split the port with the
    current one wherever the receiver has posted far enough ahead (here, a window with no
    bound); its broadcast also needs each step's receives in first (``steps``)."""
    far = oneport(4, bandwidth=B, latency=0.0, overhead=0.0, gamma=0.0)
    steps, eager = (simulate_dataflow(be.allreduce(4, N), far, SEGMENT, order=o, window=1 << 30) for o in ORDERS)
    assert steps < eager
    assert _multiple(be.broadcast(4, N, 0), 4, "steps") < _multiple(be.broadcast(4, N, 0), 4, "ports")
    assert be.ISSUE_ORDER["broadcast"] == "steps"


def test_a_schedule_for_other_ranks_is_refused():
    with pytest.raises(ValueError, match="P=4 but the topology 2"):
        simulate_dataflow(ring.allreduce(4, 64), _port(2), 16)


def test_the_simulator_cuts_messages_where_the_executor_does():
    """``segment="auto"`` follows the executor's rule on the rate it would measure: on a fast
    link a ring's step is one message, on a slow one 256 KiB segments, and the time priced
    is that of the program with those segments."""
    from lptrain.comm.distributed import auto_segment_bytes
    from lptrain.comm.program import rank_program
    from lptrain.comm.transport import LinkCost
    from lptrain.sim.dataflow import auto_segment

    schedule = ring.allreduce(4, N)
    for rate in (3e9, 25e6):
        topology = oneport(4, bandwidth=rate, latency=0.0, overhead=0.0, gamma=0.0)
        executor = auto_segment_bytes(N * 4, 4, LinkCost(80e-6, 1 / rate)) // 4
        assert auto_segment(schedule, topology) == executor
        assert simulate_dataflow(schedule, topology, "auto") == simulate_dataflow(schedule, topology, executor)
    fast = oneport(4, bandwidth=3e9, latency=0.0, overhead=0.0, gamma=0.0)
    assert len(rank_program(schedule, 0, auto_segment(schedule, fast))) == 4 * 3
    with pytest.raises(ValueError, match="segment"):
        simulate_dataflow(schedule, fast, "big")


def _shaped(p: int, burst: float):
    return oneport(p, bandwidth=B, latency=0.0, overhead=0.0, gamma=0.0, burst_bytes=burst)


def _one_message(nbytes: int) -> Schedule:
    count = nbytes // 4
    step = (Transfer(0, 1, 0, count, Kind.COPY),)
    return Schedule(op="broadcast", algorithm="one", world_size=2, count=count, root=0, steps=(step,))


def test_a_real_link_has_no_bucket_unless_the_topology_names_one():
    assert all(link.burst == 0.0 for link in _port(4).route(0, 3))
    assert all(link.burst == 1 << 17 for link in _shaped(4, 1 << 17).route(0, 3))
    thin = racks(4, 2, B, B / 2, 0.0, 0.0, 0.0, burst_bytes=1 << 17)  # a port's bucket; the uplinks' left out
    assert [link.burst for link in thin.route(0, 3)] == [1 << 17, 0.0, 1 << 17]
    assert simulate_dataflow(_one_message(1 << 20), _port(2), 1 << 18) == pytest.approx((1 << 20) / B)


def test_an_idle_shaped_port_sends_its_bucket_at_once_then_runs_at_its_rate():
    """A token bucket of ``burst`` bytes, full after an idle spell: a message's first
    ``burst`` bytes pass at once and the rest at B; a message no larger than the bucket
    lands at once; the next message on a port kept busy finds the bucket empty."""
    burst = 128 << 10
    assert simulate_dataflow(_one_message(1 << 20), _shaped(2, burst), 1 << 18) == pytest.approx(
        ((1 << 20) - burst) / B
    )
    assert simulate_dataflow(_one_message(burst), _shaped(2, burst), burst // 4) == pytest.approx(0.0, abs=1e-12)
    # four messages back to back on one pair: only the first finds the bucket full
    assert simulate_dataflow(_one_message(1 << 20), _shaped(2, burst), 1 << 16) == pytest.approx(
        ((1 << 20) - burst) / B
    )


def test_a_pipelines_fill_costs_half_a_segment_a_hop_where_the_bucket_is_half_a_segment():
    """LP's chain: each hop's port idles while the segment before comes in, and refills its
    bucket in that time, so each hop passes half of every segment at once. The fill of
    P - 2 hops costs (P - 2) / 2 segments instead of P - 2."""
    p, segment = 6, SEGMENT  # 256 KiB segments, 64 of them
    schedule = lp.broadcast(p, N, 0, block=segment)
    order = lp.ISSUE_ORDER["broadcast"]
    seconds_per_segment = segment * 4 / B
    real = simulate_dataflow(schedule, _port(p), segment, order=order)
    shaped = simulate_dataflow(schedule, _shaped(p, segment * 4 / 2), segment, order=order)
    assert real == pytest.approx(N * 4 / B + (p - 2) * seconds_per_segment, rel=1e-6)
    assert shaped == pytest.approx(N * 4 / B + (p - 2) / 2 * seconds_per_segment - seconds_per_segment / 2, rel=1e-6)


def test_sends_are_paced_at_a_ports_rate_so_be_on_racks_does_not_wait_for_the_uplink_after_an_in_rack_step():
    """On a slow link the executor holds a send to a new peer until the earlier steps' bytes
    would have left its port (``lptrain.comm.program.PortQueue``). It drains that queue at a
    port's rate, the fastest link of the ring it measured at start, not the slowest: on two
    racks of two joined by an uplink at a quarter of a port, BE's allreduce at P = 4 then takes
    0.5 + 2 + 2 + 0.5 = 5 n/B, as unpaced. Paced at the uplink's rate (the ring's slowest link,
    as the executor did until 2026-12-06) it waited after its in-rack step as if those bytes
    had crossed the uplink: 2 + 2 + 2 + 0.5 = 6.5 n/B (the emulated cluster measured 6.4)."""
    from lptrain.sim.dataflow import measured_rate, port_rate, run_dataflow
    from lptrain.sim.topology import racks

    quarter = racks(4, 2, B, B / 4, 0.0, 0.0, 0.0)
    assert measured_rate(quarter) == B / 4 and port_rate(quarter) == B
    schedule, order, unit = be.allreduce(4, N), be.ISSUE_ORDER["allreduce"], N * 4 / B
    assert simulate_dataflow(schedule, quarter, SEGMENT, order=order) / unit == pytest.approx(5.0, rel=0.02)
    unpaced = run_dataflow(schedule, quarter, SEGMENT, order=order, drain_bytes_per_s=0.0).seconds
    assert unpaced / unit == pytest.approx(5.0, rel=0.02)
    paced = run_dataflow(schedule, quarter, SEGMENT, order=order, drain_bytes_per_s=B / 4).seconds
    assert paced / unit == pytest.approx(6.5, rel=0.02)
    # One rack to a node: every link of the ring crosses an uplink, which is then the port.
    assert port_rate(racks(4, 4, B, B / 4, 0.0, 0.0, 0.0)) == B / 4
    # On one switch the port is the link measured: pacing holds nothing back.
    assert _multiple(schedule, 4, order) == pytest.approx(1.5, rel=0.02)


def test_the_simulator_cuts_each_ops_messages_by_its_algorithms_rule():
    """BE's allreduce takes a rank's share per message on a slow link as well (its module's
    ``MESSAGES``), its broadcast and every other algorithm the link's own 10 ms; the simulator
    asks the same rule as the executor, so it prices the program the executor runs."""
    from lptrain.comm.algorithms import be, message_rule_of, message_rules
    from lptrain.comm.distributed import auto_segment_bytes
    from lptrain.comm.program import MESSAGE_RULES
    from lptrain.comm.transport import LinkCost
    from lptrain.sim.dataflow import auto_segment

    assert set(message_rules("be").values()) <= set(MESSAGE_RULES)
    assert message_rules("be")["allreduce"] == "share" and message_rules("be")["broadcast"] == "link"
    assert set(message_rules("ring").values()) == set(message_rules("lp-rb").values()) == {"link"}
    n, p, rate = 4 << 20, 16, 25e6
    slow = oneport(p, bandwidth=rate, latency=0.0, overhead=0.0, gamma=0.0)
    for schedule, expected in ((be.allreduce(p, n // 4), 1 << 20), (be.broadcast(p, n // 4, 0), 256 << 10)):
        rule = message_rule_of(schedule)
        assert auto_segment_bytes(n, p, LinkCost(80e-6, 1 / rate), rule) == expected, schedule.op
        assert auto_segment(schedule, slow) * 4 == expected, schedule.op
    assert message_rule_of(ring.allreduce(4, N)) == "link"
    with pytest.raises(ValueError, match="message rule"):
        auto_segment_bytes(n, p, None, "whole")


def test_a_send_is_done_once_the_kernel_holds_its_tail_so_a_parents_next_child_starts_that_much_early():
    """gloo reports a send done when its bytes are written to the socket, not when they land.
    A parent serving one child at a time (``ports``) sends to rank 1 across an uplink at a
    quarter of a port (4 n/B), then to rank 2 in its own rack. Counted from delivery, the
    second send starts at 4 n/B and ends at 5; with a send buffer of half the message it
    starts when half is still to cross (2 n/B) and, sharing the parent's port with the
    uplink's flow (3/4 of it), ends at 2 + 4/3, before the first: 4 n/B in all."""
    from lptrain.sim.dataflow import run_dataflow
    from lptrain.sim.topology import Topology

    slow, fast, own = Link("uplink", B / 4, 0.0), Link("0->2", B, 0.0), Link("port 0", B, 0.0)
    routes = {(0, 1): (own, slow), (0, 2): (own, fast)}
    steps = ((Transfer(0, 1, 0, N, Kind.COPY),), (Transfer(0, 2, 0, N, Kind.COPY),))
    schedule = Schedule(op="broadcast", algorithm="two", world_size=3, count=N, root=0, steps=steps)
    unit = N * 4 / B

    def seconds(buffer: float) -> float:
        topology = Topology("t", 3, 0.0, 0.0, lambda a, b: routes[(a, b)], send_buffer=buffer)
        return run_dataflow(schedule, topology, SEGMENT * 16, order="ports", drain_bytes_per_s=0.0).seconds

    assert seconds(0.0) / unit == pytest.approx(5.0, rel=1e-6)
    assert seconds(N * 4 / 2) / unit == pytest.approx(4.0, rel=1e-6)
    # An eighth: the second send starts at 3.5, moves 3/4 x 0.5 beside the uplink's tail
    # until 4, and the remaining 0.625 alone at the port's rate.
    assert seconds(N * 4 / 8) / unit == pytest.approx(4.625, rel=1e-6)
    assert seconds(N * 4 * 2) / unit == pytest.approx(4.0, rel=1e-6)  # a buffer past the message: from the start
