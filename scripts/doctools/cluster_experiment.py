"""The project's own experiment on the emulated cluster: collectives and training where the
link, not the CPU, sets the time, and the simulator held against what was measured.

``scripts/cluster_results.py`` drives it, and ``scripts/benchmarks.py`` renders its rows as
a section of docs/BENCHMARKS.md: docs tooling, kept out of the wheel (``lptrain-cluster``
itself is the user's feature). Each measurement is one ``lptrain-cluster`` run (real
namespaces, shaped links, one torchrun node per namespace); the rows are kept in a JSON
file so that the tables can be rendered again, and the simulator recalibrated, without
measuring again. Times are reported as multiples of n/B, where n is the message
and B the nominal rate of one port one way: the physical limit of a broadcast.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from doctools.launch import lptrain_cluster
from doctools.markdown import table
from lptrain.cluster.plan import parse_rate
from lptrain.comm.algorithms import SCHEDULES, WITH_VARIANTS
from lptrain.comm.sizes import parse_size

OPS = ("broadcast", "reduce", "allreduce")
SCHEDULE_ALGOS = SCHEDULES
BENCH_ALGOS = (*SCHEDULE_ALGOS, "nccl")  # nccl is the backend's own collective (gloo here)
TABLE_ALGOS = (*SCHEDULE_ALGOS, "gloo")  # as the benchmark's rows name them
SMALL, BIG = 4 << 20, 16 << 20  # the messages the documents' tables show (the default sizes' ends)


def _cluster(nodes: int, link: str, logs: Path, command: list[str], timeout_s: float) -> list[str]:
    options = ("--nodes", str(nodes), "--link", link, "--quiet", "--logs", str(logs), "--timeout", str(int(timeout_s)))
    return [*lptrain_cluster(*options), *command]


def _run(argv: list[str], what: str) -> None:
    """Run one lptrain-cluster command. On Ctrl-C it has the SIGINT too (same process
    group) and removes what it made: wait for that instead of killing it mid-cleanup."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate()
    except BaseException:
        proc.wait()
        raise
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {last}")


def conditions(link: str) -> dict:
    """What the figures depend on besides the code: the link, the machine and its load."""
    return {
        "link": link,
        "link_bytes_per_s": parse_rate(link) / 8,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {platform.node()}",
        "load_before": os.getloadavg()[0],
        "nice": os.nice(0),
    }


def bench_on_cluster(nodes: int, link: str, sizes: tuple[str, str], trials: int, work: Path) -> list[dict]:
    """lptrain-bench for every op and algorithm on ``nodes`` namespaces: its JSON rows, each
    with the node count."""
    out = work / f"bench-p{nodes}.json"
    load = os.getloadavg()[0]
    bench = [sys.executable, "-m", "lptrain.bench", "--op", "all", "-b", sizes[0], "-e", sizes[1], "-f", "4",
             "--algo", ",".join(BENCH_ALGOS), "-n", "1", "--trials", str(trials), "--json", str(out), "--quiet",
             "--timeout", "120"]  # fmt: skip
    logs = work / f"logs-bench-p{nodes}"
    _run(_cluster(nodes, link, logs, bench, 3600), f"the benchmark on {nodes} nodes")
    check = fidelity_of(logs)
    return [dict(row, nodes=nodes, load=load, fidelity=check) for row in json.loads(out.read_text())]


def fidelity_of(logs: Path) -> dict:
    """What lptrain-cluster's fidelity check measured before a run (its fidelity.json):
    the slowest and the median flow against nominal with every port busy, and softirq."""
    check = json.loads((logs / "fidelity.json").read_text())
    return {k: check[k] for k in ("passed", "worst_ratio", "median_ratio", "softirq")}


def fidelity_phrase(data: dict) -> str | None:
    """The fidelity checks of the benchmark's runs in a few words; None where the rows
    predate the check."""
    checks = [r["fidelity"] for r in data.get("bench", []) if r.get("fidelity")]
    if not checks:
        return None
    worst = [c["worst_ratio"] for c in checks]
    softirq = [c["softirq"] for c in checks]
    return (
        f"before each run lptrain-cluster's fidelity check (every port sending and receiving at once) had the "
        f"slowest port at {min(worst):.1%} to {max(worst):.1%} of its rate, softirq {min(softirq):.0%} to "
        f"{max(softirq):.0%} of the CPU"
    )


