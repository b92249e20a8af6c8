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
  reads or writes those elements; when something does, on a slow link it lands in a
  staging slot (one copy more) rather than being posted late, and on a fast link, where
  the CPU sets the time and that copy is not hidden behind a transfer, it is posted late,
  in place (``stage_ahead``);
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
last one brought), and posts a step's receives only then, so that no partner's bytes of
the next step come into the port while the last step's still do. What each order waits
for is stated once, in ``lptrain.comm.program`` (``IssuePolicy``), which the simulator
(``lptrain.sim.dataflow``) asks too.

Messages between two ranks match in the order they are posted, so sends are issued and
receives posted in program order; the look-ahead stops at the first receive it may not
post yet. Every wait names the step and the peer it was for.

One call is a ``Dataflow`` (its state: the receives posted, the sends in flight, the
look-ahead cursor, the port's drain clock) over a ``_Call`` (the work tensor, the staging
slots, the named and timed waits, the profile), which ``run_batched_steps`` shares.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lptrain.comm.program import ISSUE_ORDERS, Action, IssuePolicy, PortQueue, issue_policy, rank_program
from lptrain.comm.schedule import Kind

__all__ = [
    "ISSUE_ORDERS",
    "Action",
    "Dataflow",
    "Profile",
    "StagingPool",
    "rank_program",
    "run_batched_steps",
    "run_program",
]


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
    messages: int = 0  # sends issued and receives posted
    waits: int = 0  # handles waited for (each one a hand-off to the transport's thread and back)
    paced: int = 0  # sends held back until the port would have drained (slow links)
    staged_copies: int = 0  # copying receives landed in a staging slot (one memory copy more each)
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
            f"({self.messages / self.calls:.0f} messages, {self.waits / self.calls:.0f} waits, "
            f"{self.paced / self.calls:.0f} paced sends, {self.staged_copies / self.calls:.0f} copies staged)"
        )


# isend(buffer, peer) / irecv(buffer, peer) return a handle; wait(handle, what) blocks or raises.
Post = Callable[[torch.Tensor, int], object]
Wait = Callable[[object, str], None]
# batch(ops) posts [(send?, buffer, peer), ...] together and returns their handles in order.
Batch = Callable[[list[tuple[bool, torch.Tensor, int]]], list]


class _Call:
    """One call of a rank's program on its flat ``work`` tensor, as both ways of running it
    see it: the bytes of an action's elements, the staging slot a receive lands in and its
    copy or addition into ``work``, each wait named after its step and peer, ``on_step``,
    and the time spent waiting, posting and applying, added to the ``Profile`` at the end.
    Keeping it in one place is what makes the batched steps and the dataflow account alike."""

    def __init__(
        self,
        work: torch.Tensor,
        *,
        wait: Wait,
        pool: StagingPool,
        segment_bytes: int,
        num_steps: int,
        on_step: Callable[[int], None] | None,
        profile: Profile | None,
    ) -> None:
        self.clock = time.perf_counter
        self.started = self.clock()
        self.work, self.raw, self.size = work, work.view(torch.uint8), work.element_size()
        self._wait, self.pool, self.segment_bytes = wait, pool, segment_bytes
        self.num_steps, self.on_step, self.profile = num_steps, on_step, profile
        self.step = -1  # the step under way, for on_step
        self.waited = self.posting = self.applied = 0.0
        self.waits = self.paced = self.staged_copies = 0

    def begin(self, a: Action) -> None:
        """Tell ``on_step`` when ``a`` starts a new step."""
        if a.step != self.step:
            self.step = a.step
            if self.on_step is not None:
                self.on_step(a.step)

    def what(self, a: Action) -> str:
        way = f"sending to rank {a.peer}" if a.send else f"receiving from rank {a.peer}"
        return f"step {a.step + 1}/{self.num_steps}, {way}"

    def wait(self, handle: object, a: Action) -> None:
        t0 = self.clock()
        self._wait(handle, self.what(a))
        self.waited += self.clock() - t0
        self.waits += 1

    def post(self, call: Post, buffer: torch.Tensor, peer: int) -> object:
        t0 = self.clock()
        handle = call(buffer, peer)
        self.posting += self.clock() - t0
        return handle

    def elements(self, a: Action) -> torch.Tensor:
        """``a``'s elements of ``work``, as bytes (messages travel as raw bytes)."""
        return self.raw[a.start * self.size : a.stop * self.size]

    def stage(self, a: Action) -> tuple[torch.Tensor, torch.Tensor]:
        """A staging slot from the pool and the part of it ``a``'s bytes land in."""
        slot = self.pool.take(self.work.device, self.segment_bytes)
        return slot, slot[: (a.stop - a.start) * self.size]

    def land(self, a: Action, slot: torch.Tensor) -> None:
        """Copy or add a staged receive into ``work``, and give its slot back."""
        t0 = self.clock()
        incoming = slot[: (a.stop - a.start) * self.size].view(self.work.dtype)
        if a.kind is Kind.COPY:
            self.work[a.start : a.stop].copy_(incoming)
            self.staged_copies += 1
        else:
            self.work[a.start : a.stop].add_(incoming)
        self.applied += self.clock() - t0
        self.pool.give(self.work.device, slot)

    def close(self, messages: int) -> None:
        """Add this call to the profile."""
        if self.profile is None:
            return
        self.profile.calls += 1
        self.profile.messages += messages
        self.profile.total_s += self.clock() - self.started
        self.profile.wait_s += self.waited
        self.profile.post_s += self.posting
        self.profile.apply_s += self.applied
        self.profile.waits += self.waits
        self.profile.paced += self.paced
        self.profile.staged_copies += self.staged_copies


