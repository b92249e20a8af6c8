"""Price a schedule as the multi-process executor runs it: segments, not lock-step steps.

``lptrain.sim.simulator`` prices a schedule step by step, each step ending when its
busiest link drains. Across processes the executor does not wait for steps: it cuts each
transfer into segments and sends a segment the moment the receives it depends on have
arrived and been added (``lptrain.comm.dataflow``), so a tree's next hop starts after one
segment, not after the whole message, and consecutive steps overlap. This module runs
each rank's program (``rank_program``, the executor's own) in simulated time:

* a rank works through its program in order, as the executor does: posting a receive or
  issuing a send costs ``overhead`` of its time; before a send it applies, in program
  order, the receives that wrote the elements the send carries (``gamma`` per byte added),
  and waits for what the algorithm's issue order asks (earlier steps' sends to other
  peers for ``ports``, and every earlier step's receive too for ``steps``): it asks the
  executor's own ``IssuePolicy`` (``lptrain.comm.program``), so the two cannot drift;
* on a slow link those orders also pace: a send to a new peer waits until the earlier
  steps' bytes would have left the rank's port at a port's rate as the executor measures it
  at start (the fastest link of a ring: on racks, a port's, not the uplink's;
  ``port_rate``), the executor's own ``PortQueue``;
* receives are posted ahead in program order, as the executor's look-ahead posts them: at
  most ``window`` not yet applied, and no further than the issue order allows (under
  ``steps``, a receive only once the receives of earlier steps are in);
* a send is done, for what waits for it, once the transport has handed it to the kernel:
  when no more than ``Topology.send_buffer`` bytes of its connection (it and the messages
  before it) are still to cross, not when its last byte lands (gloo reports a send done when
  its bytes are written to the socket);
* a message flows once it is sent and its receive is posted (the transport waits for the
  receiver's notice), and the messages sent
  before it to the same peer have gone (one connection per pair, first in first out),
  over the links of its route, sharing each link with the other pairs' messages crossing
  it at the same time (max-min fair shares, as TCP flows on a shaped port settle to), and
  lands a route's latency later;
* where a link is a token bucket (``Link.burst``: an emulated port, shaped by one), it
  holds up to that many tokens, refilled at its rate less what it carries: a message
  that starts flowing passes at once as many bytes as every link of its route holds
  (taking them from each; none where one link has no bucket), the rest at its fair share. A
  pipeline's hop whose port idled while the segment before came in thus forwards part of
  each segment at once, which a real link (no bucket, the default) never does.

The result is the time the last rank finishes, for a given segment size: what the
executor would take if the links and the per-message cost were all there is.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from lptrain.comm.algorithms import message_rule_of
from lptrain.comm.program import (
    Action,
    IssuePolicy,
    PortQueue,
    auto_segment_bytes,
    issue_policy,
    pacing_rate,
    port_apart,
    rank_program,
)
from lptrain.comm.schedule import Kind, Schedule
from lptrain.sim.topology import Link, Topology

WINDOW = 16  # receives posted ahead: the executor's default (lptrain.comm.distributed.DEFAULT_WINDOW)

Key = tuple[int, int, int]  # a message: (src, dst, n-th message of the pair)


@dataclass
class _Flow:
    src: int
    dst: int
    key: Key
    links: tuple[Link, ...]
    remaining: float
    latency: float
    rate: float = 0.0


def fair_rates(flows: list[_Flow]) -> None:
    """Max-min fair rates (progressive filling): every flow gets an equal share of its most
    contended link, and what a flow cannot use there goes to the others."""
    left = {link: link.bandwidth for f in flows for link in f.links}
    unfrozen = set(range(len(flows)))
    while unfrozen:
        users: dict[Link, list[int]] = defaultdict(list)
        for i in unfrozen:
            for link in flows[i].links:
                users[link].append(i)
        bottleneck = min(users, key=lambda link: left[link] / len(users[link]))
        share = left[bottleneck] / len(users[bottleneck])
        for i in users[bottleneck]:
            flows[i].rate = share
            unfrozen.discard(i)
            for link in flows[i].links:
                left[link] -= share


class _Rank:
    """One rank's place in its program and its clock (when its CPU is next free)."""

    def __init__(self, rank: int, program: tuple[Action, ...]) -> None:
        self.rank = rank
        self.program = program
        self.pc = 0
        self.lookahead = 0  # the next action the look-ahead may post (a receive) or skip (a send)
        self.clock = 0.0
        self.unapplied: deque[Action] = deque()  # receives posted, not yet applied, in program order
        self.sent: dict[int, int] = defaultdict(int)  # messages sent so far to each peer
        self.received: dict[int, int] = defaultdict(int)  # receives posted so far from each peer
        self.recv_key: dict[int, Key] = {}  # action index -> message key
        self.issued: dict[int, tuple[Action, Key]] = {}  # action index -> the send, its message's key
        self.port: PortQueue | None = None  # the executor's pacing clock (slow links)
        self.finished = False


