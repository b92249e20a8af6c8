"""BE on its one-port model: no partner's next-step bytes come into a port still receiving.

BE changes partner at every step. On a shared host the ranks enter a call out of step, and
a partner that reached the next step early used to send into a rank whose last step's
bytes were still coming in (its receives were posted ahead, and the transport moves a
message as soon as its receive is posted): the two flows split that port, the late step
got later, and its lateness spread to the next partners. The ``steps`` issue order now
posts a step's receives only once the earlier steps' receives are in. Counted two ways:
messages that started flowing into a busy port in the event simulator, and receives the
executor posted while an earlier step's receive was pending.
"""

from __future__ import annotations

import pytest
import torch

from lptrain.comm.algorithms import be, issue_order
from lptrain.comm.dataflow import StagingPool, rank_program, run_program
from lptrain.comm.distributed import DEFAULT_WINDOW
from lptrain.sim import dataflow as sim_dataflow
from lptrain.sim.dataflow import run_dataflow
from lptrain.sim.predict import predict, schedule_for
from lptrain.sim.topology import oneport

B = 25e6  # bytes per second per port and direction (200 Mbit/s)
NBYTES = 4 << 20
SEGMENT = NBYTES // 4 // 16  # elements: 16 segments per whole message
LATE = 0.02  # seconds one rank enters the call after the others (about 0.12 n/B)


def _late_rank_runs(p: int, op: str):
    """``op`` of BE at ``p`` with each of a few ranks late in turn: (time beyond the late
    start over the one-port model, messages that shared a receiving port)."""
    topology = oneport(p, bandwidth=B, latency=1e-4, overhead=1e-4, gamma=0.0)
    schedule = schedule_for("be", op, p, NBYTES // 4, 4)
    model = predict("be", op, topology, NBYTES).seconds
    for late in sorted({0, p // 2, p - 1}):
        starts = [LATE if r == late else 0.0 for r in range(p)]
        run = run_dataflow(schedule, topology, SEGMENT, order=issue_order("be", op), starts=starts)
        yield (run.seconds - LATE) / model, run.shared_arrivals


@pytest.mark.parametrize("op", ["allreduce", "reduce", "broadcast"])
def test_be_stays_on_the_one_port_model_with_a_late_rank_and_shares_no_port(op):
    """P = 2 to 16: within 1.10x of the step-by-step one-port model (beyond the late start),
    and no message ever flows into a port another peer is still sending into."""
    for p in range(2, 17):
        for ratio, shared in _late_rank_runs(p, op):
            assert shared == 0, f"BE {op} P={p}: {shared} messages shared a receiving port"
            assert ratio <= 1.10, f"BE {op} P={p}: {ratio:.3f}x the one-port model"


def test_the_simulator_posts_as_many_receives_ahead_as_the_executor():
    assert sim_dataflow.WINDOW == DEFAULT_WINDOW


@pytest.mark.parametrize("op", ["allreduce", "reduce", "broadcast"])
@pytest.mark.parametrize("p", [3, 4, 5, 8])
def test_the_executor_posts_a_steps_receives_only_after_the_earlier_steps_are_in(op, p):
    """The executor's own count: receives posted while a receive of an earlier step was
    still pending (posted, not yet waited for). None under BE's ``steps`` order."""
    count, segment = 61, 4
    schedule = be.allreduce(p, count) if op == "allreduce" else getattr(be, op)(p, count, 0)
    for r in range(p):
        program = rank_program(schedule, r, segment)
        receives = iter([a for a in program if not a.send])
        pending: dict[int, object] = {}
        early: list[str] = []

        def irecv(buf, peer, receives=receives, pending=pending, early=early):
            a = next(receives)
            waiting = [b for b in pending.values() if b.step < a.step]
            if waiting:
                early.append(f"step {a.step}'s receive from {a.peer} posted before step {waiting[0].step}'s was in")
            handle = object()
            pending[id(handle)] = a
            return handle

        def done(handle, what, pending=pending):
            pending.pop(id(handle), None)

        run_program(program, torch.zeros(count), isend=lambda buf, peer: object(), irecv=irecv, wait=done,
                    pool=StagingPool(), segment_bytes=segment * 4, window=16, num_steps=schedule.num_steps,
                    order=issue_order("be", op))  # fmt: skip
        assert not early, f"BE {op} P={p} rank {r}: {early[0]}"
