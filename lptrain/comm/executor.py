"""The in-process, multi-device executor: one flat tensor per device, one process.

On CPU the instructions of a plan run in order (any order that respects the
dependencies is correct, and schedule order is one). On CUDA every link direction
``src -> dst`` gets its own stream (one on each end's device), each instruction waits on
the events of the instructions it depends on and records an event when done, copies
between devices are non-blocking peer copies, and reductions run on the receiving
device. The links of a chain therefore really do work at the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from lptrain.comm.plan import Buf, Code, Plan


def bind_cpu(plan: Plan, inputs: Sequence[torch.Tensor], work: Sequence[torch.Tensor]) -> list[Callable[[], object]]:
    """``plan``'s instructions as calls on views of these tensors, ready to run again and again.

    ``work[r]`` is rank ``r``'s scratch buffer for the ranks in ``plan.work_ranks`` (and
    may be ``inputs[r]`` elsewhere). Slicing a tensor costs about as much as adding two
    small ones, so a caller that runs the same plan on the same tensors (a training loop's
    gradient buffers) keeps the bound calls and pays for the views once.
    """
    bufs = (inputs, work)
    calls: list[Callable[[], object]] = []
    for ins in plan.instrs:
        src = bufs[ins.src_buf][ins.src][ins.start : ins.stop]
        dst = bufs[ins.dst_buf][ins.dst][ins.start : ins.stop]
        if ins.code is Code.COPY:
            calls.append(partial(dst.copy_, src))
        elif ins.code is Code.ADD:
            calls.append(partial(dst.add_, src))
        else:
            calls.append(partial(torch.add, bufs[Buf.INPUT][ins.dst][ins.start : ins.stop], src, out=dst))
    return calls


class CudaLinks:
    """One CUDA stream per link direction and end: ``(src_rank, dst_rank, device)``."""

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self.devices = tuple(devices)
        self._streams: dict[tuple[int, int, int], torch.cuda.Stream] = {}

    def stream(self, src: int, dst: int, device: torch.device) -> torch.cuda.Stream:
        key = (src, dst, device.index)
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(device=device)
        return self._streams[key]

    def all_streams(self) -> list[torch.cuda.Stream]:
        return list(self._streams.values())


def run_cuda(plan: Plan, inputs: Sequence[torch.Tensor], work: Sequence[torch.Tensor], links: CudaLinks) -> None:
    """Run ``plan`` on flat CUDA tensors, one per rank, asynchronously with the host.

    On return the work is queued, and every device's current stream waits for it, so
    later work on the current streams sees the results (as with any CUDA op). Scratch
    buffers in ``work`` are only touched on link streams that first wait for the current
    streams, so they may be reused from call to call.
    """
    devices = links.devices
    entry = {d.index: torch.cuda.current_stream(d) for d in devices}
    bufs = (inputs, work)
    ready: set[int] = set()
    done: list[tuple[torch.cuda.Event, torch.cuda.Stream]] = []
    for ins in plan.instrs:
        src_dev, dst_dev = devices[ins.src], devices[ins.dst]
        s_src = links.stream(ins.src, ins.dst, src_dev)
        s_dst = links.stream(ins.src, ins.dst, dst_dev)
        for s in {s_src, s_dst}:
            if id(s) not in ready:  # first use in this call: wait for the caller's work
                s.wait_stream(entry[s.device.index])
                ready.add(id(s))
            for d in ins.deps:
                event, stream = done[d]
                if stream != s:
                    s.wait_event(event)
        src = bufs[ins.src_buf][ins.src][ins.start : ins.stop]
        dst = bufs[ins.dst_buf][ins.dst][ins.start : ins.stop]
        with torch.cuda.stream(s_src), torch.cuda.stream(s_dst):
            if ins.code is Code.COPY:
                dst.copy_(src, non_blocking=True)
            else:
                if src_dev != dst_dev:
                    # Stage the incoming block on the receiver, then reduce there. The
                    # peer copy runs on the sender's stream: tell the allocator so.
                    staged = torch.empty_like(dst)
                    staged.copy_(src, non_blocking=True)
                    staged.record_stream(s_src)
                    src = staged
                if ins.code is Code.ADD:
                    dst.add_(src)
                else:
                    torch.add(bufs[Buf.INPUT][ins.dst][ins.start : ins.stop], src, out=dst)
        event = torch.cuda.Event()
        event.record(s_dst)
        done.append((event, s_dst))
    for stream in links.all_streams():
        if id(stream) in ready:
            entry[stream.device.index].wait_stream(stream)