class _Simulation:
    """Every rank's program run in simulated time (see the module docstring).

    The ranks advance until they wait for a message; the network then moves the flows in
    flight to the next event (a flow finishing or a send's start), and the ranks advance
    again, until every rank is done."""

    def __init__(
        self,
        schedule: Schedule,
        topology: Topology,
        segment: int,
        itemsize: int,
        policy: IssuePolicy,
        window: int,
        starts: Sequence[float] | None = None,
        drain_bytes_per_s: float = 0.0,
    ):
        self.topology, self.itemsize, self.policy, self.window = topology, itemsize, policy, window
        self.ranks = [_Rank(r, rank_program(schedule, r, segment)) for r in range(schedule.world_size)]
        for rank, late in zip(self.ranks, starts or ()):
            rank.clock = late
        for rank in self.ranks:
            rank.port = PortQueue(drain_bytes_per_s) if drain_bytes_per_s > 0 else None
        self.arrived: dict[Key, float] = {}  # message key -> when its last byte landed
        self.written: dict[Key, float] = {}  # message key -> when the transport reported it sent
        self.starts: list[tuple[float, int, _Flow]] = []  # flows waiting for their send time
        self.sequence = 0
        self.now = 0.0
        self.active: list[_Flow] = []
        self.queued: dict[tuple[int, int], deque[_Flow]] = defaultdict(deque)  # sent, behind an earlier message
        self.posted_at: dict[Key, float] = {}  # message key -> when its receive was posted
        self.unmatched: dict[Key, tuple[float, _Flow]] = {}  # sent before its receive was posted
        self.shared_arrivals = 0  # messages that started flowing into a rank another peer was sending to
        self.buckets = _Buckets()

    def run(self) -> float:
        for rank in self.ranks:
            self.advance(rank)
        while self.starts or self.active:
            if self.move_flows():
                for rank in self.ranks:
                    if not rank.finished:
                        self.advance(rank)
        stuck = [r.rank for r in self.ranks if not r.finished]
        if stuck:
            raise RuntimeError(f"ranks {stuck} never received what they wait for: the schedule is not a closed set")
        return max((self.end(rank) for rank in self.ranks), default=0.0)

    def end(self, rank: _Rank) -> float:
        """A rank is done once its last message has landed at the peer, too."""
        sent = [self.arrived[(rank.rank, d, n)] for d, count in rank.sent.items() for n in range(count)]
        return max([rank.clock, *sent])

    # -- a rank's program -----------------------------------------------------------------
    def advance(self, rank: _Rank) -> None:
        """Advance ``rank`` until it needs a message that has not arrived (or it is done)."""
        self.look_ahead(rank)
        while rank.pc < len(rank.program):
            a = rank.program[rank.pc]
            if not a.send:
                if a.index >= rank.lookahead:  # not posted by the look-ahead: post it now, once it may be
                    while not self.policy.may_post(a, rank.unapplied):
                        if not self.apply_oldest(rank):
                            return
                    self.post_receive(rank, a)
                    rank.lookahead = a.index + 1
                while len(rank.unapplied) > self.window:
                    if not self.apply_oldest(rank):
                        return
            elif self.wait_before_send(rank, a):
                self.look_ahead(rank)  # the window refilled before the send's bytes queue up
                self.send(rank, a)
            else:
                return
            rank.pc += 1
            self.look_ahead(rank)
        while rank.unapplied:  # the end of the call: every receive applied
            if not self.apply_oldest(rank):
                return
        rank.finished = True

    def look_ahead(self, rank: _Rank) -> None:
        """Post the receives after the program counter in program order, while fewer than
        ``window`` are pending and the issue policy lets the next one be posted."""
        rank.lookahead = max(rank.lookahead, rank.pc)
        while rank.lookahead < len(rank.program) and len(rank.unapplied) < self.window:
            a = rank.program[rank.lookahead]
            if not a.send:
                if not self.policy.may_post(a, rank.unapplied):
                    return
                self.post_receive(rank, a)
            rank.lookahead += 1

    def post_receive(self, rank: _Rank, a: Action) -> None:
        key = (a.peer, rank.rank, rank.received[a.peer])
        rank.received[a.peer] += 1
        rank.recv_key[a.index] = key
        rank.unapplied.append(a)
        rank.clock += self.topology.overhead
        self.posted_at[key] = rank.clock
        if key in self.unmatched:  # its send was waiting for this receive
            sent, flow = self.unmatched.pop(key)
            self.release(max(sent, rank.clock), flow)

    def release(self, when: float, flow: _Flow) -> None:
        heapq.heappush(self.starts, (max(when, self.now), self.sequence, flow))
        self.sequence += 1

    def wait_before_send(self, rank: _Rank, a: Action) -> bool:
        """Whether ``rank`` may issue ``a`` now, after what the issue policy makes it wait for
        (False: something has not arrived or left yet, and the rank waits)."""
        while self.policy.applies_first(a, rank.unapplied):
            if not self.apply_oldest(rank):
                return False
        if self.policy.waits_for_sends:
            earlier = [rank.issued[i][1] for i in self.policy.sends_first(a, rank.issued)]
            if any(k not in self.written for k in earlier):
                return False
            rank.clock = max([rank.clock, *(self.written[k] for k in earlier)])
            if rank.port is not None:  # paced: the earlier steps' bytes have left at the measured rate
                rank.clock = max(rank.clock, rank.port.drained(a))
        if self.policy.waits_for_receives:
            before = [rank.recv_key[p.index] for p in self.policy.receives_first(a, rank.program[: a.index])]
            if any(k not in self.arrived for k in before):
                return False
            rank.clock = max([rank.clock, *(self.arrived[k] for k in before)])
        return True

    def send(self, rank: _Rank, a: Action) -> None:
        key = (rank.rank, a.peer, rank.sent[a.peer])
        rank.sent[a.peer] += 1
        rank.clock += self.topology.overhead
        links = self.topology.route(rank.rank, a.peer)
        flow = _Flow(rank.rank, a.peer, key, links, (a.stop - a.start) * self.itemsize, sum(x.latency for x in links))
        if rank.port is not None:
            rank.port.queue(a, (a.stop - a.start) * self.itemsize, rank.clock)
        if key in self.posted_at:
            self.release(max(rank.clock, self.posted_at[key]), flow)
        else:
            self.unmatched[key] = (rank.clock, flow)
        rank.issued[a.index] = (a, key)

    def apply_oldest(self, rank: _Rank) -> bool:
        a = rank.unapplied[0]
        key = rank.recv_key[a.index]
        if key not in self.arrived:
            return False
        rank.unapplied.popleft()
        rank.clock = max(rank.clock, self.arrived[key])
        if a.kind is Kind.REDUCE:
            rank.clock += (a.stop - a.start) * self.itemsize * self.topology.gamma
        return True

    # -- the network ------------------------------------------------------------------------
    def move_flows(self) -> bool:
        """Move time to the next event: a flow finishing or a send's start. True when a flow
        finished (its message has landed, and a rank may go on)."""
        fair_rates(self.active)
        finish = min((self.now + f.remaining / f.rate for f in self.active), default=float("inf"))
        begin = self.starts[0][0] if self.starts else float("inf")
        step_to = min(finish, begin, self.next_written())
        for f in self.active:
            f.remaining -= f.rate * (step_to - self.now)
        self.buckets.carry(self.active, step_to - self.now)
        self.now = step_to
        while self.starts and self.starts[0][0] <= self.now:
            self.start(heapq.heappop(self.starts)[2])
        done = [f for f in self.active if f.remaining <= 1e-9 * max(1.0, f.rate)]
        self.active = [f for f in self.active if f not in done]
        for f in done:
            self.arrived[f.key] = self.now + f.latency
            self.written.setdefault(f.key, self.now)
            if self.queued[(f.src, f.dst)]:
                self.activate(self.queued[(f.src, f.dst)].popleft())
        return self.note_written() or bool(done)

    def _backlogs(self) -> list[tuple[_Flow, float]]:
        """Each message flowing or queued behind one on its connection, with the bytes of
        its connection still to cross up to and including it."""
        out = []
        for f in self.active:
            ahead = f.remaining
            out.append((f, ahead))
            for q in self.queued[(f.src, f.dst)]:
                ahead += q.remaining
                out.append((q, ahead))
        return out

    def next_written(self) -> float:
        """When the next message's backlog falls to the send buffer (inf: none will, or no buffer)."""
        buffer = self.topology.send_buffer
        if buffer <= 0:
            return float("inf")
        rates = {(f.src, f.dst): f.rate for f in self.active}
        waits = [
            (ahead - buffer) / rates[(m.src, m.dst)]
            for m, ahead in self._backlogs()
            if m.key not in self.written and ahead > buffer and rates[(m.src, m.dst)] > 0
        ]
        return self.now + min(waits, default=float("inf"))

    def note_written(self) -> bool:
        """Mark the messages whose connection's backlog up to them fits the send buffer as
        reported sent; True where one was (a rank waiting for it may go on)."""
        buffer = self.topology.send_buffer
        if buffer <= 0:
            return False
        fits = buffer * (1 + 1e-9) + 1e-3  # a thousandth of a byte: the crossing's rounding
        fresh = [m for m, ahead in self._backlogs() if m.key not in self.written and ahead <= fits]
        for m in fresh:
            self.written[m.key] = self.now
        return bool(fresh)

    def start(self, flow: _Flow) -> None:
        pair = (flow.src, flow.dst)
        if self.queued[pair] or any((f.src, f.dst) == pair for f in self.active):
            self.queued[pair].append(flow)  # one connection per pair: its messages go one after another
        else:
            self.activate(flow)

    def activate(self, flow: _Flow) -> None:
        if any(f.dst == flow.dst and f.src != flow.src for f in self.active):
            self.shared_arrivals += 1
        flow.remaining -= self.buckets.take(flow.links, flow.remaining, self.now)
        self.active.append(flow)
        self.note_written()


