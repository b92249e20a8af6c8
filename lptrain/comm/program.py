"""One rank's part of a schedule as a program of segments, and what each send waits for.

The multi-process executor (``lptrain.comm.dataflow``) runs a rank's program in order,
and its simulator (``lptrain.sim.dataflow``) replays the same program in simulated time.
Both must hold a send back for the same things, or the simulator prices some other
executor; so what a send waits for is stated here once, as an ``IssuePolicy`` per issue
order, and both ask it instead of restating it. Nothing here needs torch.

Before a send is issued, whatever the order, the earlier receives that wrote elements it
carries are applied (in program order, so every receive posted before them as well). The
issue orders (``ISSUE_ORDERS``, each algorithm's choice per op) then say how far steps
may overlap:

* ``eager``: nothing more; a segment goes whenever its data is in (LP's pipeline);
* ``ports``: this rank's sends of earlier steps to other peers are done first (a tree's
  parent serves one child at a time, where all at once would share its port);
* ``steps``: also every receive of earlier steps is in first (BE, whose steps each
  exchange with a new partner and add what the last one brought).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lptrain.comm.schedule import Kind, Schedule


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


@dataclass(frozen=True, slots=True)
class Waits:
    """The earlier actions (program indices) one send waits for, by what it waits for."""

    applied: tuple[int, ...]  # receives that wrote elements the send carries: applied first
    sends: tuple[int, ...]  # sends that must be complete
    receives: tuple[int, ...]  # receives that must be in (and, in the executor, applied)


@dataclass(frozen=True)
class IssuePolicy:
    """What a send waits for before it is issued, under one issue order (module docstring).

    Its answers are predicates on a send and one earlier action, so that the executor and
    the simulator ask them of what each still has pending (receives not yet applied, sends
    not known to be done), which keeps a send's cost to that, not to the whole program.
    The two flags say whether a predicate can say yes at all, so that a runner skips what
    an order never waits for."""

    name: str
    waits_for_sends: bool  # earlier steps' sends to other peers
    waits_for_receives: bool  # earlier steps' receives

    def applies_first(self, action: Action, receive: Action) -> bool:
        """``receive`` comes before ``action`` and wrote elements it reads or overwrites: it is
        applied first (and with it every receive before it: receives apply in program order)."""
        return receive.index < action.index and receive.overlaps(action.start, action.stop)

    def finishes_first(self, send: Action, earlier: Action) -> bool:
        """``earlier``, a send issued before ``send``, must be complete before ``send`` is issued."""
        return self.waits_for_sends and earlier.step < send.step and earlier.peer != send.peer

    def receives_first(self, send: Action, receive: Action) -> bool:
        """``receive``, posted before ``send``, must be in before ``send`` is issued."""
        return self.waits_for_receives and receive.step < send.step

    def waits(self, program: Sequence[Action], send: Action) -> Waits:
        """Every earlier action of ``program`` that ``send`` waits for: the predicates' answers
        over the whole program at once (for reading and tests; runners ask per pending action)."""
        earlier = program[: send.index]
        return Waits(
            applied=tuple(a.index for a in earlier if not a.send and self.applies_first(send, a)),
            sends=tuple(a.index for a in earlier if a.send and self.finishes_first(send, a)),
            receives=tuple(a.index for a in earlier if not a.send and self.receives_first(send, a)),
        )


ISSUE_POLICIES: dict[str, IssuePolicy] = {
    "eager": IssuePolicy("eager", waits_for_sends=False, waits_for_receives=False),
    "ports": IssuePolicy("ports", waits_for_sends=True, waits_for_receives=False),
    "steps": IssuePolicy("steps", waits_for_sends=True, waits_for_receives=True),
}
ISSUE_ORDERS = tuple(ISSUE_POLICIES)  # the names an algorithm's ISSUE_ORDER may use


def issue_policy(order: str) -> IssuePolicy:
    """The policy of the issue order named ``order``; the executor and the simulator both
    look it up here, so the two cannot disagree on what an order means."""
    if order not in ISSUE_POLICIES:
        raise ValueError(f"unknown issue order {order!r}; valid: {', '.join(ISSUE_ORDERS)}")
    return ISSUE_POLICIES[order]
