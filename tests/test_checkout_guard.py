"""The suite's checkout guard (tests/checkout_guard.py) fails a run whose tests wrote into the
checkout, in one line naming what they wrote, and passes one whose tests kept to tmp_path.
A small repository of its own is tested, with the guard's hooks as the suite has them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]

WRITES_README = """
from pathlib import Path

def test_rewrites_the_readme():
    (Path(__file__).resolve().parents[1] / "README.md").write_text("rewritten\\n")

def test_leaves_a_run_folder():
    (Path(__file__).resolve().parents[1] / "outputs" / "run").mkdir(parents=True)
"""
KEEPS_TO_TMP = """
def test_writes_into_its_tmp_path(tmp_path):
    (tmp_path / "README.md").write_text("rewritten\\n")
"""


def run_suite(tmp_path: Path, test_text: str) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    shutil.copy(HERE / "checkout_guard.py", repo / "tests" / "checkout_guard.py")
    hooks = "from checkout_guard import pytest_sessionfinish, pytest_sessionstart\n"
    (repo / "tests" / "conftest.py").write_text(hooks)
    (repo / "tests" / "test_it.py").write_text(test_text)
    (repo / "README.md").write_text("# a project\n")
    (repo / ".gitignore").write_text("outputs/\n__pycache__/\n")
    subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "start"], cwd=repo, check=True)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(repo), "tests"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_that_writes_into_the_checkout_fails_in_one_line_naming_the_paths(tmp_path):
    run = run_suite(tmp_path, WRITES_README)
    said = [line for line in run.stdout.splitlines() if line.startswith("checkout_guard:")]
    assert run.returncode == 1, run.stdout
    assert len(said) == 1 and "README.md, outputs/" in said[0], run.stdout


def test_a_run_that_keeps_to_tmp_path_passes_quietly(tmp_path):
    run = run_suite(tmp_path, KEEPS_TO_TMP)
    assert run.returncode == 0, run.stdout
    assert "checkout_guard" not in run.stdout
