"""Which samples each step trains on, and the seed of each sample's augmentation.

Everything here is a pure function of (seed, step): the batch of a step, this process's
share of it, and the random crop and flip of every image in it. Nothing depends on how
many DataLoader workers there are, which worker decodes which batch, or what ran before,
so a run resumed at step ``s`` sees exactly the batches the uninterrupted run saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch.utils.data import Sampler

from lptrain.data.errors import DataError

_MASK = 2**64 - 1


def epoch_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The order of the samples in ``epoch``: a fresh permutation seeded by (seed, epoch)."""
    return torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def steps_per_epoch(num_samples: int, global_batch: int) -> int:
    per_epoch = num_samples // global_batch
    if per_epoch == 0:
        raise DataError(f"the global batch ({global_batch}) is larger than the training set ({num_samples} samples)")
    return per_epoch


def batch_indices(num_samples: int, global_batch: int, step: int, seed: int) -> torch.Tensor:
    """The sample indices of ``step``: epochs are fresh permutations seeded by (seed, epoch)."""
    epoch, position = divmod(step, steps_per_epoch(num_samples, global_batch))
    order = epoch_order(num_samples, seed, epoch)
    return order[position * global_batch : (position + 1) * global_batch]


def epochs_to_steps(epochs: float, num_samples: int, global_batch: int) -> int:
    return max(1, math.ceil(epochs * (num_samples // global_batch)))


def _mix(x: int) -> int:
    """SplitMix64's finaliser: nearby inputs give unrelated 64-bit outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def sample_seed(seed: int, step: int, position: int) -> int:
    """The augmentation seed of the sample at ``position`` of the global batch of ``step``.

    Keyed by the position in the global batch, not the sample index, so that an image seen
    again in a later epoch is cropped differently, and by the global position, so that the
    crops do not depend on how the batch is split across processes.
    """
    return _mix(_mix(_mix(seed & _MASK) ^ step) ^ position)


class SampleKey(NamedTuple):
    """What a worker needs to produce one sample: which one, and its augmentation seed."""

    index: int
    seed: int


class StepBatchSampler(Sampler[list[SampleKey]]):
    """This process's share of the batches of steps ``start..stop-1``, in order.

    A DataLoader's ``batch_sampler``: each item is the list of ``SampleKey`` of one step,
    the slice ``[rank * local_batch, (rank + 1) * local_batch)`` of ``batch_indices``.
    Starting at ``start`` rather than 0 is how a resumed run picks up where it stopped.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        seed: int,
        start: int,
        stop: int,
        rank: int = 0,
        local_batch: int | None = None,
    ) -> None:
        self.num_samples, self.global_batch, self.seed = num_samples, global_batch, seed
        self.start, self.stop = start, max(start, stop)
        self.local_batch = global_batch if local_batch is None else local_batch
        self.offset = rank * self.local_batch  # this process's first position in the global batch
        self.per_epoch = steps_per_epoch(num_samples, global_batch)
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.int64)

    def __len__(self) -> int:
        return self.stop - self.start

    def indices(self, step: int) -> torch.Tensor:
        """This process's sample indices of ``step`` (one permutation per epoch, cached)."""
        epoch, position = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, epoch_order(self.num_samples, self.seed, epoch)
        first = position * self.global_batch + self.offset
        return self._order[first : first + self.local_batch]

    def keys(self, step: int) -> list[SampleKey]:
        return [
            SampleKey(i, sample_seed(self.seed, step, self.offset + k))
            for k, i in enumerate(self.indices(step).tolist())
        ]

    def __iter__(self) -> Iterator[list[SampleKey]]:
        for step in range(self.start, self.stop):
            yield self.keys(step)
