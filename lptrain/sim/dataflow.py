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
  peers for ``ports``, and every earlier step's receive too for ``steps``);
* a message flows once it is sent (its receive was posted ahead) and the messages sent
  before it to the same peer have gone (one connection per pair, first in first out),
  over the links of its route, sharing each link with the other pairs' messages crossing
  it at the same time (max-min fair shares, as TCP flows on a shaped port settle to), and
  lands a route's latency later.

The result is the time the last rank finishes, for a given segment size: what the
executor would take if the links and the per-message cost were all there is.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass

from lptrain.comm.dataflow import Action, rank_program
from lptrain.comm.schedule import Kind, Schedule
from lptrain.sim.topology import Link, Topology


@dataclass
class _Flow:
    src: int
    dst: int
    key: tuple[int, int, int]  # (src, dst, n-th message of the pair)
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
        self.clock = 0.0
        self.unapplied: deque[Action] = deque()  # receives posted, not yet applied, in program order
        self.sent: dict[int, int] = defaultdict(int)  # messages sent so far to each peer
        self.received: dict[int, int] = defaultdict(int)  # receives posted so far from each peer
        self.recv_key: dict[int, tuple[int, int, int]] = {}  # action index -> message key
        self.issued: list[tuple[int, int, tuple[int, int, int]]] = []  # (step, peer, key) of each send
        self.finished = False


def simulate_dataflow(
    schedule: Schedule, topology: Topology, segment: int, itemsize: int = 4, order: str = "eager"
) -> float:
    """Seconds the multi-process executor takes for ``schedule`` on ``topology`` with
    ``segment``-element messages and the algorithm's issue ``order`` (see the module
    docstring and ``lptrain.comm.dataflow.ISSUE_ORDERS``)."""
    if schedule.world_size != topology.world_size:
        raise ValueError(f"the schedule has P={schedule.world_size} but the topology {topology.world_size}")
    ranks = [_Rank(r, rank_program(schedule, r, segment)) for r in range(schedule.world_size)]
    arrived: dict[tuple[int, int, int], float] = {}  # message key -> when its last byte landed
    delivered: dict[tuple[int, int, int], float] = {}  # message key -> when its last byte left
    starts: list[tuple[float, int, _Flow]] = []  # flows waiting for their send time
    sequence = 0

    def run(rank: _Rank) -> None:
        """Advance ``rank`` until it needs a message that has not arrived (or it is done)."""
        nonlocal sequence
        while rank.pc < len(rank.program):
            a = rank.program[rank.pc]
            if not a.send:
                key = (a.peer, rank.rank, rank.received[a.peer])
                rank.received[a.peer] += 1
                rank.recv_key[a.index] = key
                rank.unapplied.append(a)
                rank.clock += topology.overhead
                rank.pc += 1
                continue
            if not _apply_through(rank, a, arrived, topology.gamma, itemsize):
                return
            if order != "eager":
                earlier = [k for step, peer, k in rank.issued if step < a.step and peer != a.peer]
                if any(k not in delivered for k in earlier):
                    return
                rank.clock = max([rank.clock, *(delivered[k] for k in earlier)])
                if order == "steps":
                    before = [rank.recv_key[p.index] for p in rank.program[: a.index] if not p.send and p.step < a.step]
                    if any(k not in arrived for k in before):
                        return
                    rank.clock = max([rank.clock, *(arrived[k] for k in before)])
            key = (rank.rank, a.peer, rank.sent[a.peer])
            rank.sent[a.peer] += 1
            rank.clock += topology.overhead
            links = topology.route(rank.rank, a.peer)
            flow = _Flow(rank.rank, a.peer, key, links, (a.stop - a.start) * itemsize, sum(x.latency for x in links))
            heapq.heappush(starts, (rank.clock, sequence, flow))
            rank.issued.append((a.step, a.peer, key))
            sequence += 1
            rank.pc += 1
        while rank.unapplied:  # the end of the call: every receive applied
            if not _apply_oldest(rank, arrived, topology.gamma, itemsize):
                return
        rank.finished = True

    for rank in ranks:
        run(rank)
    now = 0.0
    active: list[_Flow] = []
    queued: dict[tuple[int, int], deque[_Flow]] = defaultdict(deque)  # sent, behind an earlier message
    while starts or active:
        fair_rates(active)
        finish = min((now + f.remaining / f.rate for f in active), default=float("inf"))
        begin = starts[0][0] if starts else float("inf")
        step_to = min(finish, begin)
        for f in active:
            f.remaining -= f.rate * (step_to - now)
        now = step_to
        while starts and starts[0][0] <= now:
            flow = heapq.heappop(starts)[2]
            pair = (flow.src, flow.dst)
            if queued[pair] or any((f.src, f.dst) == pair for f in active):
                queued[pair].append(flow)  # one connection per pair: its messages go one after another
            else:
                active.append(flow)
        done = [f for f in active if f.remaining <= 1e-9 * max(1.0, f.rate)]
        if not done:
            continue
        active = [f for f in active if f not in done]
        for f in done:
            arrived[f.key] = now + f.latency
            delivered[f.key] = now
            if queued[(f.src, f.dst)]:
                active.append(queued[(f.src, f.dst)].popleft())
        for rank in ranks:
            if not rank.finished:
                run(rank)
    stuck = [r.rank for r in ranks if not r.finished]
    if stuck:
        raise RuntimeError(f"ranks {stuck} never received what they wait for: the schedule is not a closed set")
    ends = []
    for rank in ranks:  # a rank is done once its last message has landed at the peer, too
        sent = [arrived[(rank.rank, d, n)] for d, count in rank.sent.items() for n in range(count)]
        ends.append(max([rank.clock, *sent]))
    return max(ends, default=0.0)


def _apply_oldest(rank: _Rank, arrived: dict, gamma: float, itemsize: int) -> bool:
    a = rank.unapplied[0]
    key = rank.recv_key[a.index]
    if key not in arrived:
        return False
    rank.unapplied.popleft()
    rank.clock = max(rank.clock, arrived[key])
    if a.kind is Kind.REDUCE:
        rank.clock += (a.stop - a.start) * itemsize * gamma
    return True


def _apply_through(rank: _Rank, a: Action, arrived: dict, gamma: float, itemsize: int) -> bool:
    """Apply receives, oldest first, until none before ``a`` overlaps it (False: one has not
    arrived yet, and the rank waits for it)."""
    while any(p.index < a.index and p.overlaps(a.start, a.stop) for p in rank.unapplied):
        if not _apply_oldest(rank, arrived, gamma, itemsize):
            return False
    return True
