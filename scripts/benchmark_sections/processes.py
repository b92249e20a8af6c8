"""processes: lptrain's schedules across processes on loopback, against gloo's own allreduce
(and Open MPI's where mpirun and mpi4py are installed).

Every link is the same memory bus here, so the figures rank the executors' overheads, not
the algorithms; the cluster section does that where the network is the bottleneck."""

from __future__ import annotations

import importlib.util
import shutil

from benchmark_sections.common import bench_rows, present, size_label, wrong_sentence
from doctools.commands import Run
from doctools.markdown import table
from lptrain.comm.algorithms import SCHEDULES

NAME = "processes"
HEADING = "Across processes on loopback against gloo"
QUESTION = (
    "The schedules across processes (torch.distributed point-to-point over gloo) against gloo's own "
    "allreduce, and Open MPI's where it is installed."
)
MINUTES = 2
DEFAULT = True


def has_mpi() -> bool:
    return shutil.which("mpirun") is not None and importlib.util.find_spec("mpi4py") is not None


def measure(run: Run) -> dict:
    rows = []
    mpi = has_mpi()
    for p in (2, 4):
        algos = ",".join(SCHEDULES) + ",nccl" + (",mpi" if mpi else "")  # nccl: the backend's own (gloo here)
        bench = f"-m lptrain.bench --op allreduce --algo {algos} -b 1M -e 64M -f 4 --trials 3 --target-time 0.5"
        if mpi:
            run(f"mpirun --allow-run-as-root --oversubscribe -np {p} python {bench} --json p{p}.json")
        else:
            run(f"torchrun --standalone --nproc-per-node {p} {bench} --json p{p}.json")
        rows += bench_rows(run.json(f"p{p}.json"))
    return {"rows": rows, "mpi": mpi}


def render(r: dict) -> list[str]:
    rows = r["rows"]
    schedules = present(SCHEDULES, rows)
    algos = [*schedules, "gloo"] + (["mpi"] if any(x["algo"] == "mpi" for x in rows) else [])
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
        ratio = {a: cell[(p, big, a)]["busbw"] / gloo for a in schedules if (p, big, a) in cell}
        best = max(ratio, key=ratio.get)
        par = [
            a
            for a in schedules
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
        "- Per allreduce call and rank (the executor's own profile, `scripts/profile_dist.py`): on a link measured"
        " at 500 MB/s or more, loopback here, a message is a rank's share n/P within 1 to 4 MiB and no send is "
        "paced. The ring's 2(P - 1) steps then take 8 messages (sends and receives) at 16M and 32 at 64M with 2 "
        "processes, 12 and 48 with 4 (LP with 4: 8 at its ends, 16 in the middle at 16M; 32 and 64 at 64M), each "
        "waited for once, none paced; gloo's ring moves the same 2(P - 1) chunks per rank from C++. Each step as "
        "one message (4 with 2 processes, 12 with 4) was tried: with 4 processes it gained 5 to 7% at 64M (more "
        "ranks than cores: fewer messages, less CPU), with 2 it lost 17% (the addition of a whole share no longer "
        "overlaps the next transfer), so the 4 MiB bound stays."
    )
    reading.append(
        "- On loopback every link is the same memory bus and, with 4 processes, the ranks take turns on the 2 cores: "
        "LP's advantage (every link of its chain busy at once) cannot show here. These figures rank the executors' "
        "overheads (lptrain's schedules as gloo point-to-point messages driven from Python, gloo's allreduce in C++); "
        "the emulated cluster's section measures the algorithms where the network is the bottleneck."
    )
    return [*lines, *reading]


def headline(r: dict) -> list[str] | None:
    cell = {(x["devices"], x["size"], x["algo"]): x["busbw"] for x in r["rows"]}
    schedules = present(SCHEDULES, r["rows"])
    parts = []
    for p in sorted({x["devices"] for x in r["rows"]}):
        big = max(x["size"] for x in r["rows"] if x["devices"] == p)
        best = max(cell[(p, big, a)] for a in schedules if (p, big, a) in cell) / cell[(p, big, "gloo")]
        parts.append(f"{best:.2f}x (P = {p}; LP {cell[(p, big, 'lp')] / cell[(p, big, 'gloo')]:.2f}x)")
    return [
        f"Best lptrain schedule against gloo's allreduce, {size_label(big)}, processes on loopback",
        ", ".join(parts),
    ]