class _Buckets:
    """Every link's token bucket (``Link.burst``; none where that is 0). A link's tokens
    grow at its rate less what its flows carry, up to the bucket, so they are kept lazily:
    the level at the last use, when that was, and the bytes carried since."""

    def __init__(self) -> None:
        self.level: dict[Link, float] = {}
        self.since: dict[Link, float] = {}
        self.carried: dict[Link, float] = defaultdict(float)

    def carry(self, flows: list[_Flow], seconds: float) -> None:
        """The flows moved at their rates for ``seconds``: their links refill by that much less."""
        for f in flows:
            for link in f.links:
                if link.burst > 0:
                    self.carried[link] += f.rate * seconds

    def take(self, links: tuple[Link, ...], nbytes: float, now: float) -> float:
        """Bytes of a message starting at ``now`` that pass at once: what every link of its
        route holds (a chain of buckets passes its smallest), at most ``nbytes``."""
        if not all(link.burst > 0 for link in links):
            return 0.0  # a link with no bucket passes nothing faster than its rate
        levels = [self._level(link, now) for link in links]
        passed = max(0.0, min([nbytes, *levels]))
        for link, level in zip(links, levels):
            self.level[link], self.since[link], self.carried[link] = level - passed, now, 0.0
        return passed

    def _level(self, link: Link, now: float) -> float:
        if link not in self.level:
            return link.burst  # idle since the start: full
        refill = link.bandwidth * (now - self.since[link]) - self.carried[link]
        return min(link.burst, self.level[link] + refill)


