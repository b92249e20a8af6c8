"""Files the generators write: atomically, so that a reader (or a run interrupted half way)
sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename,
    keeping the old file's permissions (a new file gets the umask's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask  # mkstemp's is 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(data: Any) -> str:
    """The one JSON layout of the saved results: one-space indents and a final newline, so
    that a rerun's diff shows the figures that changed and nothing else."""
    return json.dumps(data, indent=1) + "\n"


def write_json(path: Path | str, data: Any) -> None:
    """``data`` saved at ``path`` as :func:`json_text` lays it out, atomically."""
    write_atomically(Path(path), json_text(data))


def read_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text())
