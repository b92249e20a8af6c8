"""Compile a schedule into executable instructions over real buffers.

Two things separate a schedule from what an executor runs:

* Buffers. A collective is in place, but a reduce must not clobber the inputs of the
  non-root ranks it passes partial sums through. Such ranks get a *work* buffer; the
  first write into each range of it is fused with the read of the input
  (``work = input + incoming``), so preserving the inputs costs no extra pass over
  memory, and reads of ranges not yet written come from the input itself.
* Dependencies. Each instruction lists the earlier instructions it must wait for
  (read-after-write on its source, write-after-read and write-after-write on its
  destination), so an asynchronous executor (CUDA streams and events) may run
  everything else concurrently; a sequential executor simply runs them in order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lptrain.comm.schedule import Kind, Schedule, segment_bounds, segments_in


class Buf(enum.IntEnum):
    """Which buffer of a rank an instruction touches."""

    INPUT = 0  # the caller's tensor
    WORK = 1  # a scratch buffer that keeps the caller's tensor unchanged


class Code(enum.Enum):
    COPY = "copy"  # dst = src
    ADD = "add"  # dst += src
    ADD_INPUT = "add_input"  # dst(work) = input(dst rank) + src


@dataclass(frozen=True, slots=True)
class Instr:
    code: Code
    src: int
    src_buf: Buf
    dst: int
    dst_buf: Buf
    start: int
    stop: int
    deps: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """A schedule lowered to instructions; ``work_ranks`` need a scratch buffer."""

    schedule: Schedule
    instrs: tuple[Instr, ...]
    work_ranks: frozenset[int]


def compile_plan(schedule: Schedule, preserve: frozenset[int] = frozenset()) -> Plan:
    """Lower ``schedule``; the inputs of the ranks in ``preserve`` are never written."""
    bounds = segment_bounds(schedule)
    nseg = len(bounds) - 1
    work_ranks = frozenset(t.dst for t in schedule.transfers) & preserve
    initialised = {r: [False] * nseg for r in work_ranks}
    tracker = _Hazards(nseg)
    instrs: list[Instr] = []

    for t in schedule.transfers:
        pieces: list[tuple[Code, Buf, Buf, int, int]] = []
        for s in segments_in(bounds, t.start, t.stop):
            src_buf = Buf.WORK if t.src in work_ranks and initialised[t.src][s] else Buf.INPUT
            code = Code.COPY if t.kind is Kind.COPY else Code.ADD
            if t.dst in work_ranks:
                dst_buf = Buf.WORK
                if not initialised[t.dst][s]:
                    code = Code.COPY if t.kind is Kind.COPY else Code.ADD_INPUT
                    initialised[t.dst][s] = True
            else:
                dst_buf = Buf.INPUT
            if pieces and pieces[-1][:3] == (code, src_buf, dst_buf):
                pieces[-1] = (code, src_buf, dst_buf, pieces[-1][3], s + 1)
            else:
                pieces.append((code, src_buf, dst_buf, s, s + 1))
        for code, src_buf, dst_buf, s0, s1 in pieces:
            segs = range(s0, s1)
            reads = [(t.src, src_buf)] + ([(t.dst, Buf.INPUT)] if code is Code.ADD_INPUT else [])
            deps = tracker.access(len(instrs), reads=reads, write=(t.dst, dst_buf), segs=segs)
            instrs.append(Instr(code, t.src, src_buf, t.dst, dst_buf, bounds[s0], bounds[s1], deps))
    return Plan(schedule, tuple(instrs), work_ranks)


class _Hazards:
    """Last writer and readers since, per (rank, buffer, segment)."""

    def __init__(self, nseg: int) -> None:
        self.nseg = nseg
        self.writer: dict[tuple[int, Buf], list[int | None]] = {}
        self.readers: dict[tuple[int, Buf], list[list[int]]] = {}

    def _lists(self, key: tuple[int, Buf]) -> tuple[list[int | None], list[list[int]]]:
        if key not in self.writer:
            self.writer[key] = [None] * self.nseg
            self.readers[key] = [[] for _ in range(self.nseg)]
        return self.writer[key], self.readers[key]

    def access(self, index: int, reads: list[tuple[int, Buf]], write: tuple[int, Buf], segs: range) -> tuple[int, ...]:
        deps: set[int] = set()
        for key in reads:
            writer, readers = self._lists(key)
            for s in segs:
                if writer[s] is not None:
                    deps.add(writer[s])
                readers[s].append(index)
        writer, readers = self._lists(write)
        for s in segs:
            if writer[s] is not None:
                deps.add(writer[s])
            deps.update(r for r in readers[s] if r != index)
            writer[s] = index
            readers[s] = []
        return tuple(sorted(deps))
