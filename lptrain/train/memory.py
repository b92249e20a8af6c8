"""What this machine's memory can hold, and an allocation that failed, said in one line.

A batch or a message larger than all of the host's memory cannot be allocated, whatever
else runs: it is refused before anything is allocated (``check_fits``). One that only
fails when it is allocated (a GPU's memory, what other processes hold) comes back from
torch as a ``RuntimeError`` of several lines or a ``torch.OutOfMemoryError``;
``allocation_failure`` reads either into the one line the failure policy prints.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")  # a container's own ceiling (cgroup v2)
_TRIED = re.compile(r"tried to allocate (\d+(?:\.\d+)?)\s*(bytes|[KMGT]iB|B)?")
_UNITS = {None: 1, "bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def size_text(nbytes: float) -> str:
    """``2.2 TiB``, ``1.0 GiB``: a size as a reader takes it in."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def host_memory() -> int | None:
    """Bytes of memory this process can have at most: the machine's, or its container's
    limit when that is lower; None where neither can be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = None
    try:
        text = CGROUP_LIMIT.read_text().strip()
        limit = int(text) if text.isdigit() else None
    except OSError:
        limit = None
    known = [m for m in (total, limit) if m]
    return min(known) if known else None


class TooLarge(ValueError):
    """More than all of this machine's memory was asked for: a bad size, not a bad flag."""


def check_fits(nbytes: int, what: str, fix: str, memory: int | None = None) -> None:
    """Raise ``TooLarge`` (one line: ``what``, its size, the memory, ``fix``) when ``nbytes``
    is more than all of the host's memory (``memory``, default ``host_memory()``)."""
    memory = host_memory() if memory is None else memory
    if memory and nbytes > memory:
        limit = f"more than this machine's {size_text(memory)} of memory"
        raise TooLarge(f"{what} takes {size_text(nbytes)}, {limit}; {fix}")


def allocation_failure(err: BaseException) -> str | None:
    """One line for an allocation torch could not make (host or GPU), None for any other error."""
    text = " ".join(str(err).split())
    oom = type(err).__name__ == "OutOfMemoryError" or "can't allocate memory" in text or "out of memory" in text
    if not oom:
        return None
    where = "a GPU's memory" if "CUDA" in text or "HIP" in text else "memory"
    tried = _TRIED.search(text)
    size = f" {size_text(float(tried.group(1)) * _UNITS[tried.group(2)])}" if tried else ""
    return f"out of memory: could not allocate{size} of {where}"
