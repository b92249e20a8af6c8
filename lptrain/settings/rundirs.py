"""Run folders: claimed atomically, and only what lptrain created is ever removed.

Hydra names a run's folder ``outputs/DATE/TIME`` (a sweep's ``multirun/DATE/TIME``) and
makes it with ``exist_ok``: two runs started in the same second shared one folder, each
writing every step into the same ``steps.jsonl``. So, when the command line names no
folder, lptrain claims the default one itself before Hydra starts, with ``mkdir`` (which
fails if the folder exists, atomically), trying ``TIME_1``, ``TIME_2``... until one is
its own, and hands it to Hydra as ``hydra.run.dir`` (``hydra.sweep.dir``).

A folder the user named may already exist (``mkdir D; lptrain hydra.run.dir=D``): it is
recorded as the user's, and a run that never starts leaves it as it was, where it once
was removed because it was empty. Under torchrun only rank 0 writes: with the default name
the other ranks get a private temporary folder, removed at their end (a folder the user
named is the same for all, and every rank checks it).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

KEYS = {"run": "hydra.run.dir", "sweep": "hydra.sweep.dir"}
DEFAULT_ROOTS = {"run": "outputs", "sweep": "multirun"}


def _given(args: Sequence[str], key: str) -> str | None:
    for arg in args:
        name, sep, value = arg.lstrip("+~").partition("=")
        if sep and name == key:
            return value
    return None


def make_folder(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; return those made, outermost first. An
    ``OSError`` names the folder that could not be made (a read-only mount, a full disk),
    and one that exists but cannot be written to is refused the same way: Hydra would
    otherwise fail in its own mkdir or its first write, with a traceback."""
    made: list[Path] = []
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir()
            made.append(p)
        except FileExistsError:
            pass
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(p)) from None
    if not made and not os.access(folder, os.W_OK):
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        code = errno.EROFS if read_only else errno.EACCES
        raise OSError(code, os.strerror(code), str(folder))
    return made


def claim_new(parent: Path, name: str) -> tuple[Path, list[Path]]:
    """``parent/name`` made by this process (or ``name_1``, ``name_2``... when taken), and
    every folder made on the way (the parents it created first)."""
    made = make_folder(parent)
    for n in range(10_000):
        candidate = parent / (name if n == 0 else f"{name}_{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate, [*made, candidate]
    raise FileExistsError(f"no free run folder named {name}_N under {parent}")  # pragma: no cover


@dataclass
class RunDirs:
    """What lptrain made (it may remove those when a run leaves them empty) and what it found."""

    overrides: list[str] = field(default_factory=list)  # handed to Hydra after the user's
    made: list[Path] = field(default_factory=list)
    found: set[Path] = field(default_factory=set)  # folders that existed before lptrain started
    watched: set[Path] = field(default_factory=set)  # parents whose children were recorded in ``found``

    def ours(self, folder: Path) -> bool:
        """Whether lptrain (or Hydra for it) made ``folder`` in this run."""
        folder = folder.resolve()
        if folder in {p.resolve() for p in self.made}:
            return True
        if folder in self.found:
            return False
        return folder in self.watched or folder.parent in self.watched

    def remove_if_empty(self, folder: Path) -> None:
        """Remove ``folder`` when lptrain made it and it holds nothing, with the empty parents
        lptrain made for it; never raises (a read-only mount must not hide the real error)."""
        if not self.ours(folder):
            return
        made = {p.resolve() for p in self.made}
        current = folder.resolve()
        while True:
            try:
                if not current.is_dir() or any(current.iterdir()):
                    return
                current.rmdir()
            except OSError:
                return
            current = current.parent
            if current not in made:
                return


def plan(args: Sequence[str], now: datetime.datetime | None = None) -> RunDirs:
    """Run folders for the command line ``args`` (see the module docstring)."""
    dirs = RunDirs()
    multirun = any(a in ("-m", "--multirun") for a in args)
    kind = "sweep" if multirun else "run"
    key = KEYS[kind]
    given = _given(args, key)
    if given is None and os.environ.get("RANK", "0") != "0":  # a torchrun worker that is not rank 0 writes nothing
        private = Path(tempfile.mkdtemp(prefix=f"lptrain-rank{os.environ['RANK']}-"))
        dirs.made.append(private)
        dirs.overrides.append(f"{key}={private}")
        return dirs
    if given is None:
        now = now or datetime.datetime.now()
        parent = Path(DEFAULT_ROOTS[kind]) / now.strftime("%Y-%m-%d")
        claimed, made = claim_new(parent, now.strftime("%H-%M-%S"))
        dirs.made += made
        if multirun:  # the jobs' folders, which Hydra makes in it, are lptrain's too
            dirs.watched.add(claimed.resolve())
        dirs.overrides.append(f"{key}={claimed}")
        return dirs
    folder = Path(given).expanduser().resolve()
    found = folder.exists()
    if "${" not in given:  # an interpolation (${now:...}) is Hydra's to resolve, and to make
        dirs.made += make_folder(folder)  # here, where a failure is one line, not in Hydra's mkdir
    if multirun:  # the jobs' folders are children of the sweep's
        dirs.watched.add(folder)
        if folder.is_dir():
            dirs.found |= {p.resolve() for p in folder.iterdir()}
    else:
        dirs.watched.add(folder.parent)
    if found:
        dirs.found.add(folder)
    return dirs


class FolderTaken(Exception):
    """Another run holds the folder (its files, or a live lptrain writing there)."""


_held: dict[Path, int] = {}  # run folder -> its open, locked config.yaml (released at exit)


def release(run_dir: Path) -> None:
    """Give up the claim on ``run_dir`` (the run ended; in one process, another run may follow)."""
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)


def holds(run_dir: Path) -> bool:
    """Whether this process claimed ``run_dir`` (then what is in it is this run's)."""
    return run_dir.resolve() in _held


def hold(run_dir: Path, continuing: bool, text: str) -> None:
    """Claim ``run_dir`` for this run, atomically: a new run creates ``config.yaml`` (with
    ``text``) exclusively, so of two runs that both found the folder empty only one gets it;
    either kind then holds a lock on that file for as long as the process lives, so a second
    lptrain cannot continue a run that is still running. Raises ``FolderTaken``."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | (0 if continuing else os.O_EXCL), 0o644)
    except FileExistsError:
        raise FolderTaken(f"{run_dir} already holds a run (config.yaml)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise FolderTaken(f"{run_dir} is in use by another lptrain that is still running") from None
    if os.fstat(fd).st_size == 0:
        os.write(fd, text.encode())
    _held[run_dir.resolve()] = fd


def write_atomically(path: Path, text: str) -> None:
    """``path`` with ``text``, whole or not at all: written to a temporary file beside it and
    renamed over it, so a full disk leaves no empty or cut-short file (the temporary one is
    removed). Raises ``OSError`` naming ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from None