def auto_on_cluster(nodes: int, link: str, work: Path) -> dict:
    """Tune comm=auto on the cluster (``--save-tuning``), then, in a second cluster run, time
    auto beside every fixed algorithm, so the pick is judged on fresh measurements. (Two
    runs: a second process group in the same torchrun workers would meet the first one's
    rendezvous keys in the store.)"""
    tuning, out = work / "tuning.json", work / "auto.json"
    load = os.getloadavg()[0]
    bench = [sys.executable, "-m", "lptrain.bench", "-b", "256K", "-e", "16M", "-f", "4", "--op", "allreduce",
             "-n", "1", "--trials", "3", "--quiet"]  # fmt: skip
    tune = [
        *bench,
        "--algo",
        ",".join(WITH_VARIANTS),
        "--json",
        str(work / "tune-rows.json"),
        "--save-tuning",
        str(tuning),
    ]
    _run(_cluster(nodes, link, work / "logs-tune", tune, 3600), "comm=auto's tuning on the cluster")
    timed = [*bench, "--algo", ",".join(("auto", *WITH_VARIANTS)), "--tuning", str(tuning), "--json", str(out)]
    _run(_cluster(nodes, link, work / "logs-auto", timed, 3600), "comm=auto timed on the cluster")
    return {"nodes": nodes, "tuning": json.loads(tuning.read_text()), "rows": json.loads(out.read_text()), "load": load}


@dataclass(frozen=True)
class TrainCase:
    """One training configuration: the paper's iteration is ``sync=reduce`` (gradients
    reduced to the root, the weights broadcast back)."""

    label: str
    overrides: tuple[str, ...]


TRAIN_CASES = (
    TrainCase("lp, reduce + broadcast (the paper's iteration)", ("comm=lp", "trainer.sync=reduce")),
    TrainCase("lp, allreduce", ("comm=lp",)),
    TrainCase("be, allreduce", ("comm=be",)),
    TrainCase("ring, allreduce", ("comm=ring",)),
    TrainCase("gloo's own allreduce", ("comm=nccl",)),
)
TRAIN_MODEL = ("model=googlenet", "model.image_size=64", "data=synthetic")


def train_on_cluster(nodes: int, link: str, case: TrainCase, steps: int, work: Path) -> dict:
    """A short GoogLeNet run (5.6 M parameters, 22 MB of gradients) on ``nodes`` namespaces:
    the communication ms of each step after the first."""
    load = os.getloadavg()[0]
    run = work / f"train-p{nodes}-{case.overrides[0].split('=')[1]}-{len(case.overrides)}"
    command = [sys.executable, "-m", "lptrain.cli", *TRAIN_MODEL, *case.overrides, "trainer.devices=cpu*1",
               f"trainer.steps={steps}", "trainer.batch_per_device=8", "trainer.overlap=false",
               "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.progress=false",
               "trainer.tensorboard=false", "trainer.log_every=1", f"hydra.run.dir={run}"]  # fmt: skip
    _run(_cluster(nodes, link, run.with_name(run.name + "-logs"), command, 1800), f"training ({case.label}, P={nodes})")
    steps_seen = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line.strip()]
    comm = [s["comm_ms"] for s in steps_seen[1:]]
    from lptrain.models import build_model

    model = build_model("googlenet", 10, 64)
    parameters = sum(p.numel() for p in model.parameters())
    return {"nodes": nodes, "case": case.label, "parameters": parameters, "load": load,
            "comm_ms": statistics.median(comm), "steps": len(steps_seen),
            "step_ms": statistics.median(s["step_ms"] for s in steps_seen[1:])}  # fmt: skip


