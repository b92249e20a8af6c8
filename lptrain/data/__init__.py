"""Data sets and the input pipeline, built so that the batch of every step, augmentation
included, is a pure function of (seed, step): resuming replays exactly the same batches.

* ``datasets``: the data sets (MNIST embedded, CIFAR-10, image folders, synthetic).
* ``sampling``: which samples a step trains on, and each sample's augmentation seed.
* ``transforms``: per-sample crops and flips (CPU), and ``prepare`` (on the device).
* ``loader``: DataLoader workers, prefetch and pinned memory; one-line errors.
* ``errors``: ``DataError``.
"""

from lptrain.data.datasets import NAMES, DataSet, ImageSplit, load_data
from lptrain.data.errors import DataError
from lptrain.data.loader import Batches, eval_batches, resolve_workers, train_batches
from lptrain.data.sampling import StepBatchSampler, batch_indices, epochs_to_steps, sample_seed
from lptrain.data.transforms import prepare

__all__ = [
    "NAMES",
    "Batches",
    "DataError",
    "DataSet",
    "ImageSplit",
    "StepBatchSampler",
    "batch_indices",
    "epochs_to_steps",
    "eval_batches",
    "load_data",
    "prepare",
    "resolve_workers",
    "sample_seed",
    "train_batches",
]
