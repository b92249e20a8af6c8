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
goes at its pace), so that all of them cut the message into the same blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

SMALL_BYTES = 8
LARGE_BYTES = 4 << 20


@dataclass(frozen=True)
class LinkCost:
    """Seconds per message and per byte of one point-to-point transfer."""

    alpha_s: float
    beta_s_per_byte: float

    def describe(self) -> str:
        return f"{self.alpha_s * 1e6:.0f} us per message, {1 / self.beta_s_per_byte / 1e9:.2f} GB/s"


def link_cost(small_s: float, large_s: float, large_bytes: int = LARGE_BYTES) -> LinkCost:
    """Latency and inverse bandwidth from the times of a tiny and a large exchange.

    Where noise leaves the large exchange no slower than twice the small one, its whole
    time is taken as transfer time: a pessimistic bandwidth rather than an infinite one.
    """
    alpha = max(small_s, 1e-7)
    moving = large_s - small_s if large_s > 2 * small_s else large_s
    return LinkCost(alpha, max(moving, 1e-9) / large_bytes)


def _exchange(buf_out: torch.Tensor, buf_in: torch.Tensor, rank: int, world: int, group) -> float:
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    began = time.perf_counter()
    recv = dist.irecv(buf_in, dist.get_global_rank(group, prev), group=group)
    send = dist.isend(buf_out, dist.get_global_rank(group, nxt), group=group)
    send.wait()
    recv.wait()
    if buf_in.is_cuda:
        torch.cuda.synchronize(buf_in.device)
    return time.perf_counter() - began


def measure_link(group, device: torch.device, reps: int = 9) -> LinkCost:
    """Every rank of ``group`` together: the slowest link's ``LinkCost`` (the same on all)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    times = []
    for nbytes in (SMALL_BYTES, LARGE_BYTES):
        out = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        into = torch.empty_like(out)
        for _ in range(2):  # warm-up: connections, allocations, first touch
            _exchange(out, into, rank, world, group)
        times.append(min(_exchange(out, into, rank, world, group) for _ in range(reps)))
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    small, large = slowest.tolist()
    return link_cost(small, large)
