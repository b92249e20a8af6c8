"""One thread that runs a process's collectives in the order they were asked for.

DDP asks for a bucket's reduction from inside backward (the autograd thread) and wants a
future back at once; running the schedule right there would stop backward until it is
done. So the hook and the backend hand each collective to this thread and return. One
thread, first in first out: every process runs its collectives in the order its own
program issued them, which is what lets the peers' messages meet (the same rule as the
trainer's overlap thread). Nothing here waits inside a future's callback: the thread
completes each future by setting its result, and callbacks run on it only to forward one.

After a failure every later job fails at once with the first error instead of waiting
out its own timeout on peers that have already stopped.

A job the caller would wait for anyway (DDP's last bucket: backward is over once it is
ready) can run on the caller's own thread instead (``run_here``), once the jobs before it
are done: the same order, one hand-off to the thread and back fewer.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class OrderedWorker:
    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._failed: BaseException | None = None
        self._lock = threading.Lock()
        self._last: Future | None = None  # the job submitted last
        self.handoffs = 0  # jobs handed to the thread

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def submit(self, job: Callable[[], Any]) -> Future:
        """Run ``job`` on the thread after every job submitted before it; its result or error in the future."""
        self.handoffs += 1
        self._last = self._pool.submit(self._guarded, job)
        return self._last

    def run_here(self, job: Callable[[], Any]) -> Future:
        """Run ``job`` on the calling thread once every job submitted before it is done; its
        result or error in a future that is already complete."""
        if self._last is not None:
            concurrent.futures.wait([self._last])  # its error, if any, is in self._failed
        done: Future = Future()
        try:
            done.set_result(self._guarded(job))
        except BaseException as err:  # noqa: BLE001 - handed to the future, as the thread's jobs are
            done.set_exception(err)
        return done

    def _guarded(self, job: Callable[[], Any]) -> Any:
        if self._failed is not None:
            raise self._failed
        try:
            return job()
        except BaseException as err:
            with self._lock:
                self._failed = self._failed or err
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class SideStreams:
    """On CUDA, a job runs on its device's side stream, after an event recorded on the
    caller's stream when the job was asked for (the tensor's producers are queued there,
    not finished); a future completed inside records that stream's event for its waiters.
    On the CPU nothing changes."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    @staticmethod
    def mark(device: torch.device) -> torch.cuda.Event | None:
        """Where the caller's stream is now (None on the CPU)."""
        if device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    @contextlib.contextmanager
    def after(self, device: torch.device, ready: torch.cuda.Event | None) -> Iterator[None]:
        if device.type != "cuda":
            yield
            return
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        stream = self._streams[device]
        stream.wait_event(ready)
        with torch.cuda.stream(stream):
            yield