@dataclass(frozen=True)
class DataflowRun:
    """One simulated call: its time, and how many messages started flowing into a rank's
    port while another peer's message was still coming in there. A fluid model shares the
    port at no loss, but on a real port two TCP flows into one shaped queue fill it and
    drop, and a step that waits for the slower of them waits for the pair; an algorithm
    whose steps each have one peer per rank (BE, the ring) needs none."""

    seconds: float
    shared_arrivals: int


def run_dataflow(
    schedule: Schedule,
    topology: Topology,
    segment: int,
    itemsize: int = 4,
    order: str | IssuePolicy = "eager",
    window: int = WINDOW,
    starts: Sequence[float] | None = None,
    drain_bytes_per_s: float | None = None,
) -> DataflowRun:
    """``simulate_dataflow``'s call, with the count of messages that shared a receiving port.
    ``starts`` gives each rank's start in seconds (a rank that got its core late; all 0 by
    default): on a shared host the ranks enter a call out of step, and a schedule's
    issue order decides whether that costs only the delay or also shares ports. ``order``
    may also be an ``IssuePolicy`` of one's own, to price an order no algorithm uses.
    ``drain_bytes_per_s`` is the rate sends are paced at (``PortQueue``; 0: not paced); by
    default the executor's, ``pacing_rate`` of the link it would measure on ``topology``."""
    if schedule.world_size != topology.world_size:
        raise ValueError(f"the schedule has P={schedule.world_size} but the topology {topology.world_size}")
    policy = order if isinstance(order, IssuePolicy) else issue_policy(order)
    if drain_bytes_per_s is None:
        slowest = topology.link_rate or measured_rate(topology)
        drain_bytes_per_s = pacing_rate(slowest, port_rate(topology, slowest))
    simulation = _Simulation(schedule, topology, segment, itemsize, policy, window, starts, drain_bytes_per_s)
    seconds = simulation.run()
    return DataflowRun(seconds, simulation.shared_arrivals)


