"""Wall-clock phases of an iteration: CUDA events on GPUs, the host clock on the CPU."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


class PhaseTimer:
    """Times named phases of one step; ``elapsed_ms()`` returns them once the step is done.

    On CUDA each phase is bracketed by events on every device's current stream and the
    slowest device counts (the collective waits for it anyway); on the CPU work is
    synchronous and the host clock is exact.
    """

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self.cuda = [d for d in dict.fromkeys(devices) if d.type == "cuda"]
        self._marks: dict[str, list] = {}
        self._order: list[str] = []

    def start(self, phase: str) -> None:
        self._marks[phase] = [self._mark()]
        self._order.append(phase)

    def stop(self, phase: str) -> None:
        self._marks[phase].append(self._mark())

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
        out = {}
        for phase in self._order:
            begin, end = self._marks[phase]
            if not self.cuda:
                out[phase] = (end - begin) * 1e3
            else:
                for e in end:
                    e.synchronize()
                out[phase] = max(b.elapsed_time(e) for b, e in zip(begin, end))
        self._marks.clear()
        self._order.clear()
        return out
