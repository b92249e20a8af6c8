#!/usr/bin/env python3
"""docs/BENCHMARKS.md, regenerated: every section measured by one command and rendered in place.

    python scripts/benchmarks.py                      # every default section: 12 to 30 minutes on 2 cores
    python scripts/benchmarks.py --only inprocess     # one section (or a list: --only trainer,auto)
    python scripts/benchmarks.py --render             # no measuring: the sections again from their JSON
    python scripts/benchmarks.py --list               # the sections, what each runs, when it last ran

Each section sits between ``<!-- benchmarks:NAME -->`` and ``<!-- /benchmarks:NAME -->`` and is
replaced there, the rest of the document byte for byte as it was. Its figures are kept in
docs/data/benchmarks/NAME.json (the cluster's in docs/data/cluster.json), from which
``--render`` writes it again. A section is written only once all of it was measured: one
that fails or is interrupted leaves its JSON and the document as they were (every file is
written to a temporary name and renamed). If README.md holds ``<!-- benchmarks:headline -->``
and its end marker, a short table of headline figures is written there from the JSON.

``cluster`` (root, about 45 minutes: ``scripts/cluster_results.py``) and ``gpu`` (a CUDA
machine: ``scripts/gpu_check.sh``) run only when named in ``--only``. Benchmarks, not tests:
nothing here is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "BENCHMARKS.md"
DATA = ROOT / "docs" / "data" / "benchmarks"
CLUSTER_DATA = ROOT / "docs" / "data" / "cluster.json"
README = ROOT / "README.md"
PREFIX = "benchmarks"
HEARTBEAT_S = 60.0


class MarkerError(Exception):
    """A document lacks a section's markers (or has them twice, or out of order)."""


# ---------------------------------------------------------------------------------------------
# The document: sections between markers, written atomically.


def markers(name: str, prefix: str = PREFIX) -> tuple[str, str]:
    return f"<!-- {prefix}:{name} -->", f"<!-- /{prefix}:{name} -->"


