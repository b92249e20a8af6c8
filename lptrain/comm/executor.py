"""The in-process, multi-device executor: one flat tensor per device, one process.

On CPU the instructions of a plan run in order (any order that respects the
dependencies is correct, and schedule order is one). On CUDA every link direction
``src -> dst`` gets its own stream (one on each end's device), each instruction waits on
the events of the instructions it depends on and records an event when done, copies
between devices are non-blocking peer copies, and reductions run on the receiving
device. The links of a chain therefore really do work at the same time. A block from
another GPU is added through the link's staging buffer, or read in place by the
one-pass peer kernel (``reduce_kernel``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from lptrain.comm.peer_kernel import KernelChoice, check_reduce_kernel, choose_kernel, cupy_available
from lptrain.comm.plan import Buf, Code, Plan
from lptrain.comm.streams import link_stream, stream_for


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


STAGE_BYTES = 8 << 20  # a link's staging buffer: two halves, one filling while the other is added


class CudaLinks:
    """One CUDA stream per link direction and end, ``(src_rank, dst_rank, device)``, and
    what each link keeps from call to call: its staging buffer and its reduction path.

    ``reduce_kernel`` says how a block from another GPU is added: ``staged`` (copied into
    the link's staging buffer by the copy engine, then added), ``peer`` (one kernel on the
    receiver reads the sender's memory, ``lptrain.comm.peer_kernel``) or ``auto`` (both
    measured once per GPU pair, the faster kept; see ``decisions``).
    """

    def __init__(self, devices: Sequence[torch.device], reduce_kernel: str = "auto") -> None:
        self.devices = tuple(devices)
        self.reduce_kernel = check_reduce_kernel(reduce_kernel)
        self._streams: dict[tuple[int, int, int, str], torch.cuda.Stream] = {}
        self._staging: dict[tuple[int, int], torch.Tensor] = {}
        self.decisions: dict[tuple[int, int], KernelChoice] = {}  # (sender GPU, receiver GPU) -> path
        self._reducer = None
        self._syncs: dict[int, tuple[Plan, tuple[Sync, ...]]] = {}  # id(plan) -> the plan, its waits and events

    def syncs(self, plan: Plan) -> tuple[Sync, ...]:
        """``sync_plan`` of ``plan`` on these devices, worked out once per plan (a trainer runs
        the same plans every step; the plan is kept with it, so its id stays its own)."""
        kept = self._syncs.get(id(plan))
        if kept is None or kept[0] is not plan:
            kept = (plan, sync_plan(plan, self.devices))
            self._syncs[id(plan)] = kept
        return kept[1]

    def stream(self, src: int, dst: int, device: torch.device, role: str = "") -> torch.cuda.Stream:
        """Link ``src -> dst``'s stream on ``device``: the process's one for that link
        (``lptrain.comm.streams``: PyTorch's pool holds 32 streams per GPU)."""
        key = (src, dst, device.index, role)
        if key not in self._streams:
            self._streams[key] = link_stream(src, dst, device, role)
        return self._streams[key]

    def all_streams(self) -> list[torch.cuda.Stream]:
        return list(self._streams.values())

    def staging(self, src: int, dst: int, nbytes: int) -> torch.Tensor:
        """Link ``src -> dst``'s staging bytes on the receiver, at least ``2 * min(nbytes,
        STAGE_BYTES / 2)`` of them, kept for later calls (never one buffer per transfer)."""
        want = 2 * min(-(-nbytes // 16) * 16, STAGE_BYTES // 2)
        have = self._staging.get((src, dst))
        if have is None or have.numel() < want:
            have = torch.empty(want, dtype=torch.uint8, device=self.devices[dst])
            self._staging[(src, dst)] = have
        return have

    def reducer(self):
        if self._reducer is None:
            from lptrain.comm.peer_kernel import PeerReducer

            self._reducer = PeerReducer()
        return self._reducer

    def kernel(self, src_dev: torch.device, dst_dev: torch.device) -> str:
        """``peer`` or ``staged`` for blocks from ``src_dev`` added on ``dst_dev``, decided once."""
        key = (src_dev.index, dst_dev.index)
        if key not in self.decisions:
            self.decisions[key] = self._decide(src_dev, dst_dev)
        return self.decisions[key].kernel

    def _decide(self, src_dev: torch.device, dst_dev: torch.device) -> KernelChoice:
        pair = f"{src_dev} -> {dst_dev}"
        if src_dev == dst_dev:  # one GPU: a plain add is one pass already; peer runs the kernel to check it
            if self.reduce_kernel == "peer":
                choose_kernel("peer", cuda=True, have_cupy=cupy_available(), peer_access=True, pair=pair)
                return KernelChoice("peer", "asked for (replicas share this GPU)")
            return KernelChoice("staged", "replicas share this GPU: a plain add, nothing to stage")
        have_cupy = cupy_available()
        peer_access = torch.cuda.can_device_access_peer(dst_dev, src_dev)
        timings = None
        if self.reduce_kernel == "auto" and have_cupy and peer_access:
            timings = measure_paths(self, src_dev, dst_dev)
        return choose_kernel(
            self.reduce_kernel,
            cuda=True,
            have_cupy=have_cupy,
            peer_access=peer_access,
            timings_ms=timings,
            pair=pair,
        )

    def describe(self) -> list[str]:
        """One line per GPU pair decided so far: the path and why."""
        pairs = sorted(self.decisions.items())
        return [f"reduce_kernel cuda:{s} -> cuda:{d}: {c.kernel} ({c.reason})" for (s, d), c in pairs]


def staged_add(
    out: torch.Tensor,
    base: torch.Tensor,
    src: torch.Tensor,
    stage: torch.Tensor,
    half_bytes: int | None = None,
    landing: torch.cuda.Stream | None = None,
) -> None:
    """``out = base + src`` with ``src`` on another GPU, through ``stage`` (bytes on ``out``'s GPU).

    Call with the link's streams current (the sender's on its GPU, the receiver's on
    ``out``'s). The block goes in pieces through the two halves of ``stage``, so that piece
    k+1 is copied while piece k is added. A copy between GPUs runs on the sender's current
    stream, waits for everything queued on the receiver's *current* stream, and makes that
    stream wait for it. Issued with the adds' stream current, each copy would wait for the
    add before it and each add for the copy after it: one at a time. So, with ``landing``
    (a second stream on the receiver, what ``run_cuda`` passes), the copies are issued with
    ``landing`` current and the two streams are tied by events only where the data needs
    it: an add waits for its own piece's copy, and a half is refilled only after the add
    that read it. Without ``landing`` (CPU tensors) the pieces are simply queued in order.
    """
    itemsize = out.element_size()
    half = (half_bytes or stage.numel() // 2) // itemsize
    halves = (stage[: half * itemsize].view(out.dtype), stage[half * itemsize : 2 * half * itemsize].view(out.dtype))
    n = out.numel()
    pieces = [(a, min(a + half, n)) for a in range(0, n, half)]
    adder = _current_stream(out.device) if landing is not None else None
    if landing is not None:  # the halves are free once the adds queued before (earlier blocks) are done
        landing.wait_stream(adder)
    read: list[object | None] = [None, None]  # per half: the event after the last add that read it

    def fetch(k: int) -> tuple[torch.Tensor, object | None]:
        a, b = pieces[k]
        buf = halves[k % 2][: b - a]
        if landing is None:
            _copy_between(buf, src[a:b])
            return buf, None
        if read[k % 2] is not None:
            landing.wait_event(read[k % 2])
        with _on_stream(landing):
            _copy_between(buf, src[a:b])
        return buf, _record(landing)

    staged = fetch(0) if pieces else None
    for k, (a, b) in enumerate(pieces):
        following = fetch(k + 1) if k + 1 < len(pieces) else None
        buf, landed = staged
        if landed is not None:
            adder.wait_event(landed)
        _add_into(out[a:b], base[a:b], buf, base is out)
        if landing is not None:
            read[k % 2] = _record(adder)
        staged = following


# The staged add's stream and copy operations, named so that a test can stand in for them.
def _current_stream(device: torch.device):
    return torch.cuda.current_stream(device)


def _on_stream(stream):
    return torch.cuda.stream(stream)


def _record(stream):
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _copy_between(buf: torch.Tensor, src: torch.Tensor) -> None:
    buf.copy_(src, non_blocking=True)


def _add_into(out: torch.Tensor, base: torch.Tensor, staged: torch.Tensor, in_place: bool) -> None:
    if in_place:
        out.add_(staged)
    else:
        torch.add(base, staged, out=out)


def measure_paths(links: CudaLinks, src_dev: torch.device, dst_dev: torch.device, nbytes: int = 32 << 20) -> dict:
    """Milliseconds per add of a float32 block of ``nbytes`` from ``src_dev`` into
    ``dst_dev``, by each path, timed with CUDA events on streams of their own
    (``reduce_kernel=auto``). Those streams first wait for the buffers' fills (queued on the
    current streams), so no trial reads a buffer being filled or times the fill; the sum
    every trial leaves is checked, so a measurement of work that did not happen is refused."""
    n = nbytes // 4
    src = torch.ones(n, device=src_dev)
    out = torch.zeros(n, device=dst_dev)
    stage = torch.empty(STAGE_BYTES, dtype=torch.uint8, device=dst_dev)
    s_src, s_dst = stream_for(("measure", "sender"), src_dev), stream_for(("measure", "receiver"), dst_dev)
    landing = stream_for(("measure", "landing"), dst_dev) if src_dev != dst_dev else None
    for stream in (s_src, s_dst):
        for device in {src_dev, dst_dev}:
            stream.wait_stream(torch.cuda.current_stream(device))
    reducer = links.reducer()
    paths = {
        "staged": lambda: staged_add(out, out, src, stage, landing=landing),
        "peer": lambda: reducer.add(out, out, src, s_dst),
    }
    times = {}
    runs = 0
    with torch.cuda.stream(s_src), torch.cuda.stream(s_dst):
        for name, run in paths.items():
            run()  # warm-up: compilation, peer mappings
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(s_dst)
            for _ in range(5):
                run()
            end.record(s_dst)
            end.synchronize()
            times[name] = begin.elapsed_time(end) / 5
            runs += 6
    for device in {src_dev, dst_dev}:  # the buffers are freed on return: after every read of them
        torch.cuda.current_stream(device).wait_stream(s_dst)
        torch.cuda.current_stream(device).wait_stream(s_src)
    if not bool((out == runs).all()):
        raise RuntimeError(f"measuring the reduction paths {src_dev} -> {dst_dev}: the sum is wrong")
    return times


StreamKey = tuple[int, int, int]  # a link's stream: (src rank, dst rank, device index)


@dataclass(frozen=True, slots=True)
class Sync:
    """What one instruction of a plan waits for and records on CUDA (``sync_plan``)."""

    waits: tuple[tuple[StreamKey, int], ...]  # (the waiting stream, the instruction whose event it waits for)
    record: bool  # whether an event is recorded after it: a later wait needs it


def sync_plan(plan: Plan, devices: Sequence[torch.device]) -> tuple[Sync, ...]:
    """The stream waits and event records that order ``plan`` on its link streams, no more.

    Each instruction runs on its link's stream on each end's GPU (one stream when both
    replicas share a GPU). It must come after its dependencies; a dependency on its own
    stream is ordered already, and one that an earlier wait ordered (directly, or through
    what the awaited stream had itself waited for) needs no wait of its own. Each stream
    keeps, per other stream, the last instruction it is known to follow (a vector clock),
    so waits implied by earlier ones are dropped, and an event is recorded only after an
    instruction that some wait names. LP issues many blocks per call: one event and one
    to three waits per block were paid whether or not anything needed them."""
    knows: dict[StreamKey, dict[StreamKey, int]] = {}  # stream -> {other stream: last instruction it follows}
    at: list[dict[StreamKey, int]] = []  # instruction -> what its stream knew once it was issued
    home: list[StreamKey] = []  # instruction -> the stream its event would be recorded on
    waits: list[list[tuple[StreamKey, int]]] = []
    needed: set[int] = set()
    for i, ins in enumerate(plan.instrs):
        s_dst: StreamKey = (ins.src, ins.dst, devices[ins.dst].index)
        s_src: StreamKey = (ins.src, ins.dst, devices[ins.src].index)
        mine: list[tuple[StreamKey, int]] = []
        for s in (s_src, s_dst) if s_src != s_dst else (s_src,):
            clock = knows.setdefault(s, {})
            for d in sorted(ins.deps, reverse=True):  # the latest first: it may imply the others
                other = home[d]
                if other == s or clock.get(other, -1) >= d:
                    continue
                mine.append((s, d))
                needed.add(d)
                for stream, last in at[d].items():
                    if clock.get(stream, -1) < last:
                        clock[stream] = last
                clock[other] = d
        knows[s_dst][s_dst] = i
        at.append(dict(knows[s_dst]))
        home.append(s_dst)
        waits.append(mine)
    return tuple(Sync(tuple(w), i in needed) for i, w in enumerate(waits))


def run_cuda(plan: Plan, inputs: Sequence[torch.Tensor], work: Sequence[torch.Tensor], links: CudaLinks) -> None:
    """Run ``plan`` on flat CUDA tensors, one per rank, asynchronously with the host.

    On return the work is queued, and every device's current stream waits for it, so
    later work on the current streams sees the results (as with any CUDA op); so it is
    too when something raises midway (out of memory), for the part already queued.
    Link streams first wait for the current streams of both ends' GPUs, so scratch
    buffers and staging may be reused from call to call.
    """
    devices = links.devices
    entry = {d.index: torch.cuda.current_stream(d) for d in devices}
    bufs = (inputs, work)
    ready: set[int] = set()
    used: list[torch.cuda.Stream] = []
    peer_reads: set[tuple[int, torch.cuda.Stream]] = set()  # (GPU read from, the reading stream)
    done: dict[int, torch.cuda.Event] = {}  # instruction -> its event, where a later wait needs one
    syncs = links.syncs(plan)
    try:
        for i, ins in enumerate(plan.instrs):
            src_dev, dst_dev = devices[ins.src], devices[ins.dst]
            s_src = links.stream(ins.src, ins.dst, src_dev)
            s_dst = links.stream(ins.src, ins.dst, dst_dev)
            for s in (s_src, s_dst) if s_src is not s_dst else (s_src,):
                if id(s) not in ready:  # first use in this call: wait for the caller's work on both GPUs
                    for index in {src_dev.index, dst_dev.index}:
                        s.wait_stream(entry[index])
                    ready.add(id(s))
                    used.append(s)
            for (_, _, index), d in syncs[i].waits:
                (s_src if index == src_dev.index else s_dst).wait_event(done[d])
            src = bufs[ins.src_buf][ins.src][ins.start : ins.stop]
            dst = bufs[ins.dst_buf][ins.dst][ins.start : ins.stop]
            base = dst if ins.code is Code.ADD else bufs[Buf.INPUT][ins.dst][ins.start : ins.stop]
            with torch.cuda.stream(s_src), torch.cuda.stream(s_dst):
                if ins.code is Code.COPY:
                    dst.copy_(src, non_blocking=True)
                elif links.kernel(src_dev, dst_dev) == "peer":
                    links.reducer().add(dst, base, src, s_dst)
                    if src_dev != dst_dev:
                        peer_reads.add((src_dev.index, s_dst))
                elif src_dev != dst_dev:
                    landing = links.stream(ins.src, ins.dst, dst_dev, "landing")
                    if id(landing) not in ready:  # waits for s_dst inside staged_add; listed for the finally
                        ready.add(id(landing))
                        used.append(landing)
                    stage = links.staging(ins.src, ins.dst, dst.numel() * dst.element_size())
                    staged_add(dst, base, src, stage, landing=landing)
                elif base is dst:
                    dst.add_(src)
                else:
                    torch.add(base, src, out=dst)
            if syncs[i].record:
                event = torch.cuda.Event()
                event.record(s_dst)
                done[i] = event
    finally:
        for stream in used:
            entry[stream.device.index].wait_stream(stream)
        for index, stream in peer_reads:  # the sender's memory is free again only after the peer reads
            entry[index].wait_stream(stream)