def measure(
    nodes: list[int],
    link: str,
    sizes: tuple[str, str],
    trials: int,
    train_nodes: list[int],
    train_steps: int,
    only: set[str],
    previous: dict | None,
    say=print,
    save=lambda data: None,
) -> dict:
    """Run the parts named in ``only`` (bench, auto, train) and keep the others from
    ``previous``; ``save`` is called after each part, so a failure later loses nothing."""
    data = dict(previous or {})
    data["conditions"] = conditions(link) if only else data.get("conditions", conditions(link))
    work = Path(tempfile.mkdtemp(prefix="lptrain-cluster-results-"))  # kept: every node's log
    say(f"logs in {work}")
    if "bench" in only:
        again = {(p, parse_size(s)) for p in nodes for s in sizes}
        data["bench"] = [r for r in data.get("bench", []) if (r["nodes"], r["size"]) not in again]  # the rest stay
        for p in nodes:
            say(f"benchmark on {p} nodes ({link}) ...")
            data["bench"] += bench_on_cluster(p, link, sizes, trials, work)
        save(data)
    if "auto" in only:
        say("comm=auto tuned on 4 nodes, then timed beside the fixed algorithms ...")
        data["auto"] = auto_on_cluster(4, link, work)
        save(data)
    if "train" in only:
        data["train"] = []
        for p in train_nodes:
            for case in TRAIN_CASES:
                say(f"training on {p} nodes: {case.label} ...")
                data["train"].append(train_on_cluster(p, link, case, train_steps, work))
        save(data)
    data["conditions"]["load_after"] = os.getloadavg()[0]
    return data


# ---------------------------------------------------------------------- the simulator


