"""Wall-clock phases of an iteration: CUDA events on GPUs, the host clock on the CPU."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from lptrain.comm.ranges import phase_range


def slowest_timeline(marks_ms: Sequence[Sequence[float]]) -> list[float]:
    """Phase durations from each device's marks, counting what the step waited for once.

    ``marks_ms[d]`` holds device ``d``'s begin and end marks of each phase in order, in
    milliseconds since its own first mark (the step's start, when every device is idle
    and the host records the marks back to back). A phase ends when the last device
    reaches its end, and begins when the last device reaches its begin: so compute ends
    with the slowest device's compute, and communication counts from there, not from the
    moment a fast device started waiting for the slow one. The durations add up to the
    step's length. (Taking each phase's slowest device separately would count that wait
    twice: once in compute, once in the fast device's communication.)
    """
    if not marks_ms:
        return []
    latest = [max(device[i] for device in marks_ms) for i in range(len(marks_ms[0]))]
    return [max(latest[2 * k + 1] - latest[2 * k], 0.0) for k in range(len(latest) // 2)]


class PhaseTimer:
    """Times named phases of one step; ``elapsed_ms()`` returns them once the step is done.

    On CUDA each phase is bracketed by events on every device's current stream and the
    phases are read off the slowest device's timeline (``slowest_timeline``); on the CPU
    work is synchronous and the host clock is exact. Each phase is also a profiler range
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

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        events = []
        for d in self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record(torch.cuda.current_stream(d))
            events.append(e)
        return events

    def elapsed_ms(self) -> dict[str, float]:
        if not self.cuda:
            out = {phase: (self._marks[phase][1] - self._marks[phase][0]) * 1e3 for phase in self._order}
        else:
            marks = [mark for phase in self._order for mark in self._marks[phase]]  # begin, end, begin, ...
            for event in marks[-1]:
                event.synchronize()
            per_device = [[first.elapsed_time(m[d]) for m in marks] for d, first in enumerate(marks[0])]
            out = dict(zip(self._order, slowest_timeline(per_device)))
        self._marks.clear()
        self._order.clear()
        return out
