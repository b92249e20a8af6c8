"""A torch.distributed backend that runs lptrain's schedules: ``init_process_group("lptrain")``.

``import lptrain.ddp`` registers the names ``lptrain`` (the algorithm in the environment
variable ``LPTRAIN_ALGO``, default lp) and ``lptrain_lp``, ``lptrain_mst``, ``lptrain_be``,
``lptrain_ring``, for CPU and CUDA tensors. DDP, FSDP and every ``dist.all_reduce`` then
reach ``LPProcessGroup``, a Python subclass of ``torch.distributed.ProcessGroup`` (the
extension point PyTorch's own ``PythonProcessGroupExtensionTest`` uses).

It moves no bytes itself. It opens an inner group over the same processes (gloo for CPU
tensors, NCCL for CUDA ones; ``dist.new_group``, so every rank opens it at the same call:
a group made by ``new_group`` its gloo group at once, the default group at its first
operation on a device type; ``open_group`` says why and what it refuses) and builds
lptrain's ``DistributedCommunicator`` on it: allreduce, broadcast and reduce (sum or
average) run the algorithm's schedule over the inner group's point-to-point messages, with
its timeouts, named errors and desync check.
Every other operation (all_gather and its coalesced form, barrier, send, recv and a
receive from any rank, scatter, all_to_all, reductions other than sum and average, sparse
allreduce ...) goes to the inner group unchanged.

All of a process's operations go through one thread in the order the program issued them
(``OrderedWorker``), so DDP's bucket reductions overlap backward and the ranks still issue
the inner group's messages in the same order. Refused plainly, before anything is sent:
several tensors in one call (the old one-process-many-GPUs API), sparse tensors in a
broadcast or reduce, ``PREMUL_SUM``, and dtypes the schedules cannot sum.
"""

from __future__ import annotations

import datetime
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from lptrain.comm.algorithms import SCHEDULES
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.ranges import collective_range
from lptrain.communicators import build_communicator
from lptrain.ddp.worker import OrderedWorker, SideStreams

ALGORITHMS = SCHEDULES
BACKEND = "lptrain"  # the algorithm from LPTRAIN_ALGO
ALGO_ENV = "LPTRAIN_ALGO"
INNER = {"cpu": "gloo", "cuda": "nccl"}
SCHEDULE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg"}


def backend_names() -> list[str]:
    """The backend names ``register_backends`` adds."""
    return [BACKEND, *(f"{BACKEND}_{a}" for a in ALGORITHMS)]


def algorithm_from_env() -> str:
    algo = os.environ.get(ALGO_ENV, "lp")
    if algo not in ALGORITHMS:
        raise CollectiveInputError(
            f"{ALGO_ENV}={algo!r} is not an algorithm of the {BACKEND} backend; valid: {', '.join(ALGORITHMS)}"
        )
    return algo


def register_backends() -> None:
    """Make ``init_process_group`` know the lptrain backends (once per process)."""
    for name in backend_names():
        if name.upper() in dist.Backend._plugins:
            continue
        algo = None if name == BACKEND else name.removeprefix(f"{BACKEND}_")

        def create(options, backend_options=None, algo=algo) -> LPProcessGroup:
            return open_group(options, algo or algorithm_from_env())

        dist.Backend.register_backend(name, create, extended_api=True, devices=["cpu", "cuda"])


def open_group(options: Any, algo: str) -> LPProcessGroup:
    """A group of the lptrain backend, as ``init_process_group`` or ``new_group`` asks for one
    (``options``: torch's ``_DistributedBackendOptions``).

    A group made by ``new_group`` opens its inner gloo group at once, inside the same call on
    every rank: an operation that only some ranks call (a barrier left to time out) then
    finds it open, as a gloo group's own connections are. The default group cannot (no
    ``new_group`` before ``init_process_group`` returns) and opens it at its first
    operation. Refused in one line, where they cannot work: a group of some of the
    processes (its inner group would need every process to open it, and the others never
    come: a hang), and any group beside a default group bound to a device
    (``init_process_group(device_id=...)``: torch then asks the Python group for that
    device's backend, which it does not have)."""
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    if not dist.is_initialized():
        return LPProcessGroup(rank, size, algo, timeout)
    bound = getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None)
    if bound is not None:
        raise CollectiveInputError(
            f"new_group(backend='{BACKEND}_{algo}'): the default group is bound to {bound} "
            "(init_process_group(device_id=...)), which a Python group such as lptrain's cannot join; "
            "call init_process_group without device_id"
        )
    ranks, world = list(options.global_ranks_in_group), dist.get_world_size()
    if sorted(ranks) != list(range(world)):
        raise CollectiveInputError(
            f"new_group(ranks={ranks}, backend='{BACKEND}_{algo}'): the {BACKEND} backend's groups span "
            f"every process (all {world}); for a group of some of them use backend='gloo' or 'nccl'"
        )
    group = LPProcessGroup(rank, size, algo, timeout)
    group.open_inner(torch.device("cpu"))
    return group


