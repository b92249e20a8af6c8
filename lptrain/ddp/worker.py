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
"""

from __future__ import annotations

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

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def submit(self, job: Callable[[], Any]) -> Future:
        """Run ``job`` after every job submitted before it; its result or error in the future."""

        def run() -> Any:
            if self._failed is not None:
                raise self._failed
            try:
                return job()
            except BaseException as err:
                with self._lock:
                    self._failed = self._failed or err
                raise

        return self._pool.submit(run)

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
