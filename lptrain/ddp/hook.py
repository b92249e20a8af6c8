"""A DDP communication hook that averages each gradient bucket with lptrain's schedules.

    model = DistributedDataParallel(net)
    model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)

DDP calls ``hook(state, bucket)`` from inside backward as each bucket of gradients is
ready and wants, at once, a ``torch.futures.Future`` that completes with one tensor of the
bucket's shape: the average over the processes. The hook hands the bucket to the state's
one worker thread (``OrderedWorker``: every rank runs its buckets in the order DDP asked,
while backward continues) and returns the future; the thread runs lptrain's
``DistributedCommunicator`` (the algorithm's schedule over the default group's gloo or NCCL
point-to-point messages, its timeouts and named errors) and sets the result once. The last
bucket of a step is ready when backward is over, so nothing is left to overlap: it runs on
the calling thread once the buckets before it are done, a hand-off fewer per step.

The desync check (one small allreduce of a fingerprint) runs once per training step, with
the step's first bucket, not once per bucket: its fingerprint holds the step's number, the
first bucket's size and dtype, and the sizes of every bucket of the step before, so ranks
that disagree on the model or its bucketing stop with a ``DesyncError`` at the next step.

Averaging is DDP's own: the bucket is divided by the number of processes, then
summed. With ``grad_dtype`` bf16 or fp16 the bucket travels in that dtype (summed in
float32 by the communicator) and is cast back, as ``comm.grad_dtype`` does in the trainer.
On GPUs the future is a CUDA future: the thread waits for backward's stream to have
produced the bucket, runs on a side stream, and the future carries that stream's event.
"""

import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lptrain.comm.algorithms import SCHEDULES
from lptrain.comm.distributed import check_agreement
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.ranges import collective_range
from lptrain.communicators import build_communicator
from lptrain.ddp.worker import OrderedWorker, SideStreams

GRAD_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HOOK_ALGORITHMS = (*SCHEDULES, "nccl", "auto")


class LPHookState:
    """What ``hook`` needs: the communicator, the dtype gradients travel in, the worker.

    One state per DDP model: the state remembers the parameters its buckets hold, and a
    second model's buckets (the same state registered twice) are refused.
    """

    def __init__(
        self,
        algo: str = "lp",
        *,
        process_group: dist.ProcessGroup | None = None,
        grad_dtype: str = "fp32",
        timeout_s: float = 300.0,
        check_desync: bool = True,
        **options: Any,
    ) -> None:
        if algo not in HOOK_ALGORITHMS:
            raise CollectiveInputError(f"unknown lptrain.ddp algorithm {algo!r}; valid: {', '.join(HOOK_ALGORITHMS)}")
        if grad_dtype not in GRAD_DTYPES:
            raise CollectiveInputError(
                f"unknown grad_dtype {grad_dtype!r} for lptrain.ddp; valid: {', '.join(GRAD_DTYPES)}"
            )
        group = process_group if process_group is not None else dist.group.WORLD
        # the communicator checks nothing itself: the hook checks once per step (module docstring)
        self.comm = build_communicator(algo, process_group=group, timeout_s=timeout_s, check_desync=False, **options)
        self.check_desync = bool(check_desync)
        self.timeout = datetime.timedelta(seconds=timeout_s)  # every wait of the hook's, its desync check's too
        self.group = group
        self.desync_checks = 0  # small allreduces of step fingerprints so far
        self.steps = 0  # training steps whose first bucket was issued
        self._sizes: list[int] = []  # the bytes of this step's buckets so far
        self._last_sizes: tuple[int, ...] = ()  # those of the step before
        self.algo, self.grad_dtype = algo, GRAD_DTYPES[grad_dtype]
        self.world_size = self.comm.world_size
        self.worker = OrderedWorker(f"lptrain-ddp-{algo}")
        self._params: set[int] | None = None  # the model's parameters, known after its first backward
        self._seen: set[int] = set()
        self.side = SideStreams()

    def __repr__(self) -> str:
        return f"LPHookState({self.algo!r}, {self.world_size} processes, grad_dtype {self.grad_dtype})"

    def check_model(self, bucket: dist.GradBucket) -> None:
        """Refuse a bucket of another model than the first backward's (a state registered twice)."""
        ids = {p.data_ptr() for p in bucket.parameters()}
        if self._params is None:
            self._seen |= ids
            if bucket.is_last():
                self._params = self._seen
            return
        if not ids <= self._params:
            raise CollectiveInputError(
                "this lptrain.ddp state is registered on a second DDP model; make one state per model "
                "(lptrain.ddp.state(...) for each register_comm_hook)"
            )

    def agree(self, check: dict[str, Any]) -> None:
        """The step's desync check across the group, whatever communicator runs the buckets."""
        if self.world_size > 1:
            self.desync_checks += 1
            rank = dist.get_rank(self.group)
            check_agreement(self.group, check, rank, self.world_size, self.algo, self.timeout)

    def fingerprint(self, bucket: dist.GradBucket, nbytes: int) -> dict[str, Any] | None:
        """The step's fingerprint at its first bucket (None at the others); records the bucket's size."""
        first = bucket.index() == 0
        if first:
            self._sizes = []
            self.steps += 1
        self._sizes.append(nbytes)
        if bucket.is_last():
            self._last_sizes = tuple(self._sizes)
        if not (first and self.check_desync):
            return None
        return {
            "op": "the allreduces of DDP step",
            "seq": self.steps - 1,
            "algorithm": self.algo,
            "first bucket": (nbytes, str(self.grad_dtype)),
            "buckets of the step before": self._last_sizes,
        }