def measured_rate(topology: Topology) -> float:
    """The link rate the executor would measure at start on ``topology``: every rank's exchange
    with the next rank of a ring, the slowest (``lptrain.comm.transport.measure_link``)."""
    p = topology.world_size
    return min(link.bandwidth for r in range(p) for link in topology.route(r, (r + 1) % p))


def port_rate(topology: Topology, slowest: float | None = None) -> float:
    """A port's rate as the executor would measure it at start on ``topology``
    (``topology.port_rate`` where it was measured): the fastest receive of the ring where it
    stands apart from the ``slowest`` link (``lptrain.comm.program.port_apart``; by default
    ``measured_rate``), else the slowest (``lptrain.comm.transport.measure_link``)."""
    if topology.port_rate is not None:
        return topology.port_rate
    slowest = slowest or topology.link_rate or measured_rate(topology)
    p = topology.world_size
    fastest = max(min(link.bandwidth for link in topology.route((r - 1) % p, r)) for r in range(p))
    return port_apart(slowest, fastest) or slowest


def auto_segment(schedule: Schedule, topology: Topology, itemsize: int = 4) -> int:
    """Elements per message of the executor's ``segment_size=auto`` on ``topology``: the same
    rule as the executor's (``lptrain.comm.program.auto_segment_bytes``) on the rate it would
    measure, so the simulator cuts messages where the executor does."""
    nbytes = schedule.count * itemsize
    rule = message_rule_of(schedule)
    return max(1, auto_segment_bytes(nbytes, schedule.world_size, measured_rate(topology), rule) // itemsize)


def simulate_dataflow(
    schedule: Schedule,
    topology: Topology,
    segment: int | str,
    itemsize: int = 4,
    order: str = "eager",
    window: int = WINDOW,
) -> float:
    """Seconds the multi-process executor takes for ``schedule`` on ``topology`` with
    ``segment``-element messages (``"auto"``: as the executor cuts them, ``auto_segment``),
    the algorithm's issue ``order`` (see the module docstring and
    ``lptrain.comm.program.ISSUE_ORDERS``) and ``window`` receives posted ahead."""
    if segment == "auto":
        segment = auto_segment(schedule, topology, itemsize)
    if not isinstance(segment, int):
        raise ValueError(f"segment must be a number of elements or 'auto', got {segment!r}")
    return run_dataflow(schedule, topology, segment, itemsize, order, window).seconds
