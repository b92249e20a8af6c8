"""Wall-clock phases of an iteration: CUDA events on GPUs, the host clock on the CPU.

Every time of a step is read off one timeline: the phases the training thread brackets,
and the spans of the collectives the communication thread runs (``trainer.overlap``),
each as (begin, end) in milliseconds since the step's first mark, on the same clock. What
the step's figures are made of them (communication, the part waited for, the hand-off)
is ``lptrain.train.commtime``'s business.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lptrain.comm.ranges import phase_range

# A point in time: the host clock's seconds on the CPU, one recorded CUDA event per device on GPUs.
Mark = float | list
Span = tuple[Mark, Mark]  # a collective's begin and end marks


def latest_marks(marks_ms: Sequence[Sequence[float]]) -> list[float]:
    """Each mark at the moment the last device reached it: ``marks_ms[d][i]`` is device
    ``d``'s mark ``i`` in ms since its own first mark (the step's start, when every device
    is idle and the host records the marks back to back)."""
    if not marks_ms:
        return []
    return [max(device[i] for device in marks_ms) for i in range(len(marks_ms[0]))]


def slowest_timeline(marks_ms: Sequence[Sequence[float]]) -> list[float]:
    """Phase durations from each device's marks, counting what the step waited for once.

    ``marks_ms[d]`` holds device ``d``'s begin and end marks of each phase in order (as
    ``latest_marks`` takes them). A phase ends when the last device reaches its end, and
    begins when the last device reaches its begin: so compute ends with the slowest
    device's compute, and communication counts from there, not from the moment a fast
    device started waiting for the slow one. The durations add up to the step's length.
    (Taking each phase's slowest device separately would count that wait twice: once in
    compute, once in the fast device's communication.)
    """
    latest = latest_marks(marks_ms)
    return [max(latest[2 * k + 1] - latest[2 * k], 0.0) for k in range(len(latest) // 2)]


@dataclass(frozen=True)
class StepTimeline:
    """One step on one clock: each phase's (begin, end) and each off-thread collective's, in ms
    since the step's first mark (on GPUs, when the last device reached each mark)."""

    phases: dict[str, tuple[float, float]]
    spans: list[tuple[float, float]] = field(default_factory=list)

    def ms(self, phase: str) -> float:
        """How long ``phase`` took (0 for a phase the step did not time)."""
        begin, end = self.phases.get(phase, (0.0, 0.0))
        return max(end - begin, 0.0)

    def durations(self) -> dict[str, float]:
        return {phase: self.ms(phase) for phase in self.phases}


class PhaseTimer:
    """Times named phases of one step; ``timeline()`` returns them once the step is done.

    On CUDA each phase is bracketed by events on every device's current stream and the
    phases are read off the slowest device's timeline (``latest_marks``); on the CPU work
    is synchronous and the host clock is exact. Each phase is also a profiler range
    (``lptrain phase compute`` ...), seen in ``trainer.profile``'s trace.
    """

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self.cuda = [d for d in dict.fromkeys(devices) if d.type == "cuda"]
        self._marks: dict[str, list] = {}
        self._order: list[str] = []
        self._ranges: dict[str, object] = {}

    def start(self, phase: str) -> None:
        self._marks[phase] = [self._mark()]
        self._order.append(phase)
        self._ranges[phase] = phase_range(phase).__enter__()

    def stop(self, phase: str) -> None:
        self._marks[phase].append(self._mark())
        self._ranges.pop(phase).__exit__(None, None, None)

    def _mark(self) -> Mark:
        if not self.cuda:
            return time.perf_counter()
        events = []
        for d in self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record(torch.cuda.current_stream(d))
            events.append(e)
        return events

    def timeline(self, spans: Sequence[Span] = ()) -> StepTimeline:
        """The step's phases and ``spans`` (marks taken on this clock: ``time.perf_counter()``
        on the CPU, an event per device of ``self.cuda`` in that order on GPUs) as one timeline."""
        marks = [mark for phase in self._order for mark in self._marks[phase]]  # begin, end, begin, ...
        every = marks + [mark for span in spans for mark in span]
        if not self.cuda:
            ms = [(mark - marks[0]) * 1e3 for mark in every]
        else:
            for event in [*marks[-1], *(e for span in spans for e in span[1])]:
                event.synchronize()
            ms = latest_marks([[first.elapsed_time(m[d]) for m in every] for d, first in enumerate(marks[0])])
        n = len(marks)
        phases = {phase: (ms[2 * i], ms[2 * i + 1]) for i, phase in enumerate(self._order)}
        self._marks.clear()
        self._order.clear()
        return StepTimeline(phases, [(ms[i], ms[i + 1]) for i in range(n, len(ms), 2)])

    def elapsed_ms(self) -> dict[str, float]:
        """Each phase's duration (the timeline without spans)."""
        return self.timeline().durations()
