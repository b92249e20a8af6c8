"""Checkpoints: written atomically, read back safely (``weights_only=True``).

A checkpoint is written to a temporary file beside it and renamed over it, so a crash or
a full disk mid-write leaves the previous checkpoint intact. A write that fails removes
its temporary file and says, in one line, what it needed and how much space there was; a
temporary file left by a process killed mid-write is removed the next time a run writes
to, or continues in, that folder.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

FORMAT = "lptrain-checkpoint-v1"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or not one of ours."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, a read-only folder); the previous one is intact."""


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def state_bytes(state: Any) -> int:
    """About what ``state`` takes on disk: the bytes of its tensors."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def temporary_files(path: Path) -> list[Path]:
    """Temporary files of ``save_checkpoint(path, ...)`` (a killed save leaves one)."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp")) if path.parent.is_dir() else []


def remove_stale_temporaries(path: Path) -> None:
    """Remove what killed saves of ``path`` left (the caller holds the run folder, so no
    other process is writing there)."""
    for tmp in temporary_files(path):
        tmp.unlink(missing_ok=True)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file in the same folder, then rename: a crash mid-write
    leaves the previous checkpoint intact, never a truncated one. Raises
    ``CheckpointWriteError`` (one line) when the write fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as err:
        Path(tmp).unlink(missing_ok=True)
        raise CheckpointWriteError(_write_failure(path, state, err)) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_failure(path: Path, state: dict[str, Any], err: BaseException) -> str:
    needed = state_bytes(state)
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    code = getattr(err, "errno", None)
    if code is None and free is not None and free < needed:
        code = errno.ENOSPC  # torch reports a short write as "[enforce fail at inline_container.cc...]"
    reason = os.strerror(code) if code else " ".join(str(err).split())[:200]
    room = f"; {_mib(free)} free there" if free is not None else ""
    return f"could not write checkpoint {path}: {reason} (it needs about {_mib(needed)}{room})"


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or a run folder (its ``checkpoints/last.pt``)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "checkpoints" / "last.pt"
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist; pass a .pt file or a run folder holding checkpoints/")
    return p


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    p = resolve(path)
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as err:
        # Not torch's message: it advises weights_only=False, which would unpickle anything.
        raise CheckpointError(
            f"checkpoint {p} could not be read: it is corrupt, truncated or not a checkpoint ({type(err).__name__})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not an lptrain checkpoint (expected format {FORMAT!r})")
    return state
