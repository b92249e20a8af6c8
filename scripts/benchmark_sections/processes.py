"""processes: lptrain's schedules across processes on loopback, against gloo's own allreduce
(and Open MPI's where mpirun and mpi4py are installed).

Every link is the same memory bus here, so the figures rank the executors' overheads, not
the algorithms; the cluster section does that where the network is the bottleneck. One run
on this shared 2-core machine differs from the next by up to 2x, so the section measures
:data:`ROUNDS` interleaved rounds (each one run with 2 processes, then one with 4, every
schedule and gloo's own side by side in each run) and gives, for each algorithm, the median
over the rounds of its ratio to gloo's allreduce in the same run, with the lowest and highest
round: a noisy moment slows both sides of one ratio, and a median is not the luckiest run."""

from __future__ import annotations

import importlib.util
import shutil
import statistics
from dataclasses import dataclass

from benchmark_sections.common import bench_rows, median_range, present, size_label, wrong_sentence
from doctools.commands import Run
from doctools.markdown import table
from lptrain.comm.algorithms import SCHEDULES

NAME = "processes"
HEADING = "Across processes on loopback against gloo"
QUESTION = (
    "The schedules across processes (torch.distributed point-to-point over gloo) against gloo's own "
    "allreduce, and Open MPI's where it is installed."
)
MINUTES = 11
DEFAULT = True
ROUNDS = 7
PROCESSES = (2, 4)
SIZES = "-b 16M -e 64M -f 4"
GOAL_SIZES = (16 << 20, 64 << 20)


@dataclass(frozen=True)
class Goal:
    """What a schedule should reach on loopback: at least ``floor`` times gloo's allreduce
    at every size of :data:`GOAL_SIZES`, with each process count of ``processes``."""

    algo: str
    label: str
    processes: tuple[int, ...]
    floor: float


GOALS = (Goal("ring", "ring", (2, 4), 0.95), Goal("lp", "LP", (2,), 0.90))


def has_mpi() -> bool:
    return shutil.which("mpirun") is not None and importlib.util.find_spec("mpi4py") is not None


def measure(run: Run) -> dict:
    """:data:`ROUNDS` rounds, each one benchmark run per process count in turn; the record's
    commands are the ones a round runs, once, under a line saying how many rounds ran."""
    mpi = has_mpi()
    algos = ",".join(SCHEDULES) + ",nccl" + (",mpi" if mpi else "")  # nccl: the backend's own (gloo here)
    bench = f"-m lptrain.bench --op allreduce --algo {algos} {SIZES} --trials 3 --target-time 0.5"
    rounds = []
    for _ in range(ROUNDS):
        rows = []
        for p in PROCESSES:
            if mpi:
                run(f"mpirun --allow-run-as-root --oversubscribe -np {p} python {bench} --json p{p}.json")
            else:
                run(f"torchrun --standalone --nproc-per-node {p} {bench} --json p{p}.json")
            rows += bench_rows(run.json(f"p{p}.json"))
        rounds.append(rows)
    each = list(dict.fromkeys(run.commands))
    run.commands[:] = [f"# {ROUNDS} rounds, interleaved: each round runs these {len(each)} in turn", *each]
    return {"rounds": rounds, "mpi": mpi}


def rounds_of(r: dict) -> list[list[dict]]:
    """The record's rounds; a record of one run (``rows``, as saved before rounds) is one round."""
    return r["rounds"] if "rounds" in r else [r["rows"]]


def ratios(rounds: list[list[dict]], p: int, size: int, algo: str) -> list[float]:
    """``algo``'s busbw over gloo's in the same run, for each round that measured both."""
    out = []
    for rows in rounds:
        cell = {(x["devices"], x["size"], x["algo"]): x["busbw"] for x in rows}
        if (p, size, algo) in cell and (p, size, "gloo") in cell:
            out.append(cell[(p, size, algo)] / cell[(p, size, "gloo")])
    return out


def median_busbw(rounds: list[list[dict]], p: int, size: int, algo: str) -> str:
    got = [x["busbw"] for rows in rounds for x in rows if (x["devices"], x["size"], x["algo"]) == (p, size, algo)]
    return f"{statistics.median(got):.2f}" if got else "-"


def gloo_range(rounds: list[list[dict]]) -> str:
    """How far gloo's own busbw moved over the rounds at the largest size, for each process
    count: why the figures above are ratios within a run."""
    parts = []
    for p in sorted({x["devices"] for rows in rounds for x in rows}):
        big = max(x["size"] for rows in rounds for x in rows if x["devices"] == p)
        got = [x["busbw"] for rows in rounds for x in rows if (x["devices"], x["size"], x["algo"]) == (p, big, "gloo")]
        if len(got) > 1:
            parts.append(f"{min(got):.2f} to {max(got):.2f} GB/s with {p} processes")
    return f" (gloo's own at {size_label(big)} ranged from " + ", ".join(parts) + ")" if parts else ""


def link_phrase(rounds: list[list[dict]], p: int) -> str:
    """The transport as lptrain measured it with ``p`` processes, the median over the rounds."""
    found = [next((x for x in rows if x["devices"] == p and x.get("link_alpha_s")), None) for rows in rounds]
    links = [x for x in found if x]
    if not links:
        return ""
    alpha = statistics.median(x["link_alpha_s"] for x in links)
    rate = statistics.median(x["link_bytes_per_s"] for x in links)
    return f" (the link as lptrain measured it: {alpha * 1e6:.0f} us per message, {rate / 1e9:.2f} GB/s)"


