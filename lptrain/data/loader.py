"""Batches for the trainer, in step order.

The image sets (``ImageSplit``) go through a ``torch.utils.data.DataLoader``: ``workers``
processes decode and transform samples in parallel and keep the next batches ready
(prefetch) while the current step runs; with CUDA replicas the batches land in pinned
memory so that the copies to the devices can be non-blocking. The in-memory sets (MNIST,
synthetic) are gathered by index in the training process: a tensor gather is faster than
handing a batch over from another process, so they get no workers.

Worker processes and interruption: the training process owns Ctrl-C and SIGTERM (it
finishes the step, checkpoints and stops). A terminal sends Ctrl-C to every process of the
foreground group, workers included, and a forked worker would run the trainer's handler
too (PyTorch does not ignore SIGINT in workers; it only swallows KeyboardInterrupt), so
workers ignore both signals and are ended by the training process (``Batches.close``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, default_collate

from lptrain.data.datasets import ImageSplit, InMemorySplit
from lptrain.data.errors import DataError, DecodeFailure
from lptrain.data.sampling import SampleKey, StepBatchSampler

Batch = tuple[torch.Tensor, torch.Tensor]
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
MAX_AUTO_WORKERS = 4


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def default_workers(cpus: int | None = None, processes: int | None = None) -> int:
    """``min(4, CPUs per training process - 2)``, 0 with two CPUs or fewer.

    Two CPUs are left to the training process itself (its intra-op threads, its
    collectives): on a 2-core machine one worker makes training slower than none
    (docs/BENCHMARKS.md, "The input pipeline"), since it takes a core from the forward
    and backward pass. Beyond four workers a data-parallel replica
    rarely gains, and each worker holds its own prefetched batches. Under torchrun the
    CPUs are shared by the node's processes (``LOCAL_WORLD_SIZE``).
    """
    cpus = available_cpus() if cpus is None else cpus
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if processes is None else processes
    per_process = cpus // max(1, processes)
    return min(MAX_AUTO_WORKERS, per_process - 2) if per_process > 2 else 0


def resolve_workers(value: object) -> int:
    """``data.workers`` as a number: null or ``auto`` is ``default_workers()``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return default_workers()
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise DataError(
        f"data.workers={value} is not valid; use 0 (decode in the training process), a positive number of "
        f"worker processes, or null/auto (min({MAX_AUTO_WORKERS}, CPUs - 2): {default_workers()} here)"
    )


class Batches:
    """An iterator of ``(images, labels)``; ``close()`` (or leaving a ``with``) ends its workers.

    A ``DecodeFailure`` coming back from a worker is raised here, in the training
    process, as a one-line ``DataError`` naming the file.
    """

    def __init__(self, batches: Iterator, workers=None) -> None:
        self._batches, self._workers = batches, workers

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Batch:
        batch = next(self._batches)
        if isinstance(batch, DecodeFailure):
            self.close()
            raise DataError(batch.message)
        return batch

    def close(self) -> None:
        """Stop the worker processes now (they would otherwise wait for garbage collection)."""
        it, self._workers = self._workers, None
        if it is None:
            return
        it._shutdown_workers()  # what the iterator's __del__ calls; not a public method
        for w in getattr(it, "_workers", ()):
            if w.is_alive():  # ignoring SIGTERM, a hung worker survives the shutdown's terminate()
                w.kill()

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def collate(samples: list) -> Batch | DecodeFailure:
    """Stack the samples, or pass on the first failure (raised in the training process)."""
    for s in samples:
        if isinstance(s, DecodeFailure):
            return s
    return default_collate(samples)


def _worker_init(worker_id: int) -> None:
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def _start(loader: DataLoader) -> Batches:
    """Start the workers with Ctrl-C and SIGTERM blocked, so that none can reach a worker
    before it ignores them (a forked worker starts with the trainer's handlers)."""
    if loader.num_workers == 0:
        return Batches(iter(loader))
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        it = iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return Batches(it, workers=it)


def _loader(split: ImageSplit, batch_sampler, workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(
        split,
        batch_sampler=batch_sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        worker_init_fn=_worker_init if workers else None,
        prefetch_factor=2 if workers else None,  # batches ready per worker: the next steps' data
    )


def train_batches(
    split: InMemorySplit | ImageSplit, sampler: StepBatchSampler, workers: int, pin_memory: bool
) -> Batches:
    """This process's batches of steps ``sampler.start..sampler.stop-1``, in order."""
    if split.in_memory:
        return Batches(split.batch(sampler.indices(s)) for s in range(sampler.start, sampler.stop))
    if len(sampler) == 0:
        return Batches(iter(()))
    return _start(_loader(split, sampler, workers, pin_memory))


def eval_batches(
    split: InMemorySplit | ImageSplit,
    batch_size: int,
    workers: int,
    pin_memory: bool,
    max_batches: int | None = None,
) -> Batches:
    """The evaluation split in order, ``batch_size`` at a time (at most ``max_batches``)."""
    starts = range(0, len(split), batch_size)[:max_batches]
    ranges = [range(a, min(a + batch_size, len(split))) for a in starts]
    if split.in_memory:
        return Batches(split.batch(torch.arange(r.start, r.stop)) for r in ranges)
    keys = [[SampleKey(i, 0) for i in r] for r in ranges]  # the evaluation transform draws nothing
    return _start(_loader(split, keys, min(workers, len(keys)), pin_memory))
