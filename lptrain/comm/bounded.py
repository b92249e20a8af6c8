"""The process group's own collectives, each bounded by the caller's timeout.

``torch.distributed.all_reduce``, ``barrier`` and ``all_gather_object`` wait as long as the
group's own timeout, which whoever made the group chose (gloo's default is 30 minutes), not
the ``timeout_s`` the user gave lptrain: a DDP script's group, for one, is the user's. So the
few collectives lptrain issues on a group besides its schedules' messages (the desync check,
the trainer's sums and flags, the link measurement, the barrier before leaving) go through
these, which hand the timeout to the backend with the operation (``AllreduceOptions.timeout``
and friends). Gloo then ends its own wait there: the error comes at the user's bound, and no
gloo worker thread is left blocked behind a stalled peer. NCCL's operations are bounded by the
group's own timeout and its watchdog (the trainer and the benchmark make their group with the
user's setting).

Each raises the backend's error; callers turn it into their one named line
(``lptrain.comm.distributed.peer_failure``).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, BroadcastOptions, ReduceOptions

Timeout = datetime.timedelta


def _group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    if group is None or group is dist.group.WORLD:
        return dist.distributed_c10d._get_default_group()
    return group


def all_reduce(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    timeout: Timeout | None,
    op: dist.ReduceOp = dist.ReduceOp.SUM,
) -> None:
    """``dist.all_reduce(tensor, op, group)`` that waits at most ``timeout`` (None: the group's own)."""
    issue_all_reduce(tensor, group, timeout, op).wait()


def issue_all_reduce(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    timeout: Timeout | None,
    op: dist.ReduceOp = dist.ReduceOp.SUM,
) -> dist.Work:
    """``all_reduce`` started, its work to wait for: the operation itself gives up at ``timeout``."""
    opts = AllreduceOptions()
    opts.reduceOp = op
    return _group(group).allreduce([tensor], _bounded(opts, timeout))


def issue_reduce(
    tensor: torch.Tensor,
    root: int,
    group: dist.ProcessGroup | None,
    timeout: Timeout | None,
    op: dist.ReduceOp = dist.ReduceOp.SUM,
) -> dist.Work:
    """``dist.reduce`` to ``root`` (its rank in ``group``) started, bounded as ``issue_all_reduce``."""
    opts = ReduceOptions()
    opts.reduceOp, opts.rootRank, opts.rootTensor = op, root, 0
    return _group(group).reduce([tensor], _bounded(opts, timeout))


def issue_broadcast(
    tensor: torch.Tensor, root: int, group: dist.ProcessGroup | None, timeout: Timeout | None
) -> dist.Work:
    """``dist.broadcast`` from ``root`` (its rank in ``group``) started, bounded as ``issue_all_reduce``."""
    opts = BroadcastOptions()
    opts.rootRank, opts.rootTensor = root, 0
    return _group(group).broadcast([tensor], _bounded(opts, timeout))


def _bounded(opts, timeout: Timeout | None):
    if timeout is not None:
        opts.timeout = timeout
    return opts


def barrier(group: dist.ProcessGroup | None, timeout: Timeout | None) -> None:
    """``dist.barrier(group)`` that waits at most ``timeout`` (None: the group's own)."""
    dist.barrier(group=_group(group), timeout=timeout)


def wait(work: dist.Work, group: dist.ProcessGroup | None, timeout: Timeout | None) -> None:
    """Wait for a point-to-point ``work`` on ``group`` at most ``timeout``. On NCCL a wait with a
    timeout polls from the host (``lptrain.comm.distributed.wait_timeout``): there the group's
    own timeout bounds it."""
    if timeout is None or dist.get_backend(_group(group)) == "nccl":
        work.wait()
    else:
        work.wait(timeout)


def all_gather_text(
    text: str, group: dist.ProcessGroup | None, timeout: Timeout | None, device: torch.device
) -> list[str]:
    """Every rank's ``text``, in rank order, each gather waiting at most ``timeout``: what
    ``dist.all_gather_object`` does for a string, with a bound and no unpickling of a peer's bytes."""
    pg = _group(group)
    world = dist.get_world_size(pg)
    mine = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    _all_gather(pg, sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=device), timeout)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: mine.numel()] = mine
    parts = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    _all_gather(pg, parts, padded, timeout)
    return [bytes(p[: int(s.item())].tolist()).decode(errors="replace") for p, s in zip(parts, sizes)]


def _all_gather(pg: dist.ProcessGroup, out: list[torch.Tensor], tensor: torch.Tensor, timeout: Timeout | None) -> None:
    pg.allgather([out], [tensor], _bounded(AllgatherOptions(), timeout)).wait()