def replace_section(text: str, name: str, body: list[str], prefix: str = PREFIX, where: str = "the document") -> str:
    """``text`` with the lines between ``name``'s two markers replaced by ``body``; the
    markers and everything outside them are kept as they were."""
    begin, end = markers(name, prefix)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise MarkerError(f"{where} needs one '{begin}' line and, after it, one '{end}' line around the {name} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "\n" + "\n".join(body) + "\n" + end + tail


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename:
    a reader (or an interrupted run) sees the old file or the new one, never half of one."""
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


def update_sections(path: Path, bodies: dict[str, list[str]], prefix: str = PREFIX) -> None:
    """Replace each named section of the file at ``path`` (all markers checked first)."""
    text = path.read_text()
    for name, body in bodies.items():
        text = replace_section(text, name, body, prefix, where=str(path))
    write_atomically(path, text)


def anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


# ---------------------------------------------------------------------------------------------
# Measuring: commands shown as a user types them, run with this interpreter, progress shown.


def machine() -> dict:
    """What the figures depend on besides the code: CPU, cores, memory, kernel, torch."""
    import torch

    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        cpuinfo, meminfo = Path("/proc/cpuinfo").read_text(), Path("/proc/meminfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
        mem = [int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")]
        memory_gib = round(mem[0] / 2**20, 1) if mem else None
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def executable(tokens: list[str]) -> list[str]:
    """The command as shown (``lptrain-bench``, ``torchrun``, ``python scripts/x.py``) as run:
    with this interpreter, the scripts by their path, so that it does not matter what PATH holds."""
    first = {
        "lptrain-bench": [sys.executable, "-m", "lptrain.bench"],
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        "python": [sys.executable],
    }
    argv: list[str] = []
    for i, token in enumerate(tokens):
        if token == "python" or (i == 0 and token in first):
            argv += first[token]
        elif token.startswith("scripts/") and (ROOT / token).exists():
            argv.append(str(ROOT / token))
        else:
            argv.append(token)
    return argv


class Run:
    """One section's measurement: runs commands in a scratch folder and remembers them."""

    def __init__(self, name: str, work: Path, say: Callable[[str], None]):
        self.name, self.work, self.say = name, work, say
        self.commands: list[str] = []

    def __call__(self, command: str, ok: tuple[int, ...] = (0,)) -> str:
        """Run ``command``, written as a user types it; it is also what the section shows."""
        self.commands.append(command)
        self.say(f"[{self.name}] $ {command}")
        argv = executable(shlex.split(command))
        return stream(argv, self.work, lambda line: self.say(f"[{self.name}]   {line}"), ok)

    def json(self, name: str):
        return json.loads((self.work / name).read_text())


def stream(argv: list[str], cwd: Path, say: Callable[[str], None], ok: tuple[int, ...] = (0,)) -> str:
    """Run ``argv``, passing its output on line by line (and a line a minute while it is
    silent); return its standard output. An exit status not in ``ok`` raises with its last lines."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    lines: queue.Queue = queue.Queue()
    out: list[str] = []
    err: list[str] = []

    def pump(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line)
            lines.put(line.rstrip("\n"))
        lines.put(None)

    readers = [
        threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    began = last = time.monotonic()
    open_pipes = 2
    try:
        while open_pipes:
            try:
                line = lines.get(timeout=5)
            except queue.Empty:
                if time.monotonic() - last >= HEARTBEAT_S:
                    say(f"... running, {duration(time.monotonic() - began)} so far")
                    last = time.monotonic()
                continue
            if line is None:
                open_pipes -= 1
            elif not line.startswith("W1") and "OMP_NUM_THREADS" not in line and line.strip("* "):
                say(line)
                last = time.monotonic()
        proc.wait()
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    if proc.returncode not in ok:
        tail = " | ".join(line.strip() for line in (err or out)[-3:])
        raise RuntimeError(f"{shlex.join(argv[:4])} ... exited with {proc.returncode}: {tail}")
    return "".join(out)


def duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"


# ---------------------------------------------------------------------------------------------
# Small helpers for the tables.


def size_label(nbytes: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def spread(times: list[float]) -> float:
    """How far apart the rounds of one variant were: slowest / fastest - 1."""
    return max(times) / min(times) - 1 if len(times) > 1 else 0.0


def wrong_sentence(rows: list[dict]) -> str:
    checked = [r for r in rows if r.get("wrong") is not None]
    bad = [r for r in checked if r["wrong"]]
    if not bad:
        return f"Every result was checked before it was timed: `#wrong` was 0 in all {len(checked)} rows."
    return f"`#wrong` was not 0 in {len(bad)} of {len(checked)} rows: " + ", ".join(
        f"{r['algo']} {r['op']} {size_label(r['size'])}" for r in bad
    )


KEEP = (
    "op",
    "size",
    "algo",
    "devices",
    "time_us",
    "busbw",
    "moved",
    "vs_memcpy",
    "wrong",
    "segment",
    "block",
    "link_alpha_s",
    "link_bytes_per_s",
)


def bench_rows(rows: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in KEEP} for r in rows]


# ---------------------------------------------------------------------------------------------
# inprocess: the in-process executor against memcpy.

INPROCESS_ALGOS = ("lp", "lp-rb", "mst", "be", "ring")


def measure_inprocess(run: Run) -> dict:
    rows = []
    for p in (4, 8):
        algos = ",".join(INPROCESS_ALGOS)
        run(
            f"lptrain-bench --op all --algo {algos} --devices 'cpu*{p}' -b 1K -e 64M -f 256 --trials 3 --json c{p}.json"
        )
        rows += bench_rows(run.json(f"c{p}.json"))
    return {"rows": rows}


def render_inprocess(r: dict) -> list[str]:
    rows = r["rows"]
    big, small = max(x["size"] for x in rows), min(x["size"] for x in rows)
    cell = {(x["devices"], x["op"], x["size"], x["algo"]): x for x in rows}
    keys = sorted(
        {(x["devices"], x["op"]) for x in rows}, key=lambda k: (k[0], ("allreduce", "broadcast", "reduce").index(k[1]))
    )
    big_rows, small_rows = [], []
    for p, op in keys:
        memcpy = cell[(p, op, big, "memcpy")]
        big_rows.append(
            [str(p), op, f"{memcpy['moved']:.1f}"]
            + [
                f"{cell[(p, op, big, a)]['moved']:.1f} ({cell[(p, op, big, a)]['vs_memcpy']:.2f})"
                for a in INPROCESS_ALGOS
            ]
        )
        small_rows.append([str(p), op] + [f"{cell[(p, op, small, a)]['time_us']:.1f}" for a in INPROCESS_ALGOS])
    ratios = [(x["vs_memcpy"], x) for x in rows if x["size"] == big and x["algo"] in INPROCESS_ALGOS]
    low, high = min(ratios, key=lambda t: t[0]), max(ratios, key=lambda t: t[0])
    lp = {p: cell[(p, "allreduce", big, "lp")]["vs_memcpy"] for p in sorted({k[0] for k in keys})}
    fast = {p: min(INPROCESS_ALGOS, key=lambda a: cell[(p, "allreduce", small, a)]["time_us"]) for p in lp}
    slow = {p: max(INPROCESS_ALGOS, key=lambda a: cell[(p, "allreduce", small, a)]["time_us"]) for p in lp}
    reading = [
        f"- At {size_label(big)} every schedule moved between {low[0]:.2f} and {high[0]:.2f} of memcpy's bandwidth "
        f"(lowest {low[1]['algo']} {low[1]['op']} at P = {low[1]['devices']}, highest {high[1]['algo']} "
        f"{high[1]['op']} at P = {high[1]['devices']}). LP's allreduce: "
        + ", ".join(f"{v:.2f} at P = {p}" for p, v in lp.items())
        + ".",
        "- On CPU every device shares one memory bus, so this measures the executor's overhead against the "
        "machine's copy bandwidth, not LP against BE on real links (that is the emulated cluster's section and "
        "the simulator's).",
    ]
    if high[0] > 1:
        reading.append(
            "- A ratio above 1 is possible because memcpy streams the whole message through memory once, while a "
            "schedule's blocks can still be in the cache when the next copy reads them."
        )
    reading.append(
        f"- At {size_label(small)}, where dispatch dominates, the allreduce took "
        + "; ".join(
            f"{cell[(p, 'allreduce', small, fast[p])]['time_us']:.1f} us ({fast[p]}) to "
            f"{cell[(p, 'allreduce', small, slow[p])]['time_us']:.1f} us ({slow[p]}) at P = {p}"
            for p in lp
        )
        + "."
    )
    return [
        "What the columns mean: `moved` = bytes the schedule sends over all its links / time; `vs_memcpy` = moved / "
        "the bandwidth of one `copy_` of the same number of bytes, measured in the same run. On CPU every link is a "
        "memory copy (or an add), so memcpy's bandwidth is the limit a transfer is compared with. Medians of 3 "
        "round-robin trials over all the algorithms. " + wrong_sentence(rows),
        "",
        f"{size_label(big)} messages, moved GB/s and, in brackets, the ratio to memcpy:",
        "",
        *table(["P", "op", "memcpy GB/s", *INPROCESS_ALGOS], big_rows),
        "",
        f"{size_label(small)} messages, microseconds per call:",
        "",
        *table(["P", "op", *INPROCESS_ALGOS], small_rows),
        "",
        *reading,
    ]


def headline_inprocess(r: dict) -> list[str]:
    big = max(x["size"] for x in r["rows"])
    lp = next(x for x in r["rows"] if (x["devices"], x["op"], x["size"], x["algo"]) == (4, "allreduce", big, "lp"))
    return [
        f"LP allreduce in one process, 4 CPU devices, {size_label(big)}",
        f"{lp['vs_memcpy']:.2f}x memcpy's bandwidth",
    ]


# ---------------------------------------------------------------------------------------------
# processes: lptrain's schedules across processes on loopback against gloo (and Open MPI).

PROCESS_ALGOS = ("lp", "mst", "be", "ring")


def has_mpi() -> bool:
    return shutil.which("mpirun") is not None and importlib.util.find_spec("mpi4py") is not None


def measure_processes(run: Run) -> dict:
    rows = []
    mpi = has_mpi()
    for p in (2, 4):
        algos = ",".join(PROCESS_ALGOS) + ",nccl" + (",mpi" if mpi else "")
        bench = f"-m lptrain.bench --op allreduce --algo {algos} -b 1M -e 64M -f 4 --trials 3 --target-time 0.5"
        if mpi:
            run(f"mpirun --allow-run-as-root --oversubscribe -np {p} python {bench} --json p{p}.json")
        else:
            run(f"torchrun --standalone --nproc-per-node {p} {bench} --json p{p}.json")
        rows += bench_rows(run.json(f"p{p}.json"))
    return {"rows": rows, "mpi": mpi}


def render_processes(r: dict) -> list[str]:
    rows = r["rows"]
    algos = [*PROCESS_ALGOS, "gloo"] + (["mpi"] if any(x["algo"] == "mpi" for x in rows) else [])
    cell = {(x["devices"], x["size"], x["algo"]): x for x in rows}
    lines = [
        "busbw in GB/s (nccl-tests' factor 2(P-1)/P) and, in brackets, the ratio to gloo's own allreduce in the same "
        "run; each row the slowest rank's time, the median of 3 round-robin trials; one intra-op thread per process "
        "(torchrun's default). " + wrong_sentence(rows),
        "",
    ]
    if not r.get("mpi"):
        lines += ["Open MPI: not measured, `mpirun` (with mpi4py) is not installed on this machine.", ""]
    reading = []
    for p in sorted({x["devices"] for x in rows}):
        sizes = sorted({x["size"] for x in rows if x["devices"] == p})
        link = next((x for x in rows if x["devices"] == p and x.get("link_alpha_s")), None)
        measured = (
            (
                f" (the link as lptrain measured it: {link['link_alpha_s'] * 1e6:.0f} us per message, "
                f"{link['link_bytes_per_s'] / 1e9:.2f} GB/s)"
            )
            if link
            else ""
        )
        lines += [f"{p} processes{measured}:", ""]
        body = []
        for s in sizes:
            gloo = cell[(p, s, "gloo")]["busbw"]
            body.append(
                [size_label(s)]
                + [
                    (
                        f"{cell[(p, s, a)]['busbw']:.2f}"
                        + ("" if a == "gloo" else f" ({cell[(p, s, a)]['busbw'] / gloo:.2f})")
                    )
                    if (p, s, a) in cell
                    else "-"
                    for a in algos
                ]
            )
        lines += [*table(["size", *algos], body), ""]
        big = sizes[-1]
        gloo = cell[(p, big, "gloo")]["busbw"]
        ratio = {a: cell[(p, big, a)]["busbw"] / gloo for a in PROCESS_ALGOS if (p, big, a) in cell}
        best = max(ratio, key=ratio.get)
        par = [
            a
            for a in PROCESS_ALGOS
            if all(
                (p, s, a) in cell and cell[(p, s, a)]["busbw"] >= 0.9 * cell[(p, s, "gloo")]["busbw"]
                for s in sizes
                if s >= 16 << 20
            )
        ]
        reading.append(
            f"- {p} processes, {size_label(big)}: LP at {ratio['lp']:.2f}x gloo's allreduce, the best schedule "
            f"{best} at {ratio[best]:.2f}x. At or above 0.9x gloo at every size from 16M up: "
            + (", ".join(par) if par else "none")
            + "."
        )
    reading.append(
        "- On loopback every link is the same memory bus and, with 4 processes, the ranks take turns on the 2 cores: "
        "LP's advantage (every link of its chain busy at once) cannot show here. These figures rank the executors' "
        "overheads (lptrain's schedules as gloo point-to-point messages driven from Python, gloo's allreduce in C++); "
        "the emulated cluster's section measures the algorithms where the network is the bottleneck."
    )
    return [*lines, *reading]


def headline_processes(r: dict) -> list[str]:
    cell = {(x["devices"], x["size"], x["algo"]): x["busbw"] for x in r["rows"]}
    parts = []
    for p in sorted({x["devices"] for x in r["rows"]}):
        big = max(x["size"] for x in r["rows"] if x["devices"] == p)
        best = max(cell[(p, big, a)] for a in PROCESS_ALGOS if (p, big, a) in cell) / cell[(p, big, "gloo")]
        parts.append(f"{best:.2f}x (P = {p}; LP {cell[(p, big, 'lp')] / cell[(p, big, 'gloo')]:.2f}x)")
    return [
        f"Best lptrain schedule against gloo's allreduce, {size_label(big)}, processes on loopback",
        ", ".join(parts),
    ]


# ---------------------------------------------------------------------------------------------
# trainer: lptrain's trainer against PyTorch DDP.

TRAINER_VARIANTS = ("ddp", "lp:on", "ring:on")
TRAINER_LABELS = {
    "ddp": "DDP (gloo)",
    "lp:on": "lptrain comm=lp",
    "ring:on": "lptrain comm=ring",
    "lp:off": "lptrain comm=lp, overlap off",
    "ring:off": "lptrain comm=ring, overlap off",
}


def measure_trainer(run: Run) -> dict:
    variants = ",".join(TRAINER_VARIANTS)
    run(
        "python scripts/bench_ddp.py --recipes googlenet,alexnet --steps 8 --repeats 2 "
        f"--variants {variants} --in-process 0 --json ddp.json"
    )
    return run.json("ddp.json")


def render_trainer(r: dict) -> list[str]:
    body, reading = [], []
    for recipe, got in r["recipes"].items():
        ddp = got["best"]["ddp"]
        for v, times in got["rounds"].items():
            body.append(
                [
                    recipe,
                    TRAINER_LABELS.get(v, v),
                    ", ".join(f"{t:.2f}" for t in times),
                    f"{got['best'][v]:.2f}",
                    f"{ddp / got['best'][v]:.2f}x",
                ]
            )
    ratios = {recipe: got["best"]["ddp"] / got["best"]["lp:on"] for recipe, got in r["recipes"].items()}
    reading.append(
        "- lptrain's trainer (comm=lp, overlap on, its defaults) ran "
        + " and ".join(f"{recipe} at {x:.2f}x" for recipe, x in ratios.items())
        + f" DDP's speed (best of {r['repeats']} interleaved rounds; above 1: lptrain faster)."
    )
    noise = {recipe: max(spread(t) for t in got["rounds"].values()) for recipe, got in r["recipes"].items()}
    reading.append(
        "- The rounds of one variant differed by up to "
        + " and ".join(f"{100 * x:.0f}% ({recipe})" for recipe, x in noise.items())
        + ": a difference between variants smaller than that is within this machine's noise."
    )
    verdict = {
        recipe: "faster than DDP" if x - 1 > noise[recipe] else "slower than DDP" if 1 - x > noise[recipe] else "even"
        for recipe, x in ratios.items()
    }
    reading.append(
        "- Against that spread, lptrain's trainer is "
        + "; ".join(
            f"{'within the noise of DDP' if v == 'even' else v + ' by more than that'} on {recipe}"
            for recipe, v in verdict.items()
        )
        + "."
    )
    return [
        f"{r['nproc']} processes under `torchrun --standalone`, one CPU replica and one thread each (torchrun's "
        f"default), the recipe's batch, network, data and optimizer, {r['steps']} steps; DDP with its 25 MiB "
        f"buckets on gloo (`scripts/ddp_recipe.py`), lptrain with {r['bucket_mb']:g} MiB buckets. The figure is the "
        "wall clock of the training steps (start-up excluded), each variant once per round, the rounds interleaved; "
        "the ratio is DDP's best over the variant's best (above 1: faster than DDP).",
        "",
        *table(["recipe", "variant", "train s, each round", "best s", "vs DDP"], body),
        "",
        *reading,
    ]


def headline_trainer(r: dict) -> list[str]:
    ratios = [f"{recipe} {got['best']['ddp'] / got['best']['lp:on']:.2f}x" for recipe, got in r["recipes"].items()]
    return [f"lptrain's trainer against PyTorch DDP, {r['nproc']} processes (CPU)", ", ".join(ratios)]


# ---------------------------------------------------------------------------------------------
# ddp-hook: DDP with lptrain's comm hook and on lptrain's backend.


def measure_ddp_hook(run: Run) -> dict:
    run(
        "python scripts/bench_ddp_hook.py --recipe googlenet --steps 8 --repeats 2 "
        "--variants native,hook:lp,hook:ring,backend:lp --json hook.json"
    )
    return run.json("hook.json")


def render_ddp_hook(r: dict) -> list[str]:
    best = {v: min(t) for v, t in r["rounds"].items() if t}
    native = best["native"]
    body = [
        [
            r["labels"].get(v, v),
            ", ".join(f"{x:.2f}" for x in t),
            f"{best[v]:.2f}",
            f"{1e3 * best[v] / r['steps']:.0f}",
            f"{native / best[v]:.2f}x",
        ]
        for v, t in r["rounds"].items()
        if t
    ]
    others = {v: native / b for v, b in best.items() if v != "native"}
    noise = max(spread(t) for t in r["rounds"].values() if t)
    return [
        f"{r['recipe']}, {r['where']}, one CPU replica per process, {r['steps']} steps, {r['bucket_mb']:g} MiB buckets "
        f"everywhere; every variant trains the same network on the same batches. The figure is the wall clock of the "
        f"steps, each variant once per round ({r['repeats']} rounds, interleaved); the ratio is DDP native's best "
        "over the variant's best (above 1: faster).",
        "",
        *table(["variant", "train s, each round", "best s", "ms/step", "vs native"], body),
        "",
        "- Against DDP native: "
        + ", ".join(f"{r['labels'].get(v, v)} {x:.2f}x" for v, x in others.items())
        + f"; the rounds of one variant differed by up to {100 * noise:.0f}%.",
    ] + (
        [
            "- With 2 processes LP's chain is a single exchange, the same transfers as gloo's allreduce; lptrain's "
            "schedules run them as gloo point-to-point messages from Python on the hook's thread, beside backward on "
            "the same 2 cores."
        ]
        if r["nproc"] == 2
        else []
    )


# ---------------------------------------------------------------------------------------------
# data: the input pipeline.


def measure_data(run: Run) -> dict:
    run("python scripts/bench_data.py --trials 2 --json data.json")
    return run.json("data.json")


def render_data(r: dict) -> list[str]:
    rows = {x["workers"]: x for x in r["rows"]}
    body = [
        [
            str(w),
            f"{x['loader_img_s']:.0f}",
            f"{x['first_batch_s']:.2f}",
            f"{x['train_img_s']:.0f}",
            f"{x['data_ms']:.1f}",
            f"{x['compute_ms']:.1f}",
        ]
        for w, x in rows.items()
    ]
    none = rows[min(rows)]
    loader = max(rows, key=lambda w: rows[w]["loader_img_s"])
    train = max(rows, key=lambda w: rows[w]["train_img_s"])
    with_workers = [x for w, x in rows.items() if w > 0]

    def workers(n: int) -> str:
        return f"{n} worker{'' if n == 1 else 's'}" if n else "no workers"

    reading = [
        f"- The pipeline alone was fastest with {workers(loader)}: {rows[loader]['loader_img_s']:.0f} images/s, "
        f"{rows[loader]['loader_img_s'] / none['loader_img_s']:.2f}x the training process decoding alone.",
        f"- In training the highest rate came with {workers(train)}: {rows[train]['train_img_s']:.0f} images/s, "
        + ", ".join(f"{x['train_img_s']:.0f} with {workers(w)}" for w, x in rows.items() if w != train)
        + ".",
    ]
    if with_workers:
        compute = [x["compute_ms"] for x in with_workers]
        slower = min(compute) > none["compute_ms"]
        reading.append(
            f"- The wait for data was {none['data_ms']:.1f} ms a step with no workers and "
            f"{min(x['data_ms'] for x in with_workers):.1f} to {max(x['data_ms'] for x in with_workers):.1f} ms with "
            f"them; compute {none['compute_ms']:.1f} ms without and {min(compute):.1f} to {max(compute):.1f} ms with"
            + (": on 2 cores the workers' decoding takes cores from the training process's threads." if slower else ".")
        )
    return [
        f"{r['images']} training JPEGs of 64 to 256 px made by `scripts/make_imagefolder.py`, the {r['model']} model "
        f"at {r['image_size']} px, global batch {r['batch']} on `{r['devices']}`; the worker counts measured "
        f"round-robin, medians of {r['trials']} trials. `loader img/s`: the pipeline alone (decode, crop, flip, "
        f"collate), {r['loader_steps']} batches after {r['warmup']}; `first batch s`: the time to the first batch; "
        f"`train img/s`: the trainer's figure over {r['train_steps']} steps, data wait included; `data wait ms` and "
        "`compute ms`: the trainer's per-step means.",
        "",
        *table(["workers", "loader img/s", "first batch s", "train img/s", "data wait ms", "compute ms"], body),
        "",
        *reading,
    ]


# ---------------------------------------------------------------------------------------------
# overlap: communication overlapped with backward, and half-size gradients.

FIGURE = ROOT / "docs" / "figures" / "grad_dtype.png"


def measure_overlap(run: Run) -> dict:
    run("python scripts/bench_ddp.py --recipes alexnet --steps 6 --variants none --in-process 4 --json exposed.json")
    run("python scripts/bench_grad_dtype.py --steps 100 --out grad_dtype.png --json grad.json")
    return {
        "exposed": run.json("exposed.json"),
        "grad_dtype": run.json("grad.json"),
        "figure": "figures/grad_dtype.png",
    }


def after_overlap(work: Path) -> None:
    """The figure goes beside the document once the section is written."""
    shutil.copyfile(work / "grad_dtype.png", FIGURE)


def render_overlap(r: dict) -> list[str]:
    ex = r["exposed"]["in_process"]
    body = [
        [
            "on" if x["overlap"] else "off",
            f"{x['comm_ms']:.1f} ms",
            f"{x['exposed_ms']:.1f} ms",
            f"{100 * x['exposed_ms'] / x['step_ms']:.1f}%",
            f"{x['step_ms']:.0f} ms",
        ]
        for x in ex
    ]
    off = next(x for x in ex if not x["overlap"])
    on = next(x for x in ex if x["overlap"])
    g = r["grad_dtype"]
    rows = {x["dtype"]: x for x in g["rows"]}
    grad = [
        [
            d,
            f"{x['mib_per_step']:.2f} MiB",
            f"{x['max_loss_diff']:.4f}",
            f"{x['final_loss']:.4f}",
            f"{100 * x['eval_accuracy']:.2f}%",
            f"{x['comm_ms']:.2f} ms",
        ]
        for d, x in rows.items()
    ]
    fp32 = rows["fp32"]
    half = [d for d in rows if d != "fp32"]
    first = ex[0]
    return [
        f"Exposed communication: {first['recipe']} in one process on {first['devices']} CPU replicas, 25 MiB buckets, "
        f"{r['exposed']['steps']} steps, with `trainer.overlap` off and on (per-step means of the trainer's summary):",
        "",
        *table(["overlap", "communication per step", "exposed", "exposed share of the step", "step"], body),
        "",
        f"- Exposed communication: {on['exposed_ms']:.1f} ms a step with overlap on, {off['exposed_ms']:.1f} ms off; "
        f"the collectives themselves took {on['comm_ms']:.1f} ms on and {off['comm_ms']:.1f} ms off, and the step "
        f"{on['step_ms']:.0f} ms on and {off['step_ms']:.0f} ms off (one run of each). CPU replicas run their "
        "backward in turn, so a bucket's collective can start only during the last replica's backward, and it runs "
        "on the same 2 cores as that backward.",
        "",
        f"Half-size gradients: the default experiment (4 CPU replicas, the small CNN), {g['steps']} steps once per "
        "`comm.grad_dtype`, same seed and batches:",
        "",
        *table(
            [
                "comm.grad_dtype",
                "bytes per step",
                f"max abs(loss - fp32 loss), {g['steps']} steps",
                "final loss",
                "eval accuracy",
                "comm per step",
            ],
            grad,
        ),
        "",
        f"- {' and '.join(half)} send {rows[half[0]]['mib_per_step'] / fp32['mib_per_step']:.2f} of fp32's bytes; "
        "the largest loss difference from fp32 over the run was "
        + ", ".join(f"{rows[d]['max_loss_diff']:.4f} ({d})" for d in half)
        + ". Communication per step: "
        + ", ".join(f"{x['comm_ms']:.2f} ms ({d})" for d, x in rows.items())
        + ". At this size (under 1 MiB) dispatch, the casts and the float32 accumulation weigh more than the "
        "bytes; the halving pays where the link is the bottleneck.",
        "",
        f"![loss curves of the default experiment with gradients communicated in fp32, bf16 and fp16]({r['figure']})",
    ]


# ---------------------------------------------------------------------------------------------
# auto: comm=auto against every fixed algorithm, on a tuning file measured here.

TUNING = ROOT / "docs" / "tuning" / "cpu4-allreduce.json"
AUTO_GRID = "--op allreduce --algo lp,lp-rb,mst,be,ring{} --lp-block auto,1M --devices 4 -b 1K -e 64M -f 4"


def measure_auto(run: Run) -> dict:
    grid, check = AUTO_GRID.format(""), AUTO_GRID.format(",auto")
    run(f"lptrain-bench {grid} --trials 9 --target-time 0.5 --save-tuning cpu4-allreduce.json --quiet --json grid.json")
    run(f"lptrain-bench {check} --tuning cpu4-allreduce.json --trials 15 --target-time 1.0 --json check.json")
    return {"tuning": run.json("cpu4-allreduce.json"), "rows": bench_rows(run.json("check.json"))}


def after_auto(work: Path) -> None:
    """The tuning file this section measured becomes the machine's own, in docs/tuning/."""
    shutil.copyfile(work / "cpu4-allreduce.json", TUNING)


def tuning_label(row: dict) -> str:
    """A tuning file's row as the benchmark names the same candidate (lp-rb@1M, mst)."""
    options = row.get("options") or {}
    algo = "lp-rb" if options.get("allreduce") == "reduce_broadcast" else row["algo"]
    return f"{algo}@{options.get('block_size', 'auto')}" if row["algo"] == "lp" else algo


def auto_rows(r: dict) -> list[dict]:
    rows = [x for x in r["rows"] if x["algo"] != "memcpy"]
    out = []
    for size in sorted({x["size"] for x in rows}):
        at = {x["algo"]: x["time_us"] for x in rows if x["size"] == size}
        fixed = {a: t for a, t in at.items() if a != "auto"}
        best = min(fixed, key=fixed.get)
        grid = [x for x in r["tuning"]["rows"] if x["bytes"] == size and x["op"] == "allreduce"]
        ran = tuning_label(min(grid, key=lambda x: x["time_us"])) if grid else None
        out.append(
            {
                "size": size,
                "best": best,
                "best_us": fixed[best],
                "auto_us": at["auto"],
                "ran": ran,
                "ran_us": fixed.get(ran),
            }
        )
    return out


def render_auto(r: dict) -> list[str]:
    rows = auto_rows(r)
    body = [
        [
            size_label(x["size"]),
            f"{x['best']} {x['best_us']:.1f}",
            f"{x['auto_us']:.1f}",
            f"{x['auto_us'] / x['best_us']:.2f}",
            x["ran"] or "-",
            f"{x['ran_us']:.1f}" if x["ran_us"] else "-",
            f"{x['ran_us'] / x['best_us']:.2f}" if x["ran_us"] else "-",
        ]
        for x in rows
    ]
    ratio = [x["auto_us"] / x["best_us"] for x in rows]
    worst = rows[ratio.index(max(ratio))]
    within = sum(q <= 1.10 for q in ratio)
    return [
        "The first command measures the grid and writes the tuning file (docs/tuning/cpu4-allreduce.json, the "
        "machine's own), the second times `auto` beside every fixed candidate in one run. `auto ran` is the "
        "candidate the file measured fastest at that size; lp and lp-rb as `@auto` (the cost model's block) or `@1M`. "
        "Times in microseconds, medians of 15 round-robin trials of a second in all.",
        "",
        *table(["size", "best fixed (us)", "auto (us)", "auto / best", "auto ran", "that one (us)", "it / best"], body),
        "",
        f"- auto was within 10% of the best fixed algorithm at {within} of the {len(rows)} sizes; auto / best ranged "
        f"from {min(ratio):.2f} to {max(ratio):.2f} (the largest at {size_label(worst['size'])}).",
        "- The candidates' own order changes between runs where they are within a few percent of each other; a "
        "choice cannot be steadier than the measurements it was made from.",
    ]


def headline_auto(r: dict) -> list[str]:
    ratio = [x["auto_us"] / x["best_us"] for x in auto_rows(r)]
    return [
        "comm=auto against the best fixed algorithm, 4 CPU devices, 1K to 64M",
        f"{min(ratio):.2f}x to {max(ratio):.2f}x the best's time",
    ]


# ---------------------------------------------------------------------------------------------
# cluster: the emulated cluster (scripts/cluster_results.py), and gpu: the check on one H200.


def cluster_script():
    spec = importlib.util.spec_from_file_location("cluster_results", HERE / "cluster_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_cluster(run: Run) -> dict:
    if os.geteuid() != 0:
        raise RuntimeError("the cluster section needs root (network namespaces): run it as root")
    run("python scripts/cluster_results.py")
    return json.loads(CLUSTER_DATA.read_text())


def render_cluster(data: dict) -> list[str]:
    return cluster_script().benchmarks_section(data)


def headline_cluster(data: dict) -> list[str]:
    from lptrain.cluster import experiment as ex

    big = max(r["size"] for r in data["bench"])
    cell = {
        r["algo"]: ex._n_over_b(r)
        for r in ex.with_nominal(data)
        if r["op"] == "broadcast" and r["nodes"] == 4 and r["size"] == big
    }
    return [
        f"Emulated cluster, broadcast at P = 4, {size_label(big)}, {data['conditions']['link']} ports",
        f"LP {cell['lp']:.2f} n/B (BE {cell['be']:.2f}, MST {cell['mst']:.2f}, gloo {cell['gloo']:.2f})",
    ]


def cluster_record(data: dict) -> dict:
    """docs/data/cluster.json as a section's record: the date, machine and commands of its run."""
    c = data["conditions"]
    nodes = sorted({r["nodes"] for r in data.get("bench", [])})
    each = (
        f"lptrain-cluster --nodes P --link {c['link']} -- lptrain-bench --op all -b 4M -e 16M "
        "--algo lp,mst,be,ring,nccl -n 1 --trials 3"
    )
    return {
        "section": "cluster",
        "started": c.get("date", "?"),
        "took_s": None,
        "machine": c["machine"],
        "load": None,
        "commands": [f"python scripts/cluster_results.py   # as root; for P = {nodes[0]} to {nodes[-1]} it runs", each],
        "results": data,
    }


# the benchmark step of scripts/gpu_check.sh, as that script runs it
GPU_STEP = (
    "python -m lptrain.bench --devices cuda:0,cuda:0,cuda:0,cuda:0 --algo lp,mst,be,ring --reduce-kernel peer,staged "
    "-b 1M -e 64M -f 8 --trials 3 --target-time 0.05"
)


def measure_gpu(run: Run) -> dict:
    run("bash scripts/gpu_check.sh out", ok=(0, 1))  # 1: a step failed, which its summary says
    with tarfile.open(run.work / "out" / "gpu_check.tgz") as tar:
        tar.extractall(run.work / "out", filter="data")
    logs = run.work / "out" / "logs"
    rows = json.loads((logs / "bench.json").read_text())
    big = max(x["size"] for x in rows)
    return {
        "environment": (logs / "env.txt").read_text().strip().splitlines(),
        "steps": (run.work / "out" / "summary.txt").read_text().strip().splitlines(),
        "bench_command": GPU_STEP,
        "rows": bench_rows([x for x in rows if x["size"] == big]),
    }


def render_gpu(r: dict) -> list[str]:
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
    return lines


def headline_gpu(r: dict) -> list[str]:
    at = {x["algo"]: x["vs_memcpy"] for x in r["rows"]}
    lp = [v for a, v in at.items() if a.startswith("lp")]
    ring = [v for a, v in at.items() if a.startswith("ring")]
    size = size_label(r["rows"][0]["size"])
    return [
        f"One H200, 4 replicas sharing it, {size} allreduce",
        f"LP {min(lp):.2f} to {max(lp):.2f} of memcpy, ring {min(ring):.2f} to {max(ring):.2f}",
    ]


# ---------------------------------------------------------------------------------------------
# The sections.


@dataclass
class Section:
    name: str
    heading: str
    question: str
    minutes: int
    measure: Callable[[Run], dict]
    render: Callable[[dict], list[str]]
    headline: Callable[[dict], list[str]] | None = None
    after: Callable[[Path], None] | None = None  # files beside the JSON, once the section is written
    default: bool = True


SECTIONS = [
    Section(
        "inprocess",
        "In-process collectives against memcpy",
        "The schedules on CPU devices in one process: what the executor costs against the machine's copy "
        "bandwidth, and a small message's latency.",
        5,
        measure_inprocess,
        render_inprocess,
        headline_inprocess,
    ),
    Section(
        "processes",
        "Across processes on loopback against gloo",
        "The schedules across processes (torch.distributed point-to-point over gloo) against gloo's own "
        "allreduce, and Open MPI's where it is installed.",
        2,
        measure_processes,
        render_processes,
        headline_processes,
    ),
    Section(
        "trainer",
        "The trainer against PyTorch DDP",
        "lptrain's trainer and PyTorch DDP side by side on the same recipe, batch and steps.",
        5,
        measure_trainer,
        render_trainer,
        headline_trainer,
    ),
    Section(
        "ddp-hook",
        "DDP with lptrain's hook and backend",
        "PyTorch DDP averaging its buckets with lptrain's communication hook, and DDP on lptrain's process-group "
        "backend, beside DDP's own allreduce.",
        2,
        measure_ddp_hook,
        render_ddp_hook,
    ),
    Section(
        "data",
        "The input pipeline",
        "How fast the DataLoader workers feed training on this machine.",
        1,
        measure_data,
        render_data,
    ),
    Section(
        "overlap",
        "Overlap and half-size gradients",
        "How much communication overlapping it with backward hides, and what gradients communicated in bf16 "
        "and fp16 cost and save.",
        2,
        measure_overlap,
        render_overlap,
        after=after_overlap,
    ),
    Section(
        "auto",
        "comm=auto against the fixed algorithms",
        "Whether the algorithm comm=auto picks from this machine's tuning file is as fast as the best fixed "
        "one, measured again.",
        2,
        measure_auto,
        render_auto,
        headline_auto,
        after=after_auto,
    ),
    Section(
        "cluster",
        "Across namespaces with shaped links: where the network is the bottleneck",
        "The collectives on an emulated cluster (network namespaces, one shaped port per node), where the link "
        "and not the CPU sets the time.",
        45,
        measure_cluster,
        render_cluster,
        headline_cluster,
        default=False,
    ),
    Section(
        "gpu",
        "The GPU check on one H200",
        "The GPU path's prepared check (`scripts/gpu_check.sh`) on a machine with one GPU.",
        6,
        measure_gpu,
        render_gpu,
        headline_gpu,
        default=False,
    ),
]
BY_NAME = {s.name: s for s in SECTIONS}
HEADLINE_ORDER = ("inprocess", "processes", "trainer", "auto", "cluster", "gpu")


def data_path(name: str, data_dir: Path) -> Path:
    return data_dir / f"{name}.json"


def load_record(name: str, data_dir: Path) -> dict | None:
    """A section's saved record (for the cluster, made from docs/data/cluster.json)."""
    if name == "cluster":
        path = data_dir.parent / CLUSTER_DATA.name
        return cluster_record(json.loads(path.read_text())) if path.exists() else None
    path = data_path(name, data_dir)
    return json.loads(path.read_text()) if path.exists() else None


def describe_machine(m) -> str:
    if isinstance(m, str):
        return m
    memory = f", {m['memory_gib']} GiB memory" if m.get("memory_gib") else ""
    return (
        f"{m['cpu']}, {m['cores']} cores{memory}, {m['os']}, Python {m['python']}, torch {m['torch']} "
        f"({m['threads']} intra-op threads by default){', CUDA' if m.get('cuda') else ', no GPU'}"
    )


def render(section: Section, record: dict) -> list[str]:
    """The section between its markers: heading, question, commands, conditions, tables, reading."""
    lines = [f"## {section.heading}", "", section.question, "", "```bash", *record["commands"], "```", ""]
    took = f", took {duration(record['took_s'])}" if record.get("took_s") else ""
    lines.append(
        f"- Run: {record['started']}{took}; `python scripts/benchmarks.py --only {section.name}` runs it again."
    )
    lines.append(f"- Machine: {describe_machine(record['machine'])}.")
    if record.get("load"):
        end = f"; {record['load_end'][0]:.2f} at its end" if record.get("load_end") else ""
        lines.append(
            f"- Load average at its start: {' / '.join(f'{x:.2f}' for x in record['load'])} (1 / 5 / 15 min)"
            f"{end}. The machine is shared with other work, so the figures move from run to run."
        )
    return [*lines, "", *section.render(record["results"])]


def headline(records: dict[str, dict]) -> list[str]:
    rows = []
    for name in HEADLINE_ORDER:
        section, record = BY_NAME[name], records.get(name)
        if record is None or section.headline is None:
            continue
        what, figure = section.headline(record["results"])
        date = str(record["started"]).split()[0]
        rows.append([what, figure, f"[{date}](docs/BENCHMARKS.md#{anchor(section.heading)})"])
    return table(["what", "result", "measured"], rows)


# ---------------------------------------------------------------------------------------------
# Running.


def measure(section: Section, work: Path, say: Callable[[str], None]) -> dict:
    run = Run(section.name, work, say)
    began = time.time()
    load = list(os.getloadavg())
    results = section.measure(run)
    return {
        "section": section.name,
        "started": datetime.datetime.fromtimestamp(began, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "took_s": round(time.time() - began, 1),
        "load": [round(x, 2) for x in load],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "machine": machine(),
        "commands": run.commands,
        "results": results,
    }


def write_section(section: Section, record: dict, doc: Path, data_dir: Path) -> None:
    body = render(section, record)  # rendered before anything is written: a failure changes nothing
    text = replace_section(doc.read_text(), section.name, body, where=str(doc))
    if section.name != "cluster":  # the cluster's JSON is cluster_results.py's own
        write_atomically(data_path(section.name, data_dir), json.dumps(record, indent=1) + "\n")
    write_atomically(doc, text)


def write_headline(readme: Path, data_dir: Path, say: Callable[[str], None]) -> None:
    if not readme.exists() or markers("headline")[0] not in readme.read_text():
        say(f"no headline table: {readme} has no '{markers('headline')[0]}' line")
        return
    records = {name: r for name in HEADLINE_ORDER if (r := load_record(name, data_dir)) is not None}
    update_sections(readme, {"headline": headline(records)})
    say(f"wrote the headline table in {readme}")


def list_sections(data_dir: Path) -> None:
    for s in SECTIONS:
        record = load_record(s.name, data_dir)
        when = record["started"] if record else "never"
        kind = "default" if s.default else "only when named"
        print(f"{s.name:<10} {kind:<16} ~{s.minutes:>2} min  last run {when:<21}  #{anchor(s.heading)}")


def parse_only(p: argparse.ArgumentParser, text: str | None, rendering: bool) -> list[Section]:
    if text is None:
        return [s for s in SECTIONS if s.default or rendering]
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"--only: no section {', '.join(unknown)}; the sections: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="sections: " + ", ".join(f"{s.name}{'' if s.default else ' (only when named)'}" for s in SECTIONS),
    )
    p.add_argument("--only", metavar="NAME[,NAME...]", help="these sections only (default: every default section)")
    p.add_argument("--render", action="store_true", help="measure nothing: the sections again from their JSON")
    p.add_argument("--list", action="store_true", help="list the sections and when each last ran")
    p.add_argument("--doc", type=Path, default=DOC, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, default=DATA, help=argparse.SUPPRESS)
    p.add_argument("--readme", type=Path, default=README, help="where the headline table goes (default README.md)")
    args = p.parse_args(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.list:
        list_sections(args.data_dir)
        return 0
    sections = parse_only(p, args.only, args.render)
    try:
        text = args.doc.read_text()
        for s in sections:  # every marker before any measuring: a missing one is found at once
            replace_section(text, s.name, [], where=str(args.doc))
    except (MarkerError, OSError) as err:
        print(f"benchmarks: error: {err}", file=sys.stderr)
        return 2
    if args.render:
        for s in sections:
            record = load_record(s.name, args.data_dir)
            if record is None:
                say(f"{s.name}: no saved data, its section is left as it is")
                continue
            write_section(s, record, args.doc, args.data_dir)
        write_headline(args.readme, args.data_dir, say)
        say(f"rendered {', '.join(s.name for s in sections)} in {args.doc}")
        return 0
    if any(s.name == "gpu" for s in sections) and not cuda_available():
        print(
            "benchmarks: error: the gpu section needs a CUDA GPU, and torch.cuda.is_available() is False here",
            file=sys.stderr,
        )
        return 2
    failed = []
    began = time.time()
    for i, s in enumerate(sections, 1):
        say(f"== {s.name} ({i} of {len(sections)}, about {s.minutes} min): {s.heading}")
        started = time.time()
        with tempfile.TemporaryDirectory(prefix=f"benchmarks_{s.name}_") as tmp:
            try:
                record = measure(s, Path(tmp), say)
                if s.name == "cluster":  # its record is docs/data/cluster.json's, as --render reads it
                    record = cluster_record(record["results"])
                write_section(s, record, args.doc, args.data_dir)
                if s.after:
                    s.after(Path(tmp))
            except KeyboardInterrupt:
                say(f"benchmarks: interrupted in {s.name}: its section and data are as they were")
                return 130
            except Exception as err:  # one section's failure leaves it as it was; the others still run
                say(f"benchmarks: {s.name} failed, its section and data are as they were: {err}")
                failed.append(s.name)
                continue
        say(f"== {s.name} written in {duration(time.time() - started)}: {args.doc}")
    write_headline(args.readme, args.data_dir, say)
    say(f"done in {duration(time.time() - began)}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
