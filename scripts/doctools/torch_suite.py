"""PyTorch's own distributed tests (``DistributedTest`` in the torch wheel) on gloo and on
lptrain's torch.distributed backends, side by side: what scripts/torch_suite.py prints and
tests/test_pytorch_suite.py checks.

Each (backend, world size) runs in a process of its own (doctools.torch_suite_cases),
because the harness reads its settings from the environment when it is imported. The
harness chooses and runs the tests as it does for gloo; only the backend each rank joins
differs, so "lptrain passes what gloo passes" compares the same test bodies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from doctools.markdown import table

# The selection: PyTorch's allreduce, broadcast, reduce, barrier, all_gather and
# communication-hook tests (re.search on the test's name), CPU ones (names with cuda, gpu
# or nccl left out).
SELECTION = r"^test_(all_reduce|sparse_all_reduce|broadcast|reduce|barrier|all_gather)|hook"
CPU_ONLY = r"^(?!.*(cuda|gpu|nccl))"
BACKENDS = ("gloo", "lptrain_lp", "lptrain_ring")
WORLD_SIZES = (2, 3)
OUTCOMES = ("pass", "fail", "error", "skip")
SCRIPTS = Path(__file__).resolve().parents[1]


def pattern(selection: str = SELECTION) -> str:
    """``selection`` among the CPU tests (re.search on the name)."""
    return f"{CPU_ONLY}.*?(?:{selection})"


def run(
    backend: str, world_size: int, selection: str = SELECTION, log: Path | None = None, timeout: float = 1800
) -> dict:
    """Run the selection for one backend and world size: {test name: (outcome, why)}.

    The child's own output (the harness's logs, the ranks' warnings) goes to ``log``. A child
    still running after ``timeout`` seconds is ended with its process group (it made it:
    its ranks and their helpers), and the tests not reported count as errors."""
    with tempfile.TemporaryDirectory(prefix="torch-suite-") as temp:
        (Path(temp) / "barrier").mkdir()
        env = dict(
            os.environ,
            LPTRAIN_SUITE_BACKEND=backend,
            WORLD_SIZE=str(world_size),
            TEMP_DIR=temp,
            PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")])),
        )
        err = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
        child = subprocess.Popen(
            [sys.executable, "-m", "doctools.torch_suite_cases", pattern(selection)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=temp,
            start_new_session=True,
        )
        try:
            out, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
        finally:
            if log:
                err.close()
    results = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["test"]] = (row["outcome"], row["why"])
    if child.returncode != 0:
        results["(the run)"] = ("error", f"{backend} at {world_size} processes ended with exit code {child.returncode}")
    return results


def counts(results: dict) -> dict[str, int]:
    return {kind: sum(1 for o, _ in results.values() if o == kind) for kind in OUTCOMES}


def missing(results: dict, reference: dict) -> dict[str, tuple[str, str]]:
    """The tests ``reference`` (gloo) passes that ``results`` does not pass."""
    return {
        t: results.get(t, ("absent", ""))
        for t, (o, _) in reference.items()
        if o == "pass" and results.get(t, ("",))[0] != "pass"
    }


def render(found: dict[tuple[str, int], dict]) -> list[str]:
    """The table: one row per backend, passed / failed / skipped per world size, and the
    tests gloo passes that the backend does not."""
    sizes = sorted({w for _, w in found})
    backends = list(dict.fromkeys(b for b, _ in found))
    header = ["backend", *(f"{w} processes: passed / failed / skipped" for w in sizes), "gloo passes, this does not"]
    rows = []
    for backend in backends:
        cells, lacking = [], []
        for w in sizes:
            c = counts(found[backend, w])
            cells.append(f"{c['pass']} / {c['fail'] + c['error']} / {c['skip']}")
            gloo = found.get(("gloo", w))
            if gloo is not None and backend != "gloo":
                lacking += [f"{t} ({w})" for t in missing(found[backend, w], gloo)]
        rows.append([f"`{backend}`", *cells, ", ".join(lacking) or "none"])
    return table(header, rows)
