"""inprocess: the in-process executor's schedules on CPU devices, against memcpy.

On CPU every link is a memory copy, so the machine's copy bandwidth is the limit each
schedule is held to; a small message shows the executor's dispatch cost."""

from __future__ import annotations

from benchmark_sections.common import bench_rows, present, size_label, wrong_sentence
from doctools.commands import Run
from doctools.markdown import table
from lptrain.comm.algorithms import WITH_VARIANTS

NAME = "inprocess"
HEADING = "In-process collectives against memcpy"
QUESTION = (
    "The schedules on CPU devices in one process: what the executor costs against the machine's copy "
    "bandwidth, and a small message's latency."
)
MINUTES = 5
DEFAULT = True
OPS = ("allreduce", "broadcast", "reduce")


def measure(run: Run) -> dict:
    rows = []
    for p in (4, 8):
        algos = ",".join(WITH_VARIANTS)
        run(
            f"lptrain-bench --op all --algo {algos} --devices 'cpu*{p}' -b 1K -e 64M -f 256 --trials 3 --json c{p}.json"
        )
        rows += bench_rows(run.json(f"c{p}.json"))
    return {"rows": rows}


def render(r: dict) -> list[str]:
    rows = r["rows"]
    algos = present(WITH_VARIANTS, rows)
    big, small = max(x["size"] for x in rows), min(x["size"] for x in rows)
    cell = {(x["devices"], x["op"], x["size"], x["algo"]): x for x in rows}
    keys = sorted({(x["devices"], x["op"]) for x in rows}, key=lambda k: (k[0], OPS.index(k[1])))
    big_rows, small_rows = [], []
    for p, op in keys:
        memcpy = cell[(p, op, big, "memcpy")]
        big_rows.append(
            [str(p), op, f"{memcpy['moved']:.1f}"]
            + [f"{cell[(p, op, big, a)]['moved']:.1f} ({cell[(p, op, big, a)]['vs_memcpy']:.2f})" for a in algos]
        )
        small_rows.append([str(p), op] + [f"{cell[(p, op, small, a)]['time_us']:.1f}" for a in algos])
    ratios = [(x["vs_memcpy"], x) for x in rows if x["size"] == big and x["algo"] in algos]
    low, high = min(ratios, key=lambda t: t[0]), max(ratios, key=lambda t: t[0])
    lp = {p: cell[(p, "allreduce", big, "lp")]["vs_memcpy"] for p in sorted({k[0] for k in keys})}
    fast = {p: min(algos, key=lambda a: cell[(p, "allreduce", small, a)]["time_us"]) for p in lp}
    slow = {p: max(algos, key=lambda a: cell[(p, "allreduce", small, a)]["time_us"]) for p in lp}
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
        *table(["P", "op", "memcpy GB/s", *algos], big_rows),
        "",
        f"{size_label(small)} messages, microseconds per call:",
        "",
        *table(["P", "op", *algos], small_rows),
        "",
        *reading,
    ]


def headline(r: dict) -> list[str] | None:
    big = max(x["size"] for x in r["rows"])
    lp = next(x for x in r["rows"] if (x["devices"], x["op"], x["size"], x["algo"]) == (4, "allreduce", big, "lp"))
    return [
        f"LP allreduce in one process, 4 CPU devices, {size_label(big)}",
        f"{lp['vs_memcpy']:.2f}x memcpy's bandwidth",
    ]
