"""CUDA streams for the links of the in-process executor: one per (link, end) in the process.

``torch.cuda.Stream()`` creates no stream: it hands out the next of a pool of 32 per GPU
(and priority), round robin. A process that asks for more than 32 on one GPU is given
streams already in use, and two links on one stream run one after the other instead of at
the same time. Asked for per communicator, the bench (a communicator per algorithm and
reduction kernel) and a trainer (its communicator, the overlap's streams) ran past 32.

So a link's stream is kept here, once per process and (sender rank, receiver rank, GPU).
Communicators of one process do not run collectives at the same time (the bench runs them
one after another; a trainer calls its one communicator from one thread at a time), so
the same link of two communicators can share its stream: sharing only orders their work,
every dependency is still an event or a stream wait. Where the streams lptrain takes on a
GPU still outnumber the pool, one warning says so. The other streams lptrain uses (the
overlap's communication stream, the reduction paths' measurement) are kept the same way.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter

import torch

POOL = 32  # PyTorch's streams per GPU and priority (kStreamsPerPool)

_lock = threading.Lock()
_streams: dict[tuple, torch.cuda.Stream] = {}
_taken: Counter[int] = Counter()  # pool streams lptrain took, per GPU index
_warned: set[int] = set()


def _new_stream(device: torch.device) -> torch.cuda.Stream:
    """A stream from PyTorch's pool on ``device``, counted (a warning once past the pool's size)."""
    stream = torch.cuda.Stream(device=device)
    with _lock:
        _taken[device.index] += 1
        over = _taken[device.index] > POOL and device.index not in _warned
        if over:
            _warned.add(device.index)
    if over:
        warnings.warn(
            f"lptrain has taken more than {POOL} CUDA streams on cuda:{device.index}, PyTorch's pool per GPU: "
            "some links now share a stream and run one after the other",
            RuntimeWarning,
            stacklevel=3,
        )
    return stream


def stream_for(key: tuple, device: torch.device) -> torch.cuda.Stream:
    """The process's one stream on ``device`` for ``key``, made on first use."""
    full = (*key, device.index)
    with _lock:
        stream = _streams.get(full)
    if stream is None:
        made = _new_stream(device)
        with _lock:
            stream = _streams.setdefault(full, made)
    return stream


def link_stream(src: int, dst: int, device: torch.device, role: str = "") -> torch.cuda.Stream:
    """The stream of link ``src -> dst``'s end on ``device``, the same for every communicator
    (``role="landing"``: the receiver's second stream, which the staged add copies into)."""
    return stream_for(("link", src, dst, role), device)


def taken(device_index: int) -> int:
    """How many pool streams lptrain has taken on that GPU."""
    with _lock:
        return _taken[device_index]