def state(algo: str = "lp", **options: Any) -> LPHookState:
    """The state to register with ``hook``: ``algo`` (lp, mst, be, ring; nccl: the backend's
    own allreduce; auto: chosen per bucket size, with ``topology`` a model, declared racks
    such as ``racks:2@1/2`` or ``probe``, as ``comm=auto``), ``process_group`` (default: the
    default group), ``grad_dtype`` (fp32, bf16, fp16), ``timeout_s`` (the most any of its
    waits lasts, the desync check's included, whatever the group's own timeout), ``check_desync``, and
    the algorithm's own options as in ``build_communicator`` (``block_size``, ``segment_size``,
    ``window`` ...)."""
    return LPHookState(algo, **options)


def hook(state: LPHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook: the bucket averaged over the processes, in a future."""
    if not isinstance(state, LPHookState):
        raise CollectiveInputError(
            f"lptrain.ddp.hook takes the state lptrain.ddp.state(...) returns, got {type(state).__name__}"
        )
    state.check_model(bucket)
    buffer = bucket.buffer()
    cuda = buffer.device.type == "cuda"
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[buffer.device] if cuda else None)
    ready = state.side.mark(buffer.device)  # backward has queued the bucket's gradients, not finished them
    index, nbytes = bucket.index(), buffer.numel() * state.grad_dtype.itemsize
    check = state.fingerprint(bucket, nbytes)

    def average() -> None:
        try:
            if check is not None:
                state.agree(check)
            with state.side.after(buffer.device, ready), collective_range("allreduce", state.algo, nbytes, index):
                sent = buffer if buffer.dtype == state.grad_dtype else buffer.to(state.grad_dtype)
                sent.div_(state.world_size)  # as DDP's allreduce_hook: divide, then sum
                state.comm.allreduce(sent)
                if sent is not buffer:
                    buffer.copy_(sent)
                future.set_result(buffer)  # on CUDA: records the side stream's event
        except BaseException as err:
            future.set_exception(err)
            raise

    # the last bucket: backward is over, nothing to overlap; run it here once the others are done
    submitted = state.worker.run_here(average) if bucket.is_last() else state.worker.submit(average)
    submitted.add_done_callback(_fail_into(future))
    # Python's set_exception stores the error as the future's value, which DDP's C++ side
    # would try to read as a tensor ("Unable to cast ... to Tensor"); a then() whose callback
    # reads the value turns it into the future's error, which DDP raises as it is.
    return future.then(_value)


def _value(done: torch.futures.Future) -> torch.Tensor:
    return done.value()  # completed already: nothing waits here


def _fail_into(future: torch.futures.Future) -> Callable:
    """A bucket whose job never ran (an earlier bucket failed) fails its future with that error."""

    def check(job) -> None:
        err = job.exception()
        if err is not None and not future.done():
            future.set_exception(err)

    return check
