"""Gradient buckets, and their collectives started while backward still runs.

``gradient_buckets`` cuts the flat gradient buffer into buckets in the order backward
produces gradients: from the last parameter to the first, as DDP does, each bucket a run
of whole parameters of at least ``bucket_mb``. Both modes use the same buckets, so their
results are bitwise the same: every bucket's collective sees the same numbers.

``OverlappedReduction`` (``trainer.overlap=true``) counts, per bucket, the gradients that
every local replica has finished (post-accumulate-grad hooks, a countdown under a lock,
since GPU replicas run backward in threads of their own), and one communication thread
runs the buckets' collectives strictly in bucket order (every process of a torchrun job
then issues the same collectives in the same order) as soon as each is ready, while
backward continues. On CUDA the thread waits for an event recorded where the last
gradient of the bucket was queued and runs the collective on a communication stream of
each device. Parameters that got no gradient (unused branches) cannot hold a bucket back:
when backward has finished everywhere, the remaining buckets go as they are.

When the step fails instead (an exception in forward or backward, a second Ctrl-C),
``abort()`` tells the communication thread to issue no further collective and end: a
thread left waiting for a ``backward_done()`` that never comes kept the interpreter from
exiting. The thread is also a daemon, so that even a collective stuck on a dead peer
cannot hold the process past its exit.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import torch
from torch import nn

from lptrain.comm.streams import stream_for
from lptrain.train.timing import Span

Bucket = tuple[int, int]  # [start, stop) in the flat gradient buffer


# With trainer.bucket_mb unset: on GPUs DDP's bucket_cap_mb (25 MiB), so that the default
# overlap=true has buckets to start while backward runs; on CPUs one bucket (the replicas'
# backward and the collective compete for the same cores, and one message costs least).
GPU_BUCKET_MB = 25.0


def default_bucket_mb(bucket_mb: float | None, device_type: str) -> float | None:
    """``trainer.bucket_mb`` as given, or, where unset, 25 MiB on CUDA and None (one bucket) elsewhere."""
    if bucket_mb is None and device_type == "cuda":
        return GPU_BUCKET_MB
    return bucket_mb


class StepAborted(RuntimeError):
    """The step was abandoned (``abort()``) before all of its collectives ran."""


def gradient_buckets(sizes: Sequence[int], bucket_elems: int | None) -> list[Bucket]:
    """Buckets over a flat buffer holding parameters of ``sizes`` elements, in that order:
    from the last parameter to the first, each at least ``bucket_elems`` (None: one bucket)."""
    total = sum(sizes)
    if not bucket_elems:
        return [(0, total)]
    buckets, stop, filled = [], total, 0
    for size in reversed(sizes):
        filled += size
        if filled >= bucket_elems:
            buckets.append((stop - filled, stop))
            stop, filled = stop - filled, 0
    if filled:
        buckets.append((0, stop))
    return buckets


class OverlappedReduction:
    """Runs ``reduce_bucket(k)`` for every bucket ``k`` in order, each as soon as every
    replica has produced all of the bucket's gradients.

    Use per step: ``begin()`` before backward, ``backward_done()`` after the last
    replica's backward, ``wait()`` for every bucket's span: when its collective began and
    ended, marked on the clock of the caller's ``PhaseTimer`` (the host clock on the CPU;
    events on the communication streams, one per device, on GPUs), so that what ran and
    what the step waited for are read off one timeline (``lptrain.train.commtime``).
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        devices: Sequence[torch.device],
        buckets: Sequence[Bucket],
        reduce_bucket: Callable[[int], None],
    ) -> None:
        self.devices, self.buckets, self.reduce_bucket = list(devices), list(buckets), reduce_bucket
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._aborted = False
        self._cuda = devices[0].type == "cuda"
        # one per GPU for the process (trainers of one process do not step at the same time)
        self._streams = [stream_for(("overlap",), d) for d in dict.fromkeys(devices)] if self._cuda else []
        self._handles = []
        self._per_bucket = [0] * len(self.buckets)
        self._pending = [0] * len(self.buckets)  # armed by begin(); a backward outside a step counts nothing
        self._events: list[list | None] = [None] * len(self.buckets)
        for model in models:
            offset = 0
            for p in (p for p in model.parameters() if p.requires_grad):
                k = self._bucket_of(offset)
                self._per_bucket[k] += 1
                self._handles.append(p.register_post_accumulate_grad_hook(self._hook(k)))
                offset += p.numel()
        self._future: Future | None = None

    def _bucket_of(self, offset: int) -> int:
        for k, (a, b) in enumerate(self.buckets):
            if a <= offset < b:
                return k
        raise ValueError(f"offset {offset} is in no bucket")  # pragma: no cover - buckets cover the buffer

    def _hook(self, k: int) -> Callable[[torch.Tensor], None]:
        # A weak reference: a hook lives in the parameter's C++ side, where Python's
        # garbage collector cannot see it, so a strong one would keep this object, the
        # trainer behind ``reduce_bucket`` and every replica alive after the run (several
        # runs in one process, a Hydra sweep or the convergence study, ran out of memory).
        me = weakref.ref(self)

        def ready(_param: torch.Tensor) -> None:
            self = me()
            if self is None:
                return
            with self._cond:
                self._pending[k] -= 1
                if self._pending[k] == 0:
                    if self._cuda:  # the gradient kernels are queued, not done: mark where
                        self._events[k] = [torch.cuda.Event() for _ in self._streams]
                        for e, s in zip(self._events[k], self._streams):
                            e.record(torch.cuda.current_stream(s.device))
                    self._cond.notify_all()

        return ready

    def begin(self) -> None:
        """Arm the countdowns and start the communication thread (before any backward)."""
        self._pending = list(self._per_bucket)
        self._events = [None] * len(self.buckets)
        self._finished = self._aborted = False
        future: Future = Future()
        self._future = future
        # A thread per step (some 100 us beside steps of milliseconds): none outlives its step.
        self._thread = threading.Thread(target=self._serve, args=(future,), name="lptrain-comm", daemon=True)
        self._thread.start()

    def _serve(self, future: Future) -> None:
        try:
            future.set_result(self._run())
        except BaseException as err:  # handed to wait(), which raises it in the training thread
            future.set_exception(err)

    def abort(self, timeout_s: float | None = None) -> None:
        """The step failed: start no further collective, and let the thread end (waiting for
        it at most ``timeout_s``; a collective already running finishes or times out)."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def backward_done(self) -> None:
        """Every replica's backward has returned: buckets still waiting go as they are."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def wait(self) -> list[Span]:
        """Each bucket's (begin, end) marks, in bucket order, once every bucket is done."""
        assert self._future is not None, "begin() was not called"
        spans = self._future.result()
        for stream in self._streams:  # the update runs after the collectives on the device too
            torch.cuda.current_stream(stream.device).wait_stream(stream)
        return spans

    def _run(self) -> list[Span]:
        spans = []
        for k in range(len(self.buckets)):
            with self._cond:
                self._cond.wait_for(lambda k=k: self._pending[k] == 0 or self._finished or self._aborted)
                if self._aborted:
                    raise StepAborted(f"the step failed before bucket {k}'s collective")
                events = self._events[k]
            spans.append(self._collective(k, events))
        return spans

    def _collective(self, k: int, events) -> Span:
        if not self._cuda:
            began = time.perf_counter()
            self.reduce_bucket(k)
            return began, time.perf_counter()
        for stream, event in zip(self._streams, events or []):
            stream.wait_event(event)
        if events is None:  # backward ended without this bucket complete: wait for all queued work
            for stream in self._streams:
                stream.wait_stream(torch.cuda.current_stream(stream.device))
        starts = [torch.cuda.Event(enable_timing=True) for _ in self._streams]
        ends = [torch.cuda.Event(enable_timing=True) for _ in self._streams]
        for s, e in zip(self._streams, starts):
            e.record(s)
        with contextlib.ExitStack() as current:  # each stream current on its device: the collective's work goes there
            for stream in self._streams:
                current.enter_context(torch.cuda.stream(stream))
            self.reduce_bucket(k)
        for s, e in zip(self._streams, ends):
            e.record(s)
        for e in ends:
            e.synchronize()
        return starts, ends

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self.abort()
