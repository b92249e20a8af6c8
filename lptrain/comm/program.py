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
  exchange with a new partner and add what the last one brought); and a receive is
  posted only once the receives of earlier steps are in. The transport moves a message
  only once its receive is posted (gloo waits for the receiver's notice), so this keeps a
  partner that reached the next step early from sending into this rank's port while the
  last step's bytes still come in: the two would share the port, and the step that
  finishes last sets everyone's pace (``lptrain.sim.dataflow.run_dataflow`` counts such
  messages; docs/simulator.md shows BE's);
* ``phases``: a send waits for every receive of earlier steps, and receives are still
  posted ahead (LP's allreduce as a reduce, then a broadcast). Data alone lets the chain's
  last rank start the broadcast's first block while the reduce's last blocks still come in,
  and the next rank takes both through its one port: the reduce, the critical path, then
  runs at half the rate while that rank's other port direction idles, and it waits for the
  broadcast's head anyway (it forwards the broadcast only after the reduce, in program
  order). The simulator priced a 4 MiB allreduce in 128 KiB blocks that way at 2.21 n/B over
  4 one-port nodes against 2.00 with the broadcast held back, 9.15 against 8.53 across 4
  racks with uplinks at a quarter of a port. Measured on the emulated cluster (200 Mbit/s
  ports, 2-core host, 2026-12-06, `lptrain-bench --op allreduce -b 4M -e 16M -f 4 --algo
  lp,lp-rb -n 1 --trials 3`, before and after in two runs 20 minutes apart), lp-rb took
  2.46 -> 2.03 n/B at 4 MiB and 2.12 -> 2.04 at 16 MiB over 4 nodes, 3.14 -> 2.35 and
  2.39 -> 2.33 over 16, 9.11 -> 8.84 and 8.60 -> 8.51 over 4 racks of one node with
  uplinks at a quarter of a port (8.79 -> 8.56 and 8.33 -> 8.60 over 8 nodes in 4 racks);
  the overlapped lp, unchanged, read 2.68 and 2.45 over 4 nodes and 2.44 and 2.29 over 16
  at 4 MiB in the same two runs;
* ``gather``: ``ports``, and receives pending from at most two peers at once (the ring
  reduce's last step, where every other rank sends its chunk to the root). Posted all at
  once, the P - 1 senders start together into the root's port, and now and then their
  bursts overflow its queue and TCP waits to resend (incast). Two at a time keep the port
  busy, the second sender's notice already out when the first one's bytes end.

How large the segments are and whether sends are paced follow the link as measured at
start (``auto_segment_bytes``, ``pacing_rate``), for both as well: on a slow link a
message's CPU cost is small beside its transfer, so messages are cut to what the link
carries in 10 ms (a chain's blocks in 5 ms) and sends are paced at its rate; on a fast one (loopback, shared memory)
the CPU sets the time, so a message is a rank's share of a step (1 to 4 MiB) and nothing is
paced. An algorithm's op may take the share on a slow link too (its module's ``MESSAGES``,
``MESSAGE_RULES``): BE's allreduce, whose steps leave no transfer to hide a message's cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from lptrain.comm.schedule import Kind, Schedule

T = TypeVar("T")

# Without a measured link: a rank's share of the message (n / P) per message, within 1..4 MiB.
# Each message costs some 70 to 90 us of CPU (Python, gloo's bookkeeping, two system calls)
# and on two shared cores CPU time is what the ranks wait for: a 16 MiB ring allreduce over
# 4 processes spent 74, 66 and 60 ms of CPU (all ranks) with 1, 2 and 4 MiB segments and
# took 0.81, 0.89 and 0.93 of gloo's speed (2-core machine, 2026-12-03). Cutting a share finer
# only overlaps one addition with the transfer, which a ring does not need (every rank sends
# while it receives); 4 MiB keeps a tree's pipelining and the staging window bounded.
AUTO_SEGMENT_BYTES = (1 << 20, 4 << 20)
# A slow link: a message's cost is small beside its transfer, and a 4 MiB segment holds a
# link for long (170 ms at 200 Mbit/s), which delays what queues behind it (a tree's next
# hop, the peer's notice that a receive is posted); there the segment is what the link
# carries in 10 ms, about a hundred times a message's CPU cost (the link's measured alpha is
# no guide here: on a busy machine the fastest small exchange waits for four processes to
# get a core, and read 3 ms where the quiet machine read 0.13).
LINK_SEGMENT_SECONDS = 0.01
MIN_LINK_SEGMENT_BYTES = 64 << 10
# A pipelined chain's block (LP's ``block_size=auto``) on a slow link: what the link carries in
# 5 ms (a power of two, at least 128 KiB), half a segment at 200 Mbit/s. The chain's fill is P - 2 blocks,
# each a block's time on the link, so the block should be small; but every block is a message
# on each rank, and with many ranks on few cores each message costs more than its transfer
# hides. On the emulated star at 200 Mbit/s (lptrain-cluster, 2-core machine, 2026-12-05,
# `lptrain-bench --op broadcast|reduce -b 4M -e 16M -f 4 --algo lp --lp-block
# auto,128K,64K,32K,16K`, auto being 256 KiB then), in n/B: P = 16, 4 MiB broadcast 1.48
# (256K), 1.15 (128K), 1.31 (64K), 1.75 (32K), 2.90 (16K); reduce 1.46, 1.19, 1.45, 2.09,
# 4.49; 16 MiB broadcast 1.14, 1.10, 1.26; reduce 1.21, 1.20, 1.64. P = 8, 4 MiB broadcast
# 1.19, 1.10, 1.11, 1.24; reduce 1.18, 1.09, 1.14, 1.46; 16 MiB broadcast 1.07, 1.04, 1.06;
# reduce 1.12, 1.11, 1.22. A message's cost there overlaps the transfer of the one before
# (a step costs the larger of the two, not their sum), so the cost model's square-root block
# (``lptrain.comm.algorithms.lp.optimal_block_bytes``, a cost added to every step) does not
# apply; below a few of a message's costs (1 to 2 ms with 8 to 16 processes on 2 cores) a
# smaller block loses far more than a larger one gains. Not below 128 KiB: on 2 and 4 racks
# joined by uplinks at a quarter of a port (the link measured is the uplink's, 6.25 MB/s) 32
# KiB blocks took an allreduce of 16 MiB to 12.9 and 23.7 n/B where 256 KiB blocks in 64 KiB
# messages had taken 4.4 and 9.2 (each message waits for its receiver's notice, which queues
# behind the other direction's data on the uplink); at half a port, 64 KiB blocks over 8
# nodes took 4.15 n/B against 2.27 (same grid, 2026-12-05).
PIPELINE_BLOCK_SECONDS = 0.005
MIN_PIPELINE_BLOCK_BYTES = 128 << 10
# A fast link: one that moves bytes at least about as fast as a core adds float32 arrays
# (about 2 GB/s here; loopback gloo measured 1.3 to 3.6 GB/s, a 10 Gbit/s port is 1.25) leaves
# the CPU, not the link, setting the time, and no queue builds up on it that pacing would have
# to drain: sends are not paced there, and a segment is the share within 1..4 MiB. Whole
# steps as one message (the share up to 64 MiB) were tried there: a 64 MiB allreduce over 4
# loopback processes (more ranks than cores) gained 5 to 7% (ring 128 -> 122 ms, LP 148 ->
# 138), but over 2 processes it lost 17% (ring 40 -> 49 ms), the addition of a whole share no
# longer overlapping the transfer of the next segment (2-core machine, 2026-12-05, 8 calls each).
FAST_LINK_BYTES_PER_S = 500e6
# The fastest receive of the ring measured at start counts as a port's own rate, apart from
# the slowest link's, only this much above it: below it the two differ by noise (the ranks'
# exchanges on the emulated star differ by a few percent), and one figure is kept. Racks
# joined by uplinks at half a port or less stand apart (``pacing_rate``).
PORT_APART = 1.25


def port_apart(slowest_bytes_per_s: float, fastest_bytes_per_s: float) -> float | None:
    """The fastest link's rate as a port's own where it stands ``PORT_APART`` above the
    slowest link's, else None (one figure): the executor's measurement and the simulator's
    model of it both ask here."""
    return fastest_bytes_per_s if fastest_bytes_per_s >= PORT_APART * slowest_bytes_per_s else None


def fast_link(bytes_per_s: float | None) -> bool:
    """Whether a link measured at ``bytes_per_s`` (None: not measured) is fast enough that the
    CPU, not the link, sets the time (``FAST_LINK_BYTES_PER_S``)."""
    return bytes_per_s is not None and bytes_per_s >= FAST_LINK_BYTES_PER_S


# How an algorithm's op cuts its messages on a slow link (its module's ``MESSAGES``; on a fast
# link, or none measured, every op takes the share):
# * ``link``: what the link carries in ``LINK_SEGMENT_SECONDS`` (above), the default;
# * ``share``: a rank's share within 1..4 MiB, as on a fast link. For a program whose every step
#   waits for the last step's receives and trades with a new partner (BE's allreduce under
#   ``steps``), no transfer hides a message's CPU cost: every rank posts its step's messages at
#   the step's start, all at once, and with many ranks on few cores they queue for a core.
#   Over 16 emulated nodes on 2 cores (200 Mbit/s, 2026-12-06, calls alternating, the slowest
#   rank's time) BE's 4 MiB allreduce took 2.10 n/B in 256 KiB messages (median of 10 calls;
#   of 6 in another run, 2.21), 2.06 in 1 MiB, 2.02 in 2 MiB and 2.48 in 64 KiB (model 1.88);
#   at 16 MiB 2.17 in 256 KiB and 1.96 in 1 MiB; over 4 and 8 nodes 1.54 and 1.81 against
#   1.51 and 1.79. The ring, with as many messages, hides them (1.96): its receives are
#   posted ahead. BE's broadcast and reduce keep ``link``: its broadcast took 1.68 to 1.72
#   n/B in 384 KiB to 4 MiB messages over 4 nodes against 1.51 in 256 KiB (2.64 against 1.95
#   over 16), and its reduce measured the same either way. The broadcast's 256 KiB messages are
#   good only with its sends paced (``PortQueue``): unpaced they took 1.70 n/B; in 512 KiB ones
#   it took 1.69 to 1.71 paced or not, and 1.64 to 1.82 with 4 to 64 receives posted ahead
#   (4 nodes, 16 MiB; why the pacing stops working with larger messages is not found).
MESSAGE_RULES = ("link", "share")


def auto_segment_bytes(nbytes: int, world_size: int, bytes_per_s: float | None = None, rule: str = "link") -> int:
    """Bytes per message of an ``nbytes`` collective with ``segment_size=auto``, on a link
    measured at ``bytes_per_s`` (None: not measured): a rank's share within 1..4 MiB; on a slow
    link, under the ``link`` rule, at most what it carries in ``LINK_SEGMENT_SECONDS`` (a power
    of two, at least 64 KiB); on a fast one, or under the ``share`` rule, the share (the
    constants above say why)."""
    if rule not in MESSAGE_RULES:
        raise ValueError(f"unknown message rule {rule!r}; valid: {', '.join(MESSAGE_RULES)}")
    low, high = AUTO_SEGMENT_BYTES
    share = min(max(nbytes // world_size, low), high)
    if rule == "share" or bytes_per_s is None or fast_link(bytes_per_s):
        return share
    return min(share, _carried_in(LINK_SEGMENT_SECONDS, bytes_per_s, MIN_LINK_SEGMENT_BYTES))


def _carried_in(seconds: float, bytes_per_s: float, floor: int) -> int:
    """What a link at ``bytes_per_s`` carries in ``seconds``, rounded up to a power of two,
    at least ``floor``: the shared shape of the slow-link segment and block."""
    carried = max(seconds * bytes_per_s, 1)
    return max(floor, 1 << max(0, math.ceil(math.log2(carried))))


def pipeline_block_bytes(bytes_per_s: float | None) -> int | None:
    """LP's automatic block on a link measured at ``bytes_per_s``: on a slow link what it
    carries in ``PIPELINE_BLOCK_SECONDS`` (a power of two, at least ``MIN_PIPELINE_BLOCK_BYTES``,
    128 KiB);
    None on a fast link or none measured, where the cost model and the segment size it."""
    if bytes_per_s is None or fast_link(bytes_per_s):
        return None
    return _carried_in(PIPELINE_BLOCK_SECONDS, bytes_per_s, MIN_PIPELINE_BLOCK_BYTES)


def pacing_rate(bytes_per_s: float | None, port_bytes_per_s: float | None = None) -> float:
    """The rate the ``ports`` and ``steps`` orders pace sends at where the ring's slowest link
    was measured at ``bytes_per_s`` and its fastest, a port's, at ``port_bytes_per_s`` (None:
    the same): a port's on a slow link, 0 (no pacing) on a fast one or none measured.

    A port, not the slowest link: ``PortQueue`` holds a send until the bytes before it would
    have left this rank's port, and they leave it at the port's rate even where the ring's
    slowest link is an uplink between racks. Paced at the uplink's rate, every step in a rack
    waited as if its bytes had crossed the uplink. On 2 emulated racks of 4 nodes at 200
    Mbit/s (lptrain-cluster, 2-core machine, 2026-12-06, `lptrain-bench --op allreduce -b 4M
    -e 16M -f 4 --algo lp,lp-rb,mst,be,ring --trials 3`, one run each way on the same links)
    BE's allreduce took, in n/B at 4 and 16 MiB, 10.51 and 8.53 paced at the uplink's rate
    against 5.51 and 5.55 at the port's with uplinks at a quarter of a port (5.5 is the
    uplink's own bound), 5.65 and 4.51 against 4.49 and 3.61 at half a port; MST's 13.83 and
    14.72 against 9.81 and 11.56, and 7.67 and 8.71 against 6.10 and 7.58. LP (``eager``,
    never paced) and the ring (one peer a step) were the same either way."""
    if bytes_per_s is None or fast_link(bytes_per_s):
        return 0.0
    return port_bytes_per_s if port_bytes_per_s is not None else bytes_per_s


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

    The executor and the simulator ask it of what each still has pending (the receives
    posted and not yet applied, the sends issued), which keeps a send's cost to that rather
    than to the whole program. The two flags say whether an order waits for earlier sends
    or receives at all, so that a runner skips what it never waits for."""

    name: str
    waits_for_sends: bool  # earlier steps' sends to other peers
    waits_for_receives: bool  # earlier steps' receives
    posts_after_receives: bool = False  # a receive is posted only once earlier steps' receives are in
    receiving_peers: int = 0  # receives pending from at most this many peers at once (0: any)

    def may_post(self, receive: Action, pending: Iterable[Action]) -> bool:
        """Whether ``receive`` may be posted now, with the ``pending`` receives (posted, not yet
        in and applied): under ``steps``, only once no receive of an earlier step is pending;
        under ``gather``, only while fewer than ``receiving_peers`` other peers have one pending."""
        if self.receiving_peers:
            pending = tuple(pending)  # asked twice below
        if self.posts_after_receives and any(r.step < receive.step for r in pending):
            return False
        if self.receiving_peers:
            peers = {r.peer for r in pending}
            return receive.peer in peers or len(peers) < self.receiving_peers
        return True

    def applies_first(self, action: Action, unapplied: Iterable[Action]) -> bool:
        """Whether one of the ``unapplied`` receives comes before ``action`` and wrote elements
        it reads or overwrites. Receives apply oldest first, so a runner applies the oldest
        and asks again until the answer is no."""
        return any(r.index < action.index and r.overlaps(action.start, action.stop) for r in unapplied)

    def sends_first(self, send: Action, issued: Mapping[int, tuple[Action, T]]) -> list[int]:
        """Of the sends ``issued`` before ``send`` (program index -> the send and what the runner
        keeps for it: a handle, a message's key), those that must be complete before ``send``."""
        if not self.waits_for_sends:
            return []
        return [i for i, (s, _) in issued.items() if s.step < send.step and s.peer != send.peer]

    def receives_first(self, send: Action, earlier: Iterable[Action]) -> list[Action]:
        """Of the actions ``earlier`` than ``send``, the receives that must be in (and, in the
        executor, applied) before ``send`` is issued."""
        if not self.waits_for_receives:
            return []
        return [r for r in earlier if not r.send and r.step < send.step]

    def waits(self, program: Sequence[Action], send: Action) -> Waits:
        """Every earlier action of ``program`` that ``send`` waits for: the answers above over the
        whole program at once (for reading and tests; the runners ask of what is pending)."""
        earlier = program[: send.index]
        return Waits(
            applied=tuple(r.index for r in earlier if not r.send and self.applies_first(send, (r,))),
            sends=tuple(self.sends_first(send, {s.index: (s, None) for s in earlier if s.send})),
            receives=tuple(r.index for r in self.receives_first(send, earlier)),
        )


ISSUE_POLICIES: dict[str, IssuePolicy] = {
    "eager": IssuePolicy("eager", waits_for_sends=False, waits_for_receives=False),
    "ports": IssuePolicy("ports", waits_for_sends=True, waits_for_receives=False),
    "steps": IssuePolicy("steps", waits_for_sends=True, waits_for_receives=True, posts_after_receives=True),
    "gather": IssuePolicy("gather", waits_for_sends=True, waits_for_receives=False, receiving_peers=2),
    "phases": IssuePolicy("phases", waits_for_sends=False, waits_for_receives=True),
}
ISSUE_ORDERS = tuple(ISSUE_POLICIES)  # the names an algorithm's ISSUE_ORDER may use


def issue_policy(order: str) -> IssuePolicy:
    """The policy of the issue order named ``order``; the executor and the simulator both
    look it up here, so the two cannot disagree on what an order means."""
    if order not in ISSUE_POLICIES:
        raise ValueError(f"unknown issue order {order!r}; valid: {', '.join(ISSUE_ORDERS)}")
    return ISSUE_POLICIES[order]


class PortQueue:
    """A rank's outgoing port as one queue drained at the rate measured at start
    (``pacing_rate``): when the bytes of each step issued so far would have left it, and
    which peers that step sent to. The executor holds a send to a new peer until
    ``drained`` (its ``ports`` and ``steps`` orders on a slow link), and the simulator
    replays the same clock, so it prices the wait the executor takes.

    The rate is one figure, a port's: the fastest link of the ring the transport was
    measured on (``lptrain.comm.transport``, ``pacing_rate``). Bytes to a peer behind a
    thinner uplink are counted as leaving at the port's rate, though the uplink carries them
    slower: the port is free for the next step's peer meanwhile."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.free = 0.0  # when the bytes issued so far would have left the port
        self.steps: dict[int, tuple[float, set[int]]] = {}  # step -> (when its bytes have left, its peers)

    def drained(self, a: Action) -> float:
        """When the bytes of the earlier steps that sent to a peer other than ``a``'s have left."""
        return max((t for s, (t, to) in self.steps.items() if s < a.step and to - {a.peer}), default=0.0)

    def queue(self, a: Action, nbytes: int, now: float) -> None:
        """Add a send of ``nbytes`` issued at ``now`` (seconds on the caller's clock)."""
        self.free = max(self.free, now) + nbytes / self.rate
        self.steps[a.step] = (self.free, self.steps.get(a.step, (0.0, set()))[1] | {a.peer})
