"""What one message costs on this process group's transport, measured where it runs.

LP's automatic block size balances the pipeline's fill (``(P - 2)`` extra steps) against
the per-message cost ``alpha`` (``lptrain.comm.algorithms.lp.optimal_block_bytes``). In
one process a "message" is a tensor copy plus some Python (about 10 us); across processes
it is a gloo or NCCL send, which costs several times more and differs from machine to
machine. So the distributed LP measures its own transport when it is built: every rank
sends a small and a large message to the next rank of a ring while receiving from the
previous one, several times each; the fastest small exchange is ``alpha``, the fastest
large one's extra time per byte is ``beta`` (the fastest, not the median: on a busy
machine a process waiting for its turn on a core only ever adds time, and on two cores
shared by four processes a median small exchange measured 2.6 ms where the fastest took
a few tens of microseconds); and the ranks take the slowest link's figures (the pipeline
goes at its pace), so that all of them cut the message into the same blocks. A few more
large exchanges, each started from a barrier, give the fastest *receive*: a port's own rate
where some neighbours of the ring share a rack and others cross a thinner uplink (on two
racks of two every exchange crosses the uplink one way or the other, but half the receives
do not). A rank's sends leave its port at that rate, and the executor paces them by it
(``lptrain.comm.program.pacing_rate``).
"""

from __future__ import annotations

import datetime
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lptrain.comm import bounded
from lptrain.comm.program import port_apart

SMALL_BYTES = 8
LARGE_BYTES = 4 << 20
# Barrier-started large exchanges for a port's rate: apart from the others, so the slowest
# link's figures come from back-to-back exchanges as before (a barrier lets a shaped port's
# token bucket refill, and the 4 MiB exchange then reads a few percent faster: 26.0 MB/s on
# a 25 MB/s port, near where the segment and LP's block would double).
PORT_REPS = 5


@dataclass(frozen=True)
class LinkCost:
    """Seconds per message and per byte of one point-to-point transfer."""

    alpha_s: float
    beta_s_per_byte: float  # the slowest link of the ring measured
    # A port's, where the ring's fastest receive stood apart from the slowest (None: one figure)
    port_beta_s_per_byte: float | None = None

    def describe(self) -> str:
        text = f"{self.alpha_s * 1e6:.0f} us per message, {_speed(1 / self.beta_s_per_byte)}"
        if self.port_beta_s_per_byte is not None:
            text += f" (a port {_speed(1 / self.port_beta_s_per_byte)})"
        return text


def _speed(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.1f} MB/s"


def link_cost(
    small_s: float, large_s: float, large_bytes: int = LARGE_BYTES, fastest_large_s: float | None = None
) -> LinkCost:
    """Latency and inverse bandwidth from the times of a tiny and a large exchange, the
    slowest link's; with ``fastest_large_s``, the fastest link's large exchange, a port's
    inverse bandwidth too where it stands apart (``lptrain.comm.program.port_apart``).

    Where noise leaves the large exchange no slower than twice the small one, its whole
    time is taken as transfer time: a pessimistic bandwidth rather than an infinite one.
    """
    alpha = max(small_s, 1e-7)

    def per_byte(large: float) -> float:
        moving = large - small_s if large > 2 * small_s else large
        return max(moving, 1e-9) / large_bytes

    beta = per_byte(large_s)
    port = port_apart(1 / beta, 1 / per_byte(fastest_large_s)) if fastest_large_s is not None else None
    return LinkCost(alpha, beta, 1 / port if port is not None else None)


def timed_exchange(
    buf_out: torch.Tensor,
    buf_in: torch.Tensor,
    send_to: int,
    receive_from: int,
    group,
    timeout: datetime.timedelta | None = None,
) -> float:
    """Send ``buf_out`` to rank ``send_to`` of ``group`` while receiving ``buf_in`` from
    ``receive_from``, posted as one batch: on NCCL, unbatched operations run one after the
    other on one stream, and a receive posted first on every rank would wait forever for a
    send queued behind the peer's receive. Seconds until both are done; each waits at most
    ``timeout`` (None: the group's own)."""
    return _timed_parts(buf_out, buf_in, send_to, receive_from, group, timeout)[1]


def _timed_parts(
    buf_out: torch.Tensor, buf_in: torch.Tensor, send_to: int, receive_from: int, group, timeout
) -> tuple[float, float]:
    """``timed_exchange``'s batch: seconds until the receive was in, and until both were done.
    The receive alone crosses one link, from ``receive_from``'s port to this rank's, where the
    exchange's time is that of the slower of two (on NCCL the batch ends as one: the same)."""
    ops = [
        dist.P2POp(dist.irecv, buf_in, dist.get_global_rank(group, receive_from), group),
        dist.P2POp(dist.isend, buf_out, dist.get_global_rank(group, send_to), group),
    ]
    began = time.perf_counter()
    received = None
    for work in dist.batch_isend_irecv(ops):
        bounded.wait(work, group, timeout)
        if buf_in.is_cuda:
            torch.cuda.synchronize(buf_in.device)
        received = time.perf_counter() - began if received is None else received
    return received, time.perf_counter() - began


