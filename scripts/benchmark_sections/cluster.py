"""cluster: the collectives on an emulated cluster (network namespaces, one shaped port per
node), where the link and not the CPU sets the time.

``scripts/cluster_results.py`` measures it (as root, about 45 minutes) and keeps its rows
in docs/data/cluster.json, which is this section's data: :func:`record` frames them as a
section's record."""

from __future__ import annotations

import json
import os

from benchmark_sections.common import size_label
from doctools import DOCS
from doctools import cluster_experiment as ex
from doctools.commands import Run

NAME = "cluster"
HEADING = "Across namespaces with shaped links: where the network is the bottleneck"
QUESTION = (
    "The collectives on an emulated cluster (network namespaces, one shaped port per node), where the link "
    "and not the CPU sets the time."
)
MINUTES = 45
DEFAULT = False  # root, and three quarters of an hour
DATA = DOCS / "data" / "cluster.json"


def measure(run: Run) -> dict:
    if os.geteuid() != 0:
        raise RuntimeError("the cluster section needs root (network namespaces): run it as root")
    run("python scripts/cluster_results.py")
    return json.loads(DATA.read_text())


def record(data: dict) -> dict:
    """docs/data/cluster.json as a section's record: the date, machine and commands of its run."""
    c = data["conditions"]
    nodes = sorted({r["nodes"] for r in data.get("bench", [])})
    ran = {"nccl" if r["algo"] == "gloo" else r["algo"] for r in data.get("bench", [])}  # rows name nccl by backend
    algos = ",".join(a for a in ex.BENCH_ALGOS if a in ran)
    each = (
        f"lptrain-cluster --nodes P --link {c['link']} -- lptrain-bench --op all -b 4M -e 16M "
        f"--algo {algos} -n 1 --trials 3"
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


def render(data: dict) -> list[str]:
    c = data["conditions"]
    nodes = tuple(p for p in (2, 4, 8) if p in {r["nodes"] for r in data["bench"]})
    cell = {(r["op"], r["nodes"], r["algo"]): ex._n_over_b(r) for r in ex.with_nominal(data) if r["size"] == ex.BIG}
    checked = [r for r in data["bench"] if r.get("wrong") is not None]
    wrong = sum(1 for r in checked if r["wrong"])
    top = nodes[-1]
    loads = [r["load"] for r in data["bench"] if "load" in r]
    load = f"load average {min(loads):.1f} to {max(loads):.1f} at the runs' starts" if loads else "load not recorded"
    if c.get("nice"):
        load += f", the runs at nice {c['nice']} (ahead of the machine's other work)"
    reading = []
    for op in ex.OPS:
        lp = ", ".join(f"{cell[(op, p, 'lp')]:.2f}" for p in nodes if (op, p, "lp") in cell)
        others = {a: cell[(op, top, a)] for a in ex.TABLE_ALGOS if a != "lp" and (op, top, a) in cell}
        best = min(others, key=others.get)
        name = "gloo's own" if best == "gloo" else best
        reading.append(
            f"- {op}: LP {lp} n/B at P = {', '.join(map(str, nodes))}; at P = {top} the fastest other is {name} at "
            f"{others[best]:.2f}."
        )
    check = ex.fidelity_phrase(data)
    if check:  # rows measured with the fidelity check, on links of MTU 9000
        load += f"; {check}"
        floor = "TCP's payload is 99.3% of the shaped rate at MTU 9000, so 1.01 is the floor in practice"
    else:
        floor = "TCP's payload is about 95% of the shaped rate, so 1.05 is the floor in practice"
    return [
        f"Every node a network namespace with one full-duplex port shaped to {c['link']} (B = "
        f"{c['link_bytes_per_s'] / 1e6:.1f} MB/s one way), one process per node over gloo; {load}. "
        f"Medians of 3 trials; {len(checked) - wrong} of {len(checked)} results checked correct (#wrong 0). Times "
        f"are multiples of n/B at {ex._size_label(ex.BIG)}: n/B is one port's physical limit for a broadcast; "
        f"{floor}. The one-port model gives each algorithm's bound.",
        "",
        *ex.bench_table(data, ex.BIG, nodes),
        "",
        *reading,
        "- A node has one port, so LP's allreduce (a reduce and a broadcast overlapped) sends about 2n through it "
        "where the ring sends 2(P-1)/P n: the model's LP ~2 against ring/BE's 1.5 to 1.75.",
    ]


def headline(data: dict) -> list[str] | None:
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
