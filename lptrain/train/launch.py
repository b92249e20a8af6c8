"""Running under ``torchrun``: join the process group and the few cross-process helpers.

``torchrun --nproc-per-node N -m lptrain ...`` starts N processes with RANK, WORLD_SIZE
and friends in their environment; each one trains its replicas (``trainer.devices``
per process) and the gradients cross processes through ``torch.distributed`` (gloo for
CPU devices, NCCL for GPUs). Only rank 0 logs, evaluates and writes checkpoints.

The few collectives of the trainer's own (the loss sum, the stop and overflow flags, the
comparison of the replicas, the barrier before leaving) wait at most the timeout the group
was joined with (``trainer.comm_timeout_s``; the benchmark's ``--timeout``), handed to each
operation (``lptrain.comm.bounded``), so the bound holds on a group made by someone else too.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from lptrain.comm import (
    bounded,
    group_teardown,  # noqa: F401 (imported before any group is joined)
    liveness,
)
from lptrain.comm.distributed import peer_failure
from lptrain.train.parent import stop_with_launcher

T = TypeVar("T")

_timeout: datetime.timedelta | None = None  # the bound of the helpers' collectives: the user's setting


def bound_collectives(timeout: datetime.timedelta | None) -> None:
    """From now on the helpers below wait at most ``timeout`` (None: the group's own): set
    when this process joins, and by a caller that runs on a group it did not make."""
    global _timeout
    _timeout = timeout


def _bound() -> datetime.timedelta | None:
    return _timeout


def launched_by_torchrun() -> bool:
    """Started by torchrun (which sets TORCHELASTIC_RUN_ID, even for one process), or by
    anything else that sets RANK for a world of several processes."""
    if "RANK" not in os.environ:
        return False
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def init_from_environment(devices: list[torch.device], timeout_s: float) -> tuple[int, int]:
    """(rank, number of processes); joins the default group when torchrun started us.

    With GPUs the process first makes its own GPU the current device and names it to the
    group: NCCL's helpers that take no device (``all_gather_object``, barriers, the
    ``batch_isend_irecv`` bookkeeping) use the current device, which is otherwise
    ``cuda:0`` in every process, and NCCL fails on two ranks sharing one GPU.
    """
    if not launched_by_torchrun():
        return 0, 1
    if "TORCHELASTIC_RUN_ID" in os.environ:
        stop_with_launcher()
    bound_collectives(datetime.timedelta(seconds=timeout_s))
    if not dist.is_initialized():
        join_default_group(devices[0], _timeout)
    return dist.get_rank(), dist.get_world_size()


def join_default_group(device: torch.device, timeout: datetime.timedelta | None = None) -> None:
    """NCCL for a GPU, made this process's current device first and named to the group
    (see ``init_from_environment``); gloo for the CPU. ``None``: the backend's default timeout.
    The helpers below wait at most ``timeout`` too. Under torchrun each job gets keys of its
    own in the agent's store (``job_store``)."""
    bound_collectives(timeout)
    joined = job_store(timeout)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device, **joined)
    else:
        dist.init_process_group("gloo", timeout=timeout, **joined)


STORE_TIMEOUT = datetime.timedelta(minutes=5)  # reaching the agent's store, where no timeout is given


def job_store(timeout: datetime.timedelta | None) -> dict:
    """Where torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE), the keywords
    that join this job under keys of its own; otherwise none (the environment as torch reads it).

    The agent keeps one store for everything its workers run, so several jobs in a row in one
    torchrun (``--no-python bash -c 'lptrain-bench ...; lptrain-bench ...'``, or a script on
    lptrain-cluster) all meet in it. Each would find the last one's keys: a rank that starts a
    job before its peers reads their old addresses, and gloo fails to connect after a hundred
    seconds. Every rank counts the jobs it has joined in the store, and the n-th job's keys sit
    under ``lptrain/job-n``; the ranks run the same jobs in the same order, so they agree."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return {}
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
        timeout=timeout or STORE_TIMEOUT,
    )  # fmt: skip
    job = agent.add(f"lptrain/jobs-joined/rank-{rank}", 1)
    return {"store": dist.PrefixStore(f"lptrain/job-{job}", agent), "rank": rank, "world_size": world_size}


def local_rank() -> int:
    """This process's index among those torchrun started on this node."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """How many processes torchrun started on this node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _carrier(device: torch.device) -> torch.device:
    """Where a small tensor must live for the default backend (NCCL needs the GPU)."""
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def across(what: str, call: Callable[[], T]) -> T:
    """Run one of the trainer's own collectives; a failure becomes a ``CollectiveError`` whose
    one line names the operation and, when the heartbeats tell, the rank that stopped."""
    try:
        return call()
    except Exception as err:
        raise peer_failure(f"rank {dist.get_rank()}: {what} failed", err) from err


def sum_across(values: list[float], device: torch.device, what: str = "the sum across processes") -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_carrier(device))
    across(what, lambda: bounded.all_reduce(t, None, _bound()))
    return t.tolist()


def any_across(flag: bool, device: torch.device, what: str = "the flag shared across processes") -> bool:
    """True on every rank when it is true on any (so that all stop at the same step)."""
    t = torch.tensor([1.0 if flag else 0.0], device=_carrier(device))
    across(what, lambda: bounded.all_reduce(t, None, _bound(), op=dist.ReduceOp.MAX))
    return bool(t.item())


def max_across(values: list[float], device: torch.device, what: str = "the maximum across processes") -> list[float]:
    """Every rank's ``values`` reduced element by element to their largest, on every rank."""
    t = torch.tensor(values, dtype=torch.float64, device=_carrier(device))
    across(what, lambda: bounded.all_reduce(t, None, _bound(), op=dist.ReduceOp.MAX))
    return t.tolist()


def barrier_across(what: str = "the barrier across processes") -> None:
    across(what, lambda: bounded.barrier(None, _bound()))


def same_everywhere(tensor: torch.Tensor) -> bool:
    """Whether every rank holds these exact bytes."""
    digest = hashlib.sha1(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    carrier = _carrier(tensor.device)
    everyone = across(
        "the comparison of the replicas' weights", lambda: bounded.all_gather_text(digest, None, _bound(), carrier)
    )
    return all(d == digest for d in everyone)


def finish() -> None:
    """Leave the process group together (a barrier first, so that no rank tears its side
    down while another still sends). lptrain's communicators hold the group weakly and
    torch.distributed.nn was imported before it (``lptrain.comm.group_teardown``), so the group and
    gloo's threads end here and not at interpreter exit, where gloo aborts some of the time
    ("terminate called without an active exception")."""
    if dist.is_initialized():
        barrier_across("the barrier before leaving the process group")
        liveness.stop()  # no heartbeat thread outlives the group
        dist.destroy_process_group()
