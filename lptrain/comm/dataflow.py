"""One rank's part of a schedule, run as a dataflow over point-to-point messages.

The lock-step way to run a schedule across processes (post a step's messages, wait for
all of them, then add what came in) leaves the links idle while a rank adds and every
rank idle while the slowest message of a step is in flight. Here each rank's sends and
receives are cut into segments and run as soon as their own inputs are ready:

* a segment is sent as soon as the earlier receives that wrote its elements have
  arrived and been applied, not when the whole previous step has;
* receives are posted ahead (a window of them), so that a peer's send finds its buffer
  waiting; a reducing receive lands in a persistent staging slot, reused from call to
  call, and is added the moment it is waited for, while later segments are in flight;
* a copying receive lands straight in its destination when nothing earlier still
  reads or writes those elements, and in a staging slot (one copy more) when something
  does, rather than being posted late;
* receives are posted before sends: at the start of a call and before every send the
  window of receives is filled first.

The last two matter on a network. Gloo moves a message only once the receiver has said
that its receive is posted, and that notice travels on the same connection as the data,
behind whatever the receiver is sending itself: a receive posted after a 4 MiB send
reaches the peer 4 MiB later, so the two directions of a link took turns instead of
running together (a 16 MiB ring allreduce between two ranks on 200 Mbit/s links took
1.6 times the one-direction time, and 1.02 times once receives went first).

The arithmetic is the lock-step executor's: every element gets the same additions in
the same order (receives are applied in the schedule's order, and a step's sends carry
the values from before that step's receives), so results are bitwise the same.

How far steps may overlap is the algorithm's choice (``ISSUE_ORDERS``): ``eager`` sends
a segment whenever its data is in (LP's pipeline); ``ports`` first waits until this
rank's sends of earlier steps to other peers are done (a tree's parent serves one child
at a time, where all at once would share its port); ``steps`` also applies every receive
of earlier steps first (BE, whose steps each exchange with a new partner and add what the
last one brought).

Messages between two ranks match in the order they are posted, so sends are issued and
receives posted in program order; the look-ahead stops at the first receive it may not
post yet. Every wait names the step and the peer it was for.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lptrain.comm.schedule import Kind, Schedule

ISSUE_ORDERS = ("eager", "ports", "steps")


@dataclass(frozen=True, slots=True)
class Action:
    """One segment this rank sends or receives; ``start``/``stop`` are element offsets."""

    index: int  # position in the rank's program
    step: int
    send: bool
    peer: int
    start: int
    stop: int
    kind: Kind
    in_place: bool  # a copying receive that may land in its destination (no same-step send reads it)
    # (receives that are not in place, adding ones among them, land in a staging buffer)
    after: int  # the last earlier action touching these elements (-1: none)

    def overlaps(self, start: int, stop: int) -> bool:
        return _overlap(self.start, self.stop, start, stop)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> bool:
    return a0 < b1 and b0 < a1


def rank_program(schedule: Schedule, rank: int, segment: int) -> tuple[Action, ...]:
    """``rank``'s sends and receives in schedule order, cut into segments of at most ``segment``
    elements; within a step, the sends come first (they carry the values from before the step)."""
    if segment < 1:
        raise ValueError(f"segment must be at least 1 element, got {segment}")
    raw: list[tuple[int, bool, int, int, int, Kind, bool]] = []
    for number, step in enumerate(schedule.steps):
        sends = [t for t in step if t.src == rank]
        recvs = [t for t in step if t.dst == rank]
        for t in sends:
            for a in range(t.start, t.stop, segment):
                raw.append((number, True, t.dst, a, min(a + segment, t.stop), t.kind, False))
        for t in recvs:
            clash = any(_overlap(s.start, s.stop, t.start, t.stop) for s in sends)
            for a in range(t.start, t.stop, segment):
                in_place = t.kind is Kind.COPY and not clash
                raw.append((number, False, t.src, a, min(a + segment, t.stop), t.kind, in_place))
    actions: list[Action] = []
    for index, (number, send, peer, a, b, kind, in_place) in enumerate(raw):
        after = next((j for j in range(index - 1, -1, -1) if _overlap(raw[j][3], raw[j][4], a, b)), -1)
        actions.append(Action(index, number, send, peer, a, b, kind, in_place, after))
    return tuple(actions)


class StagingPool:
    """Receive buffers kept from call to call (a fresh large buffer page-faults every time).

    A buffer serves any segment up to its size; one too small for a request is dropped
    rather than kept, so the pool holds at most the window's worth of the largest segment
    in use, whatever mix of message sizes comes through."""

    def __init__(self) -> None:
        self._free: dict[torch.device, list[torch.Tensor]] = {}

    def take(self, device: torch.device, nbytes: int) -> torch.Tensor:
        free = self._free.setdefault(device, [])
        while free:
            buffer = free.pop()
            if buffer.numel() >= nbytes:
                return buffer
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def give(self, device: torch.device, buffer: torch.Tensor) -> None:
        self._free.setdefault(device, []).append(buffer)


@dataclass
class Profile:
    """Where a rank's time went, summed over calls: blocked waiting on the transport, in the
    calls that post a send or a receive (gloo may push bytes into the socket right there),
    adding or copying what arrived, and the rest (lptrain's own Python)."""

    calls: int = 0
    messages: int = 0
    total_s: float = 0.0
    wait_s: float = 0.0
    post_s: float = 0.0
    apply_s: float = 0.0

    def describe(self) -> str:
        if not self.calls:
            return "no calls"
        rest = self.total_s - self.wait_s - self.post_s - self.apply_s
        per = 1e3 / self.calls
        return (
            f"{self.total_s * per:.1f} ms per call: waiting {self.wait_s * per:.1f} ms, posting "
            f"{self.post_s * per:.1f} ms, applying {self.apply_s * per:.1f} ms, the rest {rest * per:.1f} ms "
            f"({self.messages / self.calls:.0f} messages)"
        )


@dataclass(slots=True)
class _Posted:
    action: Action
    handle: object
    staged: torch.Tensor | None  # the staging slot, or None when received in place


# isend(buffer, peer) / irecv(buffer, peer) return a handle; wait(handle, what) blocks or raises.
Post = Callable[[torch.Tensor, int], object]
Wait = Callable[[object, str], None]


def run_program(
    program: tuple[Action, ...],
    work: torch.Tensor,
    *,
    isend: Post,
    irecv: Post,
    wait: Wait,
    pool: StagingPool,
    segment_bytes: int,
    window: int,
    num_steps: int,
    on_step: Callable[[int], None] | None = None,
    profile: Profile | None = None,
    order: str = "eager",
    drain_bytes_per_s: float = 0.0,
) -> None:
    """Run ``program`` on this rank's flat ``work`` tensor (see the module docstring).

    ``drain_bytes_per_s`` (the measured link's rate; 0: off) paces the ``ports`` and
    ``steps`` orders: a send completes once the kernel holds its bytes, which on a slow
    link is long before they have crossed it, so waiting for the handle alone would let a
    later step's sends split the port with the earlier step's bytes still queued. A send to
    another peer therefore also waits until the earlier steps' bytes would have left at
    that rate: the port is modelled as one queue, each send's bytes joining it when issued."""
    if order not in ISSUE_ORDERS:
        raise ValueError(f"unknown issue order {order!r}; valid: {', '.join(ISSUE_ORDERS)}")
    clock = time.perf_counter
    started = clock()
    waited = applied = posting = 0.0
    raw = work.view(torch.uint8)
    size = work.element_size()
    posted: deque[_Posted] = deque()  # receives posted and not yet applied, in program order
    sending: dict[int, tuple[Action, object]] = {}  # sends issued and not yet known complete
    lookahead = 0  # the next action the look-ahead may post (a receive) or skip past (a send)
    step_drained: dict[int, tuple[float, set[int]]] = {}  # step -> (when its bytes have left, its peers)
    port_free = 0.0  # when the bytes issued so far would have left the port at drain_bytes_per_s

    def what(a: Action) -> str:
        way = f"sending to rank {a.peer}" if a.send else f"receiving from rank {a.peer}"
        return f"step {a.step + 1}/{num_steps}, {way}"

    def timed_wait(handle, a: Action) -> None:
        nonlocal waited
        t0 = clock()
        wait(handle, what(a))
        waited += clock() - t0

    def finish_sends(start: int, stop: int, before: int) -> None:
        for index in [i for i, (a, _) in sending.items() if i < before and a.overlaps(start, stop)]:
            a, handle = sending.pop(index)
            timed_wait(handle, a)

    def apply_oldest() -> None:
        nonlocal applied
        p = posted.popleft()
        a = p.action
        timed_wait(p.handle, a)
        if p.staged is not None:
            finish_sends(a.start, a.stop, a.index)  # a send of these elements must not see this receive
            t0 = clock()
            incoming = p.staged[: (a.stop - a.start) * size].view(work.dtype)
            if a.kind is Kind.COPY:
                work[a.start : a.stop].copy_(incoming)
            else:
                work[a.start : a.stop].add_(incoming)
            applied += clock() - t0
            pool.give(work.device, p.staged)

    def apply_through(a: Action) -> None:
        """Apply posted receives, oldest first, until none before ``a`` overlaps it."""
        while any(p.action.index < a.index and p.action.overlaps(a.start, a.stop) for p in posted):
            apply_oldest()

    def timed(call: Post, buffer: torch.Tensor, peer: int):
        nonlocal posting
        t0 = clock()
        handle = call(buffer, peer)
        posting += clock() - t0
        return handle

    def post(a: Action, in_place: bool) -> None:
        if in_place:
            handle = timed(irecv, raw[a.start * size : a.stop * size], a.peer)
            posted.append(_Posted(a, handle, None))
        else:
            staged = pool.take(work.device, segment_bytes)
            handle = timed(irecv, staged[: (a.stop - a.start) * size], a.peer)
            posted.append(_Posted(a, handle, staged))

    def can_post_in_place(a: Action, cursor: int) -> bool:
        """Nothing earlier still reads or writes the elements (posting it early is then safe)."""
        if a.after < 0:
            return True
        if a.after >= cursor:  # an earlier action touching them has not even been issued
            return False
        earlier = [i for i, (s, _) in sending.items() if i < a.index and s.overlaps(a.start, a.stop)]
        pending = [p for p in posted if p.action.overlaps(a.start, a.stop)]
        return not earlier and not pending

    def look_ahead(cursor: int) -> None:
        nonlocal lookahead
        lookahead = max(lookahead, cursor + 1)
        while lookahead < len(program) and len(posted) < window:
            a = program[lookahead]
            if not a.send:
                post(a, a.in_place and can_post_in_place(a, cursor + 1))
            lookahead += 1

    look_ahead(-1)  # receives first: see the module docstring
    step = -1
    for cursor, a in enumerate(program):
        if a.step != step:
            step = a.step
            if on_step is not None:
                on_step(step)
        if a.send:
            apply_through(a)
            if order != "eager":
                for index in [i for i, (s, _) in sending.items() if s.step < a.step and s.peer != a.peer]:
                    earlier, handle = sending.pop(index)
                    timed_wait(handle, earlier)
                if drain_bytes_per_s > 0:
                    drained = [t for s, (t, to) in step_drained.items() if s < a.step and to - {a.peer}]
                    delay = max(drained, default=0.0) - clock()
                    if delay > 0:
                        time.sleep(delay)
                        waited += delay
            if order == "steps":
                while posted and posted[0].action.step < a.step:
                    apply_oldest()
            look_ahead(cursor - 1)  # refill the window before this send's bytes queue up
            sending[a.index] = (a, timed(isend, raw[a.start * size : a.stop * size], a.peer))
            if drain_bytes_per_s > 0:
                port_free = max(port_free, clock()) + (a.stop - a.start) * size / drain_bytes_per_s
                step_drained[a.step] = (port_free, step_drained.get(a.step, (0.0, set()))[1] | {a.peer})
        elif cursor >= lookahead:  # not posted by the look-ahead: post it now
            if a.in_place:
                apply_through(a)
                finish_sends(a.start, a.stop, a.index)
            post(a, a.in_place)
            lookahead = cursor + 1
        while len(posted) > window:
            apply_oldest()
        look_ahead(cursor)
    while posted:
        apply_oldest()
    for a, handle in sending.values():
        timed_wait(handle, a)
    if profile is not None:
        profile.calls += 1
        profile.messages += len(program)
        profile.total_s += clock() - started
        profile.wait_s += waited
        profile.post_s += posting
        profile.apply_s += applied


# batch(ops) posts [(send?, buffer, peer), ...] together and returns their handles in order.
Batch = Callable[[list[tuple[bool, torch.Tensor, int]]], list]


def run_batched_steps(
    program: tuple[Action, ...],
    work: torch.Tensor,
    *,
    batch: Batch,
    wait: Wait,
    pool: StagingPool,
    segment_bytes: int,
    num_steps: int,
    on_step: Callable[[int], None] | None = None,
    profile: Profile | None = None,
) -> None:
    """Run ``program`` one step at a time, each step's sends and receives posted as one batch.

    For NCCL initialised eagerly (``init_process_group(device_id=...)``), which runs every
    point-to-point operation posted on its own, one after the other, on one stream: a
    receive waits there for the peer's send, and a send for the peer's receive, so the
    dataflow's receives posted ahead would wait for sends queued behind the peers' own
    receives, forever. A batch (``batch_isend_irecv``) runs its operations together, and a
    schedule's step is a closed set of messages (every send of step t meets its receive in
    step t of the peer), so every rank's batch of step t finds all its partners in theirs.

    The arithmetic is the lock-step executor's, as in ``run_program``: a step's sends carry
    the values from before the step, its receives are applied in program order after all of
    them are in, a copying receive lands in place where no send of the step reads it.
    """
    clock = time.perf_counter
    started = clock()
    waited = applied = 0.0
    raw = work.view(torch.uint8)
    size = work.element_size()
    by_step: dict[int, list[Action]] = {}
    for a in program:
        by_step.setdefault(a.step, []).append(a)
    for number, actions in by_step.items():
        if on_step is not None:
            on_step(number)
        ops, staged = [], []
        for a in actions:
            alone = not any(b is not a and not b.send and b.overlaps(a.start, a.stop) for b in actions)
            if a.send or (a.in_place and alone):
                buffer = raw[a.start * size : a.stop * size]
                staged.append(None)
            else:
                slot = pool.take(work.device, segment_bytes)
                buffer = slot[: (a.stop - a.start) * size]
                staged.append(slot)
            ops.append((a.send, buffer, a.peer))
        handles = batch(ops)
        t0 = clock()
        for a, handle in zip(actions, handles):
            way = f"sending to rank {a.peer}" if a.send else f"receiving from rank {a.peer}"
            wait(handle, f"step {a.step + 1}/{num_steps}, {way}")
        waited += clock() - t0
        t0 = clock()
        for a, slot in zip(actions, staged):
            if slot is None:
                continue
            incoming = slot[: (a.stop - a.start) * size].view(work.dtype)
            if a.kind is Kind.COPY:
                work[a.start : a.stop].copy_(incoming)
            else:
                work[a.start : a.stop].add_(incoming)
            pool.give(work.device, slot)
        applied += clock() - t0
    if profile is not None:
        profile.calls += 1
        profile.messages += len(program)
        profile.total_s += clock() - started
        profile.wait_s += waited
        profile.apply_s += applied