def _exchange(
    buf_out: torch.Tensor, buf_in: torch.Tensor, rank: int, world: int, group, timeout
) -> tuple[float, float]:
    """The link measurement's exchange, to the next rank and from the previous one: seconds
    until the receive was in, and until both were done."""
    return _timed_parts(buf_out, buf_in, (rank + 1) % world, (rank - 1) % world, group, timeout)


def _started_together(
    buf_out: torch.Tensor, buf_in: torch.Tensor, rank: int, world: int, group, timeout
) -> tuple[float, float]:
    """``_exchange`` from a barrier: back to back, a rank whose last exchange ended early (its
    send was in the socket's buffer) posts its receive before the sender is done with its
    own, and the receive's time is that wait's as much as its link's (two racks of two at
    200 Mbit/s, the uplink at half: an in-rack receive took 0.29 s for 0.17 s of transfer,
    in step with the uplink's exchanges)."""
    bounded.barrier(group, timeout)
    return _exchange(buf_out, buf_in, rank, world, group, timeout)


def measure_link(
    group,
    device: torch.device,
    reps: int = 9,
    small_reps: int = 30,
    timeout: datetime.timedelta | None = None,
    port_reps: int = PORT_REPS,
) -> LinkCost:
    """Every rank of ``group`` together: the slowest link's ``LinkCost``, with the fastest
    link's rate as a port's where it stands apart (the same on all).
    Small exchanges cost nothing much, so they are repeated more: the fastest of them is
    ``alpha``, and on a busy machine it takes many tries to catch every rank on a core. Each
    wait ends at ``timeout`` (None: the group's own)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    times = []  # this rank's fastest small exchange, large exchange, and large receive
    for nbytes, tries in ((SMALL_BYTES, small_reps), (LARGE_BYTES, reps)):
        out = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        into = torch.empty_like(out)
        for _ in range(2):  # warm-up: connections, allocations, first touch
            _exchange(out, into, rank, world, group, timeout)
        times.append(min(_exchange(out, into, rank, world, group, timeout)[1] for _ in range(tries)))
    times.append(min(_started_together(out, into, rank, world, group, timeout)[0] for _ in range(port_reps)))
    # The slowest exchanges, small and large, and (negated) the fastest large receive: a
    # receive crosses one link, where every exchange on two racks of two crosses the uplink
    # one way or the other. One reduction.
    extremes = torch.tensor([times[0], times[1], -times[2]], dtype=torch.float64, device=device)
    bounded.all_reduce(extremes, group, timeout, op=dist.ReduceOp.MAX)
    small, large, fastest = extremes.tolist()
    return link_cost(small, large, fastest_large_s=-fastest)


_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def link_of(group, device: torch.device, timeout: datetime.timedelta | None = None) -> LinkCost:
    """``measure_link`` once per process group (every communicator built on it shares the
    figure; the ranks build theirs in the same order, so they measure together)."""
    if group not in _MEASURED:
        _MEASURED[group] = measure_link(group, device, timeout=timeout)
    return _MEASURED[group]


@dataclass(frozen=True)
class PortRate:
    """Bytes per second one rank sent to the next and received from the previous, measured
    with no other transfer in flight, so each figure is that port's own."""

    rank: int
    send_bps: float
    recv_bps: float

    @property
    def best_bps(self) -> float:
        return max(self.send_bps, self.recv_bps)


def port_rates(
    group, device: torch.device, nbytes: int = 1 << 20, timeout: datetime.timedelta | None = None
) -> list[PortRate]:
    """Every rank's port, one transfer at a time: rank r sends ``nbytes`` to rank r + 1 while
    the others wait. The same list on every rank. A port slow both ways slows both transfers
    it takes part in, its neighbours only one each: ``slowest_port`` tells them apart. Each
    wait ends at ``timeout`` (None: the group's own)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    took = torch.zeros(world, dtype=torch.float64, device=device)
    for sender in range(world):
        receiver = (sender + 1) % world
        for attempt in range(2):  # the first pays for connections and first touches
            bounded.barrier(group, timeout)
            began = time.perf_counter()
            if rank == sender:
                bounded.wait(dist.isend(buf, dist.get_global_rank(group, receiver), group=group), group, timeout)
            elif rank == receiver:
                bounded.wait(dist.irecv(buf, dist.get_global_rank(group, sender), group=group), group, timeout)
            if buf.is_cuda:
                torch.cuda.synchronize(buf.device)
            if rank == receiver and attempt == 1:  # complete once the last byte is in
                took[sender] = time.perf_counter() - began
    bounded.all_reduce(took, group, timeout)  # each entry was set by one rank
    seconds = took.tolist()
    return [PortRate(r, nbytes / seconds[r], nbytes / seconds[(r - 1) % world]) for r in range(world)]


def slowest_port(rates: list[PortRate], margin: float = 0.75) -> PortRate | None:
    """The rank whose port is slow both ways (its faster direction below ``margin`` times the
    others' median), or None when no port stands out. Needs three ranks: between two, each
    transfer involves both ports."""
    if len(rates) < 3:
        return None
    slowest = min(rates, key=lambda r: r.best_bps)
    others = sorted(r.best_bps for r in rates if r is not slowest)
    median = others[len(others) // 2]
    return slowest if slowest.best_bps < margin * median else None
