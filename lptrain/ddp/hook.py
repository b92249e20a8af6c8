"""A DDP communication hook that averages each gradient bucket with lptrain's schedules.

    model = DistributedDataParallel(net)
    model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)

DDP calls ``hook(state, bucket)`` from inside backward as each bucket of gradients is
ready and wants, at once, a ``torch.futures.Future`` that completes with one tensor of the
bucket's shape: the average over the processes. The hook hands the bucket to the state's
one worker thread (``OrderedWorker``: every rank runs its buckets in the order DDP asked,
while backward continues) and returns the future; the thread runs lptrain's
``DistributedCommunicator`` (the algorithm's schedule over the default group's gloo or NCCL
point-to-point messages, its timeouts, named errors and desync check) and sets the result
once. Averaging is DDP's own: the bucket is divided by the number of processes, then
summed. With ``grad_dtype`` bf16 or fp16 the bucket travels in that dtype (summed in
float32 by the communicator) and is cast back, as ``comm.grad_dtype`` does in the trainer.
On GPUs the future is a CUDA future: the thread waits for backward's stream to have
produced the bucket, runs on a side stream, and the future carries that stream's event.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lptrain.comm.algorithms import SCHEDULES
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
        self.comm = build_communicator(
            algo, process_group=group, timeout_s=timeout_s, check_desync=check_desync, **options
        )
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


def state(algo: str = "lp", **options: Any) -> LPHookState:
    """The state to register with ``hook``: ``algo`` (lp, mst, be, ring; nccl: the backend's
    own allreduce; auto: chosen per bucket size, with ``topology`` a model, declared racks
    such as ``racks:2@1/2`` or ``probe``, as ``comm=auto``), ``process_group`` (default: the
    default group), ``grad_dtype`` (fp32, bf16, fp16), ``timeout_s``, ``check_desync``, and
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

    def average() -> None:
        try:
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

    submitted = state.worker.submit(average)
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