def goal_line(rounds: list[list[dict]], goal: Goal) -> str | None:
    """Whether ``goal`` holds, by the median of each round's ratio, at every size and process
    count it names; None where the record measured none of them."""
    parts, held = [], []
    for p in goal.processes:
        for size in GOAL_SIZES:
            got = ratios(rounds, p, size, goal.algo)
            if not got:
                continue
            middle = statistics.median(got)
            held.append(middle >= goal.floor)
            above = sum(x >= goal.floor for x in got)
            parts.append(
                f"{p} processes, {size_label(size)}: {middle:.2f}x, {'met' if held[-1] else 'not met'} "
                f"({above} of {len(got)} rounds at or above)"
            )
    if not parts:
        return None
    counts = " and ".join(str(p) for p in goal.processes)
    sizes = " and ".join(size_label(s) for s in GOAL_SIZES)
    return (
        f"- Goal: {goal.label} at least {goal.floor:.2f}x gloo's allreduce at {sizes} with {counts} processes, "
        f"by the median of the rounds: {'met' if all(held) else 'not met'}. " + "; ".join(parts) + "."
    )


def render(r: dict) -> list[str]:
    rounds = rounds_of(r)
    every = [x for rows in rounds for x in rows]
    algos = present(SCHEDULES, every) + (["mpi"] if any(x["algo"] == "mpi" for x in every) else [])
    n = len(rounds)
    lines = [
        (f"{n} rounds, interleaved: each round" if n > 1 else "1 round:")
        + " one run with 2 processes, then one with 4, every "
        "schedule and gloo's own allreduce side by side in each run (each row the slowest rank's time, the median of "
        "3 round-robin trials; one intra-op thread per process, torchrun's default). A cell is the median over the "
        "rounds of the schedule's busbw over gloo's in the same run and, in brackets, the lowest and the highest "
        "round. " + wrong_sentence(every),
        "",
    ]
    if not r.get("mpi"):
        lines += ["Open MPI: not measured, `mpirun` (with mpi4py) is not installed on this machine.", ""]
    sizes = {p: sorted({x["size"] for x in every if x["devices"] == p}) for p in sorted({x["devices"] for x in every})}
    for p, measured in sizes.items():
        body = [
            [size_label(s)] + [median_range(got) if (got := ratios(rounds, p, s, a)) else "-" for a in algos]
            for s in measured
        ]
        lines += [f"{p} processes{link_phrase(rounds, p)}, against gloo's allreduce:", ""]
        lines += [*table(["size", *algos], body), ""]
    body = [
        [str(p), size_label(s)] + [median_busbw(rounds, p, s, a) for a in [*algos, "gloo"]]
        for p, measured in sizes.items()
        for s in measured
    ]
    lines += [f"busbw in GB/s (nccl-tests' factor 2(P-1)/P), the median over the rounds{gloo_range(rounds)}:", ""]
    lines += [*table(["P", "size", *algos, "gloo"], body), ""]
    reading = [line for goal in GOALS if (line := goal_line(rounds, goal))]
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
        "- Cause found on 2026-12-06, fixed: the ring's allgather landed every share in a staging slot and copied it "
        "out, one 4 MiB memory pass more per step: the receives, posted ahead of the sends so that gloo's notice "
        "goes before them (slow links), could not land in place while the reduce-scatter's send of the same "
        "elements was still in flight. On a link measured fast the executor now posts such a receive when its "
        "turn comes, in place (`stage_ahead` in `lptrain.comm.dataflow`; the profile counts copies staged: 3 per "
        "call at 16M with 4 processes before, 0 now). `scripts/profile_dist.py --algo ring` with 4 processes, "
        "before (27d2ca8) and after, one run each: applying took 4.1 then 1.9 ms per call at 16M and 32.8 then "
        "10.3 ms at 64M (rank 0), and the ring ran at 0.87x then 0.90x gloo's speed at 16M, 0.93x then 0.98x at "
        "64M (its CPU time over all ranks 1.11x gloo's at 64M before, 1.03x after). The table above was 0.92x and "
        "0.89x (4 processes, 16M and 64M) in the run of 2026-12-05 before the change."
    )
    reading.append(
        "- On loopback every link is the same memory bus and, with 4 processes, the ranks take turns on the 2 cores: "
        "LP's advantage (every link of its chain busy at once) cannot show here. These figures rank the executors' "
        "overheads (lptrain's schedules as gloo point-to-point messages driven from Python, gloo's allreduce in C++); "
        "the emulated cluster's section measures the algorithms where the network is the bottleneck."
    )
    return [*lines, *reading]


def headline(r: dict) -> list[str] | None:
    rounds = rounds_of(r)
    every = [x for rows in rounds for x in rows]
    parts = []
    for p in sorted({x["devices"] for x in every}):
        big = max(x["size"] for x in every if x["devices"] == p)
        got = {a: ratios(rounds, p, big, a) for a in ("ring", "lp")}
        parts.append(
            ", ".join(f"{label} {statistics.median(got[a]):.2f}x" for a, label in (("ring", "ring"), ("lp", "LP")))
            + f" (P = {p})"
        )
    n = len(rounds)
    return [
        f"Ring and LP against gloo's allreduce, {size_label(big)}, processes on loopback "
        f"(medians of {n} round{'s' if n != 1 else ''})",
        "; ".join(parts),
    ]
