"""The test run leaves the checkout as it found it: a test writes into its tmp_path, never into
README.md, docs/, configs/, scripts/ or an outputs/ folder of the repository.

``git status`` (ignored files included, caches excepted) is read when the session starts and
when it ends; a path that shows at the end and did not at the start fails the run, in one
line naming it. A whole-suite run on a fresh clone (``.ci/run``) is checked the same way
from outside; this check also catches it in a contributor's own run of one file. Outside a
git checkout (an installed copy, a tarball) there is nothing to compare and it stays quiet.

tests/conftest.py imports the two hooks, so every run of the suite has them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHES = ("__pycache__/", ".pytest_cache/", ".ruff_cache/", ".venv/", ".egg-info/")
_KEY = pytest.StashKey[set[str] | None]()


def checkout_state(root: Path = ROOT) -> set[str] | None:
    """``git status`` lines of ``root`` (untracked and ignored paths too, caches left out),
    or None when ``root`` is not the top of a git checkout."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True, timeout=30
        )
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain=v1", "--ignored=matching", "--untracked-files=normal"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {line for line in status.stdout.splitlines() if not any(c in line for c in CACHES)}


def changed_paths(before: set[str], after: set[str]) -> list[str]:
    """The paths whose status line is new at the end of the run."""
    return sorted({line[3:] for line in after - before})


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[_KEY] = checkout_state()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.stash.get(_KEY, None)
    after = checkout_state() if before is not None else None
    if before is None or after is None:
        return
    changed = changed_paths(before, after)
    if not changed:
        return
    line = (
        f"checkout_guard: the test run changed the checkout: {', '.join(changed)} "
        "(a test must write into its tmp_path; or a file was edited while the tests ran)"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line, red=True)
    else:
        print(line)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
