"""A step's communication figures, each made once from its timeline (``StepTimeline``).

lptrain's product is what gradient communication costs a step, so these three figures
are defined here and nowhere else (docs/numbers.md states them for the reader):

* ``comm_ms``, **communication**: how long collectives ran. The broadcasts the step waits
  for (batch-norm buffers, the weights in reduce mode) plus every gradient bucket's
  collective: with ``trainer.overlap`` the sum of the buckets' spans on the communication
  thread, without it the training thread's wait for them.
* ``exposed_ms``, **exposed communication**: the part of that the step waited for. The
  broadcasts, plus the part of the buckets' spans that lies inside the training thread's
  wait (from the end of backward to the end of the last collective). A part of a span, so
  never above ``comm_ms``; without overlap, all of it.
* ``handoff_ms``, **hand-off**: the rest of that wait, when the step waited and no
  collective ran: the communication thread waking to take a ready bucket, and its result
  handed back (on a busy CPU, scheduling and Python's GIL: up to a few ms). Without
  overlap there is no thread and it is 0.

So the step is compute + exposed communication + hand-off + update, and none of the three
hides another: the hand-off once counted as exposed communication, which then exceeded
the communication it was part of.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lptrain.train.timing import StepTimeline

# Phases the training thread times around collectives that nothing overlaps.
BROADCAST_PHASES = ("comm_buffers", "comm_params")
# The training thread's wait for the gradients' collectives, from the end of backward.
WAIT_PHASE = "comm"


@dataclass(frozen=True)
class CommTimes:
    comm_ms: float
    exposed_ms: float
    handoff_ms: float


def covered_ms(spans: Sequence[tuple[float, float]], window: tuple[float, float]) -> float:
    """How much of ``window`` the ``spans`` cover (a moment covered twice counts once)."""
    begin, end = window
    covered, cursor = 0.0, begin
    for a, b in sorted(spans):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            covered += b - a
            cursor = b
    return covered


def comm_times(timeline: StepTimeline, overlapped: bool) -> CommTimes:
    """The step's communication, exposed communication and hand-off (see the module's docstring).

    ``overlapped``: the gradients' collectives ran on the communication thread, whose spans
    ``timeline.spans`` holds; otherwise the training thread ran them inside its wait."""
    broadcasts = sum(timeline.ms(phase) for phase in BROADCAST_PHASES)
    wait = timeline.ms(WAIT_PHASE)
    if not overlapped:
        return CommTimes(comm_ms=broadcasts + wait, exposed_ms=broadcasts + wait, handoff_ms=0.0)
    ran = sum(max(b - a, 0.0) for a, b in timeline.spans)
    waited_for = min(covered_ms(timeline.spans, timeline.phases[WAIT_PHASE]), ran, wait)
    return CommTimes(comm_ms=broadcasts + ran, exposed_ms=broadcasts + waited_for, handoff_ms=wait - waited_for)
