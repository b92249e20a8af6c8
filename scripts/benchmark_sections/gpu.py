"""gpu: the GPU path's prepared check (``scripts/gpu_check.sh``) on a machine with one GPU:
its steps' outcomes and its benchmark step's largest message."""

from __future__ import annotations

import json
import shlex
import tarfile

from benchmark_sections.common import bench_rows, size_label
from doctools import ROOT
from doctools.commands import Run
from doctools.markdown import table

NAME = "gpu"
HEADING = "The GPU check on one H200"
QUESTION = "The GPU path's prepared check (`scripts/gpu_check.sh`) on a machine with one GPU."
MINUTES = 6
DEFAULT = False  # a CUDA machine
CHECK = ROOT / "scripts" / "gpu_check.sh"


def bench_step(script: str) -> str:
    """The benchmark step of the check, as the shell ``script`` runs it (its ``step bench``
    line, continuations joined), written as a user types it: the section quotes what ran."""
    text = script.replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.split()[:2] == ["step", "bench"])
    words = shlex.split(line)[3:]  # after: step bench SECONDS
    if "--json" in words:
        at = words.index("--json")
        del words[at : at + 2]  # the check's own log file
    return shlex.join(["python" if w == "$PY" else w for w in words])


def measure(run: Run) -> dict:
    run("bash scripts/gpu_check.sh out", ok=(0, 1))  # 1: a step failed, which its summary says
    with tarfile.open(run.work / "out" / "gpu_check.tgz") as tar:
        tar.extractall(run.work / "out", filter="data")
    logs = run.work / "out" / "logs"
    rows = json.loads((logs / "bench.json").read_text())
    big = max(x["size"] for x in rows)
    lp_check = logs / "lp_memcpy.json"  # the lp_memcpy step: what one LP allreduce issued
    return {
        "lp_one_call": json.loads(lp_check.read_text())["one_call"] if lp_check.exists() else None,
        "environment": (logs / "env.txt").read_text().strip().splitlines(),
        "steps": (run.work / "out" / "summary.txt").read_text().strip().splitlines(),
        "bench_command": bench_step(CHECK.read_text()),
        "rows": bench_rows([x for x in rows if x["size"] == big]),
    }


def render(r: dict) -> list[str]:
    body = [
        [
            x["algo"],
            f"{x['time_us']:.1f}",
            f"{x['busbw']:.1f}",
            f"{x['moved']:.1f}",
            f"{x['vs_memcpy']:.2f}",
            "-" if x["wrong"] is None else str(x["wrong"]),
        ]
        for x in r["rows"]
    ]
    size = size_label(r["rows"][0]["size"])
    lines = []
    if r.get("notes"):
        lines += [r["notes"][0], ""]
    if r.get("steps"):
        lines += ["The check's steps:", "", "```", *r["steps"], "```", ""]
    lines += [
        f"`{r['bench_command']}` (the check's benchmark step), the {size} rows. Four replicas share the one GPU, so "
        "these are copies and adds within one device (its memcpy is the limit), not links between GPUs; `peer` is "
        "the one-pass CuPy kernel, `staged` the copy-then-add path:",
        "",
        *table(["algo", "time (us)", "busbw GB/s", "moved GB/s", "vs memcpy", "#wrong"], body),
        "",
        *(r.get("notes") or [])[1:],
    ]
    if r.get("lp_one_call"):
        c = r["lp_one_call"]
        lines += [
            "",
            f"- One LP allreduce of {size} over the four replicas (the `lp_memcpy` step, eager) issued "
            f"{c['blocks']} blocks, {c['events']} events and {c['waits']} stream waits.",
        ]
    return lines


def headline(r: dict) -> list[str] | None:
    at = {x["algo"]: x["vs_memcpy"] for x in r["rows"]}
    lp = [v for a, v in at.items() if a.startswith("lp")]
    ring = [v for a, v in at.items() if a.startswith("ring")]
    size = size_label(r["rows"][0]["size"])
    return [
        f"One H200, 4 replicas sharing it, {size} allreduce",
        f"LP {min(lp):.2f} to {max(lp):.2f} of memcpy, ring {min(ring):.2f} to {max(ring):.2f}",
    ]
