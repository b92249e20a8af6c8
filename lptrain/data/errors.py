"""How a data problem reaches the user: one line, from the training process.

An image is only decoded when a batch needs it (checking every file of an ImageNet-sized
folder up front would take longer than an epoch's first minutes), and that may happen in a
DataLoader worker process. An exception raised there comes back to the training process
wrapped in the worker's traceback; so the worker does not raise: it hands back a
``DecodeFailure`` in place of the batch, and the training process raises ``DataError`` with
the failure's one-line message.
"""

from __future__ import annotations

from dataclasses import dataclass


class DataError(ValueError):
    """The data set cannot be loaded as configured (missing path, bad option, bad file)."""


@dataclass(frozen=True)
class DecodeFailure:
    """Returned in place of a sample (and then of its batch) that could not be decoded."""

    message: str
