"""auto: whether the algorithm comm=auto picks from this machine's tuning file is as fast
as the best fixed one, measured again in a second run; the tuning file measured here
becomes the machine's own, docs/tuning/cpu4-allreduce.json."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmark_sections.common import bench_rows, size_label
from doctools import DOCS
from doctools.commands import Run
from doctools.markdown import table
from lptrain.comm.algorithms import VARIANTS, WITH_VARIANTS

NAME = "auto"
HEADING = "comm=auto against the fixed algorithms"
QUESTION = (
    "Whether the algorithm comm=auto picks from this machine's tuning file is as fast as the best fixed "
    "one, measured again."
)
MINUTES = 2
DEFAULT = True
TUNING = DOCS / "tuning" / "cpu4-allreduce.json"
GRID = "--op allreduce --algo {} --lp-block auto,1M --devices 4 -b 1K -e 64M -f 4"


def measure(run: Run) -> dict:
    grid, check = GRID.format(",".join(WITH_VARIANTS)), GRID.format(",".join((*WITH_VARIANTS, "auto")))
    run(f"lptrain-bench {grid} --trials 9 --target-time 0.5 --save-tuning cpu4-allreduce.json --quiet --json grid.json")
    run(f"lptrain-bench {check} --tuning cpu4-allreduce.json --trials 15 --target-time 1.0 --json check.json")
    return {"tuning": run.json("cpu4-allreduce.json"), "rows": bench_rows(run.json("check.json"))}


def after(work: Path) -> None:
    """The tuning file this section measured becomes the machine's own, in docs/tuning/."""
    shutil.copyfile(work / "cpu4-allreduce.json", TUNING)


def tuning_label(row: dict) -> str:
    """A tuning file's row as the benchmark names the same candidate (``lp-rb@1M``, ``mst``):
    a variant (lptrain.comm.algorithms.VARIANTS) where the row's options are the variant's,
    and lp with the block it ran."""
    options = row.get("options") or {}
    variant = (v for v, (base, fixed) in VARIANTS.items() if base == row["algo"] and fixed.items() <= options.items())
    algo = next(variant, row["algo"])
    return f"{algo}@{options.get('block_size', 'auto')}" if row["algo"] == "lp" else algo


def auto_rows(r: dict) -> list[dict]:
    """Per size: the best fixed algorithm, auto's time, and the candidate the file chose."""
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


def render(r: dict) -> list[str]:
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


def headline(r: dict) -> list[str] | None:
    ratio = [x["auto_us"] / x["best_us"] for x in auto_rows(r)]
    return [
        "comm=auto against the best fixed algorithm, 4 CPU devices, 1K to 64M",
        f"{min(ratio):.2f}x to {max(ratio):.2f}x the best's time",
    ]
