"""The examples: a plain DDP script, and the same with lptrain's hook or on lptrain's backend,
each differing from the plain one by the import and one line, train to the same weights and
leave no thread of gloo's alive when the interpreter finalizes."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXIT_THREADS = Path(__file__).resolve().parent / "exit_threads"  # its sitecustomize lists them


def changed_lines(name: str) -> list[str]:
    plain = (EXAMPLES / "ddp_plain.py").read_text().splitlines()[1:]  # past the docstring's line
    other = (EXAMPLES / name).read_text().splitlines()[1:]
    diff = difflib.unified_diff(plain, other, lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")) and line.strip("+-")]


def test_each_example_changes_the_plain_script_by_an_import_and_one_line():
    assert changed_lines("ddp_hook.py") == [
        "+import lptrain.ddp",
        '+    model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)',
    ]
    assert changed_lines("ddp_backend.py") == [
        "+import lptrain.ddp  # noqa: F401 - registers the lptrain backends",
        '-    dist.init_process_group("gloo")',
        '+    dist.init_process_group("cpu:lptrain,cuda:lptrain")',
    ]


def final_line(script: str, tmp_path: Path, **env: str) -> str:
    """The example's last line under torchrun, after checking that it ended well and that
    neither rank had a thread of gloo's left when the interpreter started to finalize: such
    a thread aborts a rare run ("terminate called without an active exception", see
    exit_threads/sitecustomize.py), and it is there on every run that risks it."""
    threads = tmp_path / f"threads-{script}"
    threads.mkdir()
    path = os.pathsep.join(p for p in (str(EXIT_THREADS), os.environ.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run = subprocess.run(
        [*cmd, str(EXAMPLES / script), "--steps", "12"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **env, "PYTHONPATH": path, "LPTRAIN_EXIT_THREADS": str(threads)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    at_exit = {f.name.split("-")[0]: f.read_text().split() for f in threads.glob("*.txt")}
    assert {"0", "1"} <= at_exit.keys(), f"{script}: no list of threads from every rank: {sorted(at_exit)}"
    for rank in ("0", "1"):
        gloo = [name for name in at_exit[rank] if "gloo" in name]
        assert not gloo, f"{script}, rank {rank}: gloo's threads alive at the interpreter's exit: {gloo}"
    return [line for line in run.stdout.splitlines() if line.startswith("final loss")][-1]


def test_the_examples_train_to_the_same_weights_under_torchrun(tmp_path):
    """Two processes: every algorithm adds the same two numbers, so the weights agree exactly."""
    plain = final_line("ddp_plain.py", tmp_path)
    assert final_line("ddp_hook.py", tmp_path) == plain
    assert final_line("ddp_backend.py", tmp_path, LPTRAIN_ALGO="ring") == plain


def test_an_unknown_algorithm_for_the_backend_is_refused_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    run = subprocess.run(
        [*cmd, str(EXAMPLES / "ddp_backend.py"), "--steps", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LPTRAIN_ALGO": "lq"},
    )
    assert run.returncode != 0
    said = [line for line in run.stderr.splitlines() if line.startswith("lptrain.comm.errors.CollectiveInputError")]
    assert said and said[0].endswith(
        "LPTRAIN_ALGO='lq' is not an algorithm of the lptrain backend; valid: lp, mst, be, ring"
    )