def _simulate(row: dict, bandwidth: float, overhead: float) -> float:
    from lptrain.comm.algorithms import issue_order
    from lptrain.sim.dataflow import simulate_dataflow
    from lptrain.sim.predict import schedule_for
    from lptrain.sim.topology import oneport

    order = issue_order(row["algo"], row["op"])
    schedule = schedule_for(row["algo"], row["op"], row["nodes"], row["count"], 4, block_bytes=row["block"])
    topology = oneport(row["nodes"], bandwidth=bandwidth, latency=0.0, overhead=overhead, gamma=0.0)
    return simulate_dataflow(schedule, topology, max(1, row["segment"] // 4), order=order)


def calibrate(rows: list[dict]) -> tuple[float, float]:
    """Fit the port's rate B and the cost per message from the two-node rows alone (a grid
    search for the smallest median error), so that every row with more nodes is a
    prediction, not a fit."""
    fit_rows = [r for r in rows if r["nodes"] == 2 and r["algo"] in SCHEDULE_ALGOS]
    nominal = fit_rows[0]["link_nominal"]
    best = (math.inf, nominal, 0.0)
    for fraction in [0.86 + 0.01 * i for i in range(15)]:
        for overhead in [0.0, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3]:
            errors = [abs(_simulate(r, nominal * fraction, overhead) / (r["time_us"] / 1e6) - 1) for r in fit_rows]
            best = min(best, (statistics.median(errors), nominal * fraction, overhead))
    return best[1], best[2]


def predictions(rows: list[dict]) -> tuple[float, float, list[dict]]:
    schedule_rows = [r for r in rows if r["algo"] in SCHEDULE_ALGOS]
    bandwidth, overhead = calibrate(schedule_rows)
    out = []
    for r in schedule_rows:
        predicted = _simulate(r, bandwidth, overhead)
        measured = r["time_us"] / 1e6
        out.append({**r, "predicted_s": predicted, "error": predicted / measured - 1})
    return bandwidth, overhead, out


# ---------------------------------------------------------------------- tables


def _n_over_b(row: dict) -> float:
    return row["time_us"] / 1e6 / (row["size"] / row["link_nominal"])


def _size_label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def one_port_model(op: str, p: int) -> str:
    """The one-port model's multiples of n/B for the algorithms that bound each op."""
    be = 2 * (p - 1) / p
    if op == "allreduce":
        return f"ring/BE {be:.2f}, LP ~2"
    return f"LP 1, BE {be:.2f}, MST {math.ceil(math.log2(p))}"


def with_nominal(data: dict) -> list[dict]:
    nominal = data["conditions"]["link_bytes_per_s"]
    return [dict(r, link_nominal=nominal) for r in data.get("bench", [])]


def _column(algo: str, lp: str = "lp") -> str:
    """An algorithm's column heading: the backend's collective is "gloo's own"."""
    return {"gloo": "gloo's own", "lp": lp}.get(algo, algo)


def _cells(cell: dict[str, float]) -> list[str]:
    return [f"{cell[a]:.2f}" if a in cell else "-" for a in TABLE_ALGOS]


def bench_table(data: dict, size: int, nodes: tuple[int, ...] = (2, 4, 8)) -> list[str]:
    rows = with_nominal(data)
    body = []
    for op in OPS:
        for p in nodes:
            cell = {r["algo"]: _n_over_b(r) for r in rows if r["op"] == op and r["nodes"] == p and r["size"] == size}
            if cell:
                body.append([op, str(p), *_cells(cell), one_port_model(op, p)])
    header = ["op", "P", *(_column(a, lp="lp (block auto)") for a in TABLE_ALGOS), "one-port model"]
    return table(header, body)


def time_vs_p_table(data: dict, op: str, size: int) -> list[str]:
    rows = [r for r in with_nominal(data) if r["op"] == op and r["size"] == size]
    body = []
    for p in sorted({r["nodes"] for r in rows}):
        cell = {r["algo"]: _n_over_b(r) for r in rows if r["nodes"] == p}
        ratio = f"{cell['be'] / cell['lp']:.2f}" if "be" in cell and "lp" in cell else "-"
        body.append([str(p), *_cells(cell), ratio])
    return table(["P", *map(_column, TABLE_ALGOS), "BE / LP"], body)


def flatness(data: dict, algo: str, op: str, size: int) -> tuple[float, float]:
    times = [_n_over_b(r) for r in with_nominal(data) if r["algo"] == algo and r["op"] == op and r["size"] == size]
    return min(times), max(times)


def prediction_table(data: dict) -> tuple[list[str], dict]:
    bandwidth, overhead, rows = predictions(with_nominal(data))
    body = [
        [_size_label(r["size"]), r["op"], str(r["nodes"]), r["algo"], f"{r['time_us'] / 1e6:.3f}",
         f"{r['predicted_s']:.3f}", f"{r['error']:+.0%}"]
        for r in sorted(rows, key=lambda r: (r["size"], r["op"], r["nodes"], SCHEDULE_ALGOS.index(r["algo"])))
    ]  # fmt: skip
    lines = table(["size", "op", "P", "algo", "measured (s)", "predicted (s)", "error"], body)
    held_out = [abs(r["error"]) for r in rows if r["nodes"] != 2]
    by_p = {p: [abs(r["error"]) for r in rows if r["nodes"] == p] for p in sorted({r["nodes"] for r in rows}) if p != 2}
    summary = {"bandwidth": bandwidth, "overhead": overhead, "median": statistics.median(held_out),
               "max": max(held_out), "count": len(held_out),
               "by_p": {p: (statistics.median(e), max(e)) for p, e in by_p.items()},
               "slower": sum(r["error"] < 0 for r in rows if r["nodes"] != 2),
               "worst": max((r for r in rows if r["nodes"] != 2), key=lambda r: abs(r["error"]))}  # fmt: skip
    return lines, summary


def auto_table(data: dict) -> list[str]:
    auto = data["auto"]
    sizes = sorted({r["size"] for r in auto["rows"]})
    body = []
    for size in sizes:
        rows = {r["algo"]: r["time_us"] / 1e6 for r in auto["rows"] if r["size"] == size}
        fixed = {a: t for a, t in rows.items() if a != "auto"}
        best = min(fixed, key=fixed.get)
        ratio = rows["auto"] / fixed[best]
        body.append([_size_label(size), f"{rows['auto']:.3f}", f"{fixed[best]:.3f}", best, f"{ratio:.2f}"])
    return table(["size", "auto (s)", "best fixed (s)", "best fixed", "auto / best"], body)


def train_table(data: dict) -> list[str]:
    train = data["train"]
    nodes = sorted({t["nodes"] for t in train})
    body = []
    for case in TRAIN_CASES:
        cells = {t["nodes"]: t["comm_ms"] for t in train if t["case"] == case.label}
        body.append([case.label, *(f"{cells[p]:.0f}" if p in cells else "-" for p in nodes)])
    return table(["communication", *(f"P={p}" for p in nodes)], body)


def describe(data: dict) -> str:
    c = data["conditions"]
    loads = [r["load"] for r in data.get("bench", []) if "load" in r]
    load = f"load average {min(loads):.1f} to {max(loads):.1f} at the starts of the runs" if loads else ""
    if c.get("nice"):
        load += f" (the runs at nice {c['nice']}, ahead of the machine's other work)"
    check = fidelity_phrase(data)
    return (f"{c['link']} per port (B = {c['link_bytes_per_s'] / 1e6:.1f} MB/s one way), {c['machine']}, "
            f"{c.get('date', '?')}, {load or 'load average ' + format(c['load_before'], '.1f')}"
            + (f"; {check}" if check else ""))  # fmt: skip