class _Work(dist.Work):
    """One operation handed to the worker: ``wait`` blocks until it is done (on CUDA, the
    caller's stream then waits for it), ``get_future`` completes with the output tensors."""

    def __init__(self, done: Future, future: torch.futures.Future, device: torch.device | None) -> None:
        super().__init__()
        self._done, self._future, self._device = done, future, device
        # DDP's C++ side reads the future's value as tensors: an error must be the future's
        # error, not a value (Python's set_exception stores it as one); then() makes it so
        self._result = future.then(_value)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) and timeout else None
        self._done.result(seconds)  # re-raises the operation's error
        self._future.wait()  # on CUDA: orders the current stream after the operation's
        return True

    def is_completed(self) -> bool:
        return self._done.done()

    def get_future(self) -> torch.futures.Future:
        return self._result


class LPProcessGroup(dist.ProcessGroup):
    """allreduce, broadcast and reduce by lptrain's ``algo``; the rest by the inner group."""

    def __init__(self, rank: int, size: int, algo: str, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        if algo not in ALGORITHMS:
            raise CollectiveInputError(f"unknown {BACKEND} algorithm {algo!r}; valid: {', '.join(ALGORITHMS)}")
        self.algo = algo
        self._timeout = timeout
        self._inner: dict[str, weakref.ref] = {}
        self._comms: dict[str, Any] = {}
        self._worker = OrderedWorker(f"lptrain-{algo}")
        self._side = SideStreams()

    def getBackendName(self) -> str:  # noqa: N802 - the C++ name PyTorch calls
        return BACKEND

    def name(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"LPProcessGroup({self.algo!r}, rank {self.rank()} of {self.size()})"

    # -- the inner group and the communicator on it ----------------------------------------------
    def open_inner(self, device: torch.device) -> None:
        """Open the inner group for ``device`` now (every rank of the group at the same call)."""
        self.inner(device)

    def inner(self, device: torch.device) -> dist.ProcessGroup:
        """The gloo (CPU) or NCCL (CUDA) group the bytes travel on, opened at first use (or by
        ``open_inner``)."""
        kind = device.type
        if kind not in INNER:
            raise CollectiveInputError(f"the {BACKEND} backend moves CPU and CUDA tensors, not {kind}")
        if kind not in self._inner:
            # held weakly, as DistributedCommunicator holds its group: torch's registry keeps it
            # until destroy_process_group, which then frees it (gloo can abort when a group is
            # torn down at interpreter exit instead)
            self._inner[kind] = weakref.ref(dist.new_group(backend=INNER[kind], timeout=self._timeout))
        group = self._inner[kind]()
        if group is None:
            raise CollectiveInputError(f"{self!r}: its inner {INNER[kind]} group was destroyed (destroy_process_group)")
        return group

    def _communicator(self, device: torch.device):
        if device.type not in self._comms:
            self._comms[device.type] = build_communicator(
                self.algo, process_group=self.inner(device), timeout_s=self._timeout.total_seconds()
            )
        return self._comms[device.type]

    # -- the scheduled operations -------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        how = self._how(op, "all_reduce")
        if how is None or any(t.is_sparse for t in tensors):  # gloo sums sparse tensors itself
            return self._pass("allreduce", tensors, opts)
        tensor = self._one(tensors, "all_reduce")
        return self._scheduled("allreduce", tensor, lambda comm: comm.allreduce(tensor, op=how))

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        how = self._how(opts.reduceOp, "reduce")
        if how is None:
            return self._pass("reduce", tensors, opts)
        tensor, root = self._one(tensors, "reduce"), self._root(opts)
        return self._scheduled("reduce", tensor, lambda comm: comm.reduce(tensor, root=root, op=how))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        tensor, root = self._one(tensors, "broadcast"), self._root(opts)
        return self._scheduled("broadcast", tensor, lambda comm: comm.broadcast(tensor, root=root))

    # -- the operations passed through (the names PyTorch's C++ side calls) ------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._pass("allgather", output_tensors, input_tensors, opts)

    # torch.distributed calls these by their Python names on the group object, and PyTorch's
    # C++ side has no Python override for them: without a method here the call reaches C++
    # ProcessGroup, which has no backend of its own on a Python group ("No backend type
    # associated with device type cpu")
    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self._pass("allgather_coalesced", output_lists, input_tensors, opts)

    def gather_single(self, output, input, opts=None):
        return self._pass("gather_single", output, input, opts)

    def recv_anysource(self, tensors, tag: int):
        return self._pass("recv_anysource", tensors, tag)

    def all_gather_single(self, output, input, opts=None):
        return self._pass("all_gather_single", output, input, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._pass("all_gather_single_coalesced", outputs, inputs, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._pass("allreduce_coalesced", tensors, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._pass("alltoall", output_tensors, input_tensors, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._pass("alltoall_base", output, input, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts=None):
        return self._pass("barrier", opts, device=torch.device("cpu"))

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._pass("gather", output_tensors, input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._pass("scatter", output_tensors, input_tensors, opts)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._pass("reduce_scatter", output_tensors, input_tensors, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._pass("reduce_scatter_single", output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._pass("reduce_scatter_single_coalesced", outputs, inputs, opts)

    def send(self, tensors, dst: int, tag: int):
        return self._pass("send", tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int):
        return self._pass("recv", tensors, src, tag)

    # -- machinery ------------------------------------------------------------------------------------------
    @staticmethod
    def _how(op: Any, what: str) -> str | None:
        """Sum or average for the schedules for the schedules, None for a reduction passed through (max, min ...)."""
        for known, how in SCHEDULE_OPS.items():
            if op == known:
                return how
        if op == dist.ReduceOp.PREMUL_SUM:
            raise CollectiveInputError(f"the {BACKEND} backend does not implement {what} with PREMUL_SUM")
        return None

    @staticmethod
    def _one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise CollectiveInputError(
                f"the {BACKEND} backend's {what} takes one tensor per process, got {len(tensors)} "
                "(one process per device)"
            )
        tensor = tensors[0]
        if tensor.is_sparse:
            raise CollectiveInputError(f"the {BACKEND} backend does not implement {what} of sparse tensors")
        return tensor

    def _root(self, opts: Any) -> int:
        if opts.rootTensor != 0:
            raise CollectiveInputError(f"the {BACKEND} backend takes one tensor per process (rootTensor 0)")
        return int(opts.rootRank)

    def _future_for(self, device: torch.device | None) -> torch.futures.Future:
        cuda = device is not None and device.type == "cuda"
        return torch.futures.Future(devices=[device] if cuda else None)

    def _scheduled(self, op: str, tensor: torch.Tensor, run: Callable[[Any], None]) -> dist.Work:
        device = tensor.device
        comm = self._communicator(device)  # opened in the caller's order, on every rank alike
        future = self._future_for(device)
        ready = self._side.mark(device)
        nbytes = tensor.numel() * tensor.element_size()

        def job() -> None:
            try:
                with self._side.after(device, ready), collective_range(op, self.algo, nbytes):
                    run(comm)
                    future.set_result([tensor])
            except BaseException as err:
                future.set_exception(err)
                raise

        return _Work(_failing_into(self._worker.submit(job), future), future, device)

    def _pass(self, name: str, *args: Any, device: torch.device | None = None) -> dist.Work:
        """Issue ``inner.name(*args)`` on the worker (after everything asked for before it)
        without waiting for it there: a receive may need the peer's next operation."""
        device = device or _device_of(args)
        inner = self.inner(device)  # opened in the caller's order
        while args and args[-1] is None:  # options the caller left out: the inner group's defaults
            args = args[:-1]
        future = self._future_for(device)
        issued: Future = Future()

        def job() -> None:
            work = getattr(inner, name)(*args)

            def forward(done: torch.futures.Future) -> None:
                try:
                    future.set_result(done.value())
                except BaseException as err:
                    future.set_exception(err)

            try:
                inner_future = work.get_future()
            except RuntimeError:  # gloo's send and recv have none: completed by wait() instead
                inner_future = None
            if inner_future is not None:
                inner_future.add_done_callback(forward)
            issued.set_result(work)

        return _PassWork(_failing_into(self._worker.submit(job), future), issued, future, device)


class _PassWork(_Work):
    """A passed-through operation: ``wait`` waits for the worker to issue it, then for the inner work."""

    def __init__(self, submitted: Future, issued: Future, future: torch.futures.Future, device) -> None:
        super().__init__(submitted, future, device)
        self._issued = issued

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) and timeout else None
        self._done.result(seconds)
        work = self._issued.result()
        finished = work.wait(timeout) if timeout else work.wait()
        if not self._future.done():
            self._future.set_result([])
        return finished

    def is_completed(self) -> bool:
        return self._issued.done() and self._issued.result().is_completed()

    def _source_rank(self) -> int:
        """The sender a receive from any rank got its message from (the inner work knows)."""
        return self._issued.result()._source_rank()


def _value(done: torch.futures.Future) -> Any:
    return done.value()  # completed already: nothing waits here


def _failing_into(submitted: Future, future: torch.futures.Future) -> Future:
    """A job that never ran (an earlier one failed) or failed before completing ``future``
    fails it too, so nothing waiting on it is left waiting."""

    def check(job: Future) -> None:
        err = job.exception()
        if err is not None and not future.done():
            future.set_exception(err)

    submitted.add_done_callback(check)
    return submitted


def _device_of(args: tuple) -> torch.device:
    """The device of the first tensor in ``args`` (nested lists included); CPU when there is none."""
    stack = list(args)
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            return item.device
        if isinstance(item, (list, tuple)):
            stack[:0] = list(item)
    return torch.device("cpu")
