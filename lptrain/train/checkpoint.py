"""Checkpoints: written atomically, read back safely (``weights_only=True``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

FORMAT = "lptrain-checkpoint-v1"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or not one of ours."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write to a temporary file in the same folder, then rename: a crash mid-write
    leaves the previous checkpoint intact, never a truncated one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