@dataclass(slots=True)
class _Posted:
    action: Action
    handle: object
    staged: torch.Tensor | None  # the staging slot, or None when received in place


class Dataflow:
    """One call of ``run_program``: the program worked through in order (module docstring).

    Its state: the receives posted and not yet applied (in program order), the sends
    issued and not yet known complete, the look-ahead cursor (the next action it may post,
    a receive, or skip past, a send) and the port's drain clock; each step of the dataflow
    is a method."""

    def __init__(
        self,
        program: tuple[Action, ...],
        call: _Call,
        *,
        isend: Post,
        irecv: Post,
        window: int,
        policy: IssuePolicy,
        drain_bytes_per_s: float = 0.0,
        stage_ahead: bool = True,
    ) -> None:
        self.program, self.call, self.policy = program, call, policy
        self.isend, self.irecv, self.window = isend, irecv, window
        self.stage_ahead = stage_ahead
        self.posted: deque[_Posted] = deque()
        self.sending: dict[int, tuple[Action, object]] = {}
        self.lookahead = 0
        self.port = PortQueue(drain_bytes_per_s) if drain_bytes_per_s > 0 else None

    def run(self) -> None:
        self.look_ahead(-1)  # receives first: see the module docstring
        for cursor, a in enumerate(self.program):
            self.call.begin(a)
            if a.send:
                self.issue_send(cursor, a)
            elif cursor >= self.lookahead:  # not posted by the look-ahead: post it now
                self.post_late(cursor, a)
            while len(self.posted) > self.window:
                self.apply_oldest()
            self.look_ahead(cursor)
        self.finish()

    # -- receives ---------------------------------------------------------------------
    def post_receive(self, a: Action, in_place: bool) -> None:
        if in_place:
            self.posted.append(_Posted(a, self.call.post(self.irecv, self.call.elements(a), a.peer), None))
        else:
            slot, buffer = self.call.stage(a)
            self.posted.append(_Posted(a, self.call.post(self.irecv, buffer, a.peer), slot))

    def apply_oldest(self) -> None:
        p = self.posted.popleft()
        self.call.wait(p.handle, p.action)
        if p.staged is not None:
            self.finish_overlapping_sends(p.action)  # a send of these elements must not see this receive
            self.call.land(p.action, p.staged)

    def apply_through(self, a: Action) -> None:
        """Apply posted receives, oldest first, until none before ``a`` wrote its elements."""
        while self.policy.applies_first(a, (p.action for p in self.posted)):
            self.apply_oldest()

    def post_late(self, cursor: int, a: Action) -> None:
        """Post a receive the look-ahead could not; in place once nothing earlier touches it,
        and once the issue policy lets it be posted (``steps``: earlier steps' receives in)."""
        while not self.policy.may_post(a, (p.action for p in self.posted)):
            self.apply_oldest()
        if a.in_place:
            self.apply_through(a)
            self.finish_overlapping_sends(a)
        self.post_receive(a, a.in_place)
        self.lookahead = cursor + 1

    def can_post_in_place(self, a: Action, cursor: int) -> bool:
        """Nothing earlier still reads or writes the elements (posting it early is then safe)."""
        if a.after < 0:
            return True
        if a.after >= cursor:  # an earlier action touching them has not even been issued
            return False
        earlier = any(i < a.index and s.overlaps(a.start, a.stop) for i, (s, _) in self.sending.items())
        pending = any(p.action.overlaps(a.start, a.stop) for p in self.posted)
        return not earlier and not pending

    def look_ahead(self, cursor: int) -> None:
        """Post the receives after ``cursor`` until the window is full, in program order."""
        self.lookahead = max(self.lookahead, cursor + 1)
        while self.lookahead < len(self.program) and len(self.posted) < self.window:
            a = self.program[self.lookahead]
            if not a.send:
                if not self.policy.may_post(a, (p.action for p in self.posted)):
                    return  # under ``steps``, not before the earlier steps' receives are in
                in_place = a.in_place and self.can_post_in_place(a, cursor + 1)
                if a.in_place and not in_place and not self.stage_ahead:
                    return  # posted in place when its turn comes (``post_late``), not staged now
                self.post_receive(a, in_place)
            self.lookahead += 1

    # -- sends ------------------------------------------------------------------------
    def finish_sends(self, indices: list[int]) -> None:
        for index in indices:
            earlier, handle = self.sending.pop(index)
            self.call.wait(handle, earlier)

    def finish_overlapping_sends(self, a: Action) -> None:
        """Complete the sends issued before ``a`` that read its elements."""
        self.finish_sends([i for i, (s, _) in self.sending.items() if i < a.index and s.overlaps(a.start, a.stop)])

    def issue_send(self, cursor: int, a: Action) -> None:
        """Issue ``a`` once what the issue policy asks is done, the window of receives refilled first."""
        self.apply_through(a)
        if self.policy.waits_for_sends:
            self.finish_sends(self.policy.sends_first(a, self.sending))
            self.pace(a)
        if self.policy.waits_for_receives:
            while self.policy.receives_first(a, (p.action for p in self.posted)):
                self.apply_oldest()
        self.look_ahead(cursor - 1)  # refill the window before this send's bytes queue up
        self.sending[a.index] = (a, self.call.post(self.isend, self.call.elements(a), a.peer))
        if self.port is not None:
            self.port.queue(a, (a.stop - a.start) * self.call.size, self.call.clock())

    def pace(self, a: Action) -> None:
        """Sleep until the earlier steps' bytes to other peers would have crossed the link."""
        if self.port is None:
            return
        delay = self.port.drained(a) - self.call.clock()
        if delay > 0:
            time.sleep(delay)
            self.call.waited += delay
            self.call.paced += 1

    def finish(self) -> None:
        while self.posted:
            self.apply_oldest()
        for a, handle in self.sending.values():
            self.call.wait(handle, a)
        self.call.close(len(self.program))


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
    stage_ahead: bool = True,
) -> None:
    """Run ``program`` on this rank's flat ``work`` tensor (see the module docstring).

    ``drain_bytes_per_s`` (the measured link's rate; 0: off) paces the ``ports`` and
    ``steps`` orders: a send completes once the kernel holds its bytes, which on a slow
    link is long before they have crossed it, so waiting for the handle alone would let a
    later step's sends split the port with the earlier step's bytes still queued. A send to
    another peer therefore also waits until the earlier steps' bytes would have left at
    that rate: the port is modelled as one queue, each send's bytes joining it when issued.

    ``stage_ahead`` (the default; the executor's choice on a slow link) posts a copying
    receive ahead even where it cannot land in place yet, into a staging slot, so that its
    notice reaches the peer before this rank's next sends (module docstring). Off (a fast
    link, where the CPU sets the time), the look-ahead stops at such a receive, which is
    posted in place when its turn comes: no copy out of a staging slot."""
    policy = issue_policy(order)
    call = _Call(
        work, wait=wait, pool=pool, segment_bytes=segment_bytes, num_steps=num_steps, on_step=on_step, profile=profile
    )
    Dataflow(
        program,
        call,
        isend=isend,
        irecv=irecv,
        window=window,
        policy=policy,
        drain_bytes_per_s=drain_bytes_per_s,
        stage_ahead=stage_ahead,
    ).run()


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
    call = _Call(
        work, wait=wait, pool=pool, segment_bytes=segment_bytes, num_steps=num_steps, on_step=on_step, profile=profile
    )
    for actions in _steps(program):
        call.begin(actions[0])
        buffers = [_batch_buffer(call, a, actions) for a in actions]
        handles = batch([(a.send, buffer, a.peer) for a, (buffer, _) in zip(actions, buffers)])
        for a, handle in zip(actions, handles):
            call.wait(handle, a)
        for a, (_, slot) in zip(actions, buffers):
            if slot is not None:
                call.land(a, slot)
    call.close(len(program))


def _steps(program: tuple[Action, ...]) -> list[list[Action]]:
    by_step: dict[int, list[Action]] = {}
    for a in program:
        by_step.setdefault(a.step, []).append(a)
    return list(by_step.values())


def _batch_buffer(call: _Call, a: Action, actions: list[Action]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Where ``a`` moves its bytes within its step's batch: its own elements for a send and for
    a copying receive no other receive of the step overlaps, else a staging slot (also returned)."""
    alone = not any(b is not a and not b.send and b.overlaps(a.start, a.stop) for b in actions)
    if a.send or (a.in_place and alone):
        return call.elements(a), None
    slot, buffer = call.stage(a)
    return buffer, slot
