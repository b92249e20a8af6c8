"""Per-iteration statistics, shared by the run's summary and ``lptrain-report``.

A run writes one line per step to ``steps.jsonl``; the first step of each session (the
start, and the first step after a resume) carries one-off costs (allocations, plan
building, first-touch of the buffers) and is marked ``"warmup": true``. The means and
spreads of a run are over the other steps, the "timed" ones, so that the summary and the
report agree. Imports nothing heavy: the report reads runs without torch.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

# The one definition of the comm share, as the summary and the report state it.
COMM_SHARE = (
    "comm share: mean communication (comm_ms) over mean step (step_ms: compute + exposed communication"
    " + hand-off + update), both over the timed steps"
)
# Logged as the interval's last value rather than its mean.
LAST = ("lr", "comm_bytes")
# Rates: the interval's total work over its total time (a harmonic mean of the steps' rates).
RATES = ("images_per_s", "comm_GBps")


def timed(rows: Sequence[dict]) -> list[dict]:
    """The rows of timed steps (all of them if every row is a warm-up row, e.g. one step)."""
    kept = [r for r in rows if not r.get("warmup")]
    return kept or list(rows)


def mean_std(rows: Sequence[dict], key: str) -> tuple[float, float]:
    """Mean and population standard deviation of ``key`` over ``rows`` (nan when none)."""
    values = [float(r[key]) for r in rows if key in r]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.pstdev(values)


def comm_share(rows: Sequence[dict]) -> float:
    """The comm share of ``rows``: mean communication over mean step (``COMM_SHARE``)."""
    comm, step = mean_std(rows, "comm_ms")[0], mean_std(rows, "step_ms")[0]
    return comm / step if step else math.nan


def share_text(share: float) -> str:
    """How the summary and the report print a share: ``5.5%``."""
    return f"{100 * share:.1f}%"


def interval_mean(rows: Sequence[dict]) -> dict[str, float]:
    """One logged point for an interval of steps: means, last values, rates over the interval."""
    out: dict[str, float] = {}
    for key in rows[-1]:
        values = [float(r[key]) for r in rows if key in r and not isinstance(r[key], bool)]
        if not values:
            continue
        if key in LAST:
            out[key] = values[-1]
        elif key in RATES:
            out[key] = len(values) / sum(1 / v for v in values) if all(v > 0 for v in values) else math.nan
        else:
            out[key] = statistics.fmean(values)
    return out


def jsonl_rows(path: Path) -> tuple[list[dict], int]:
    """A JSON-lines file's rows, and how many lines could not be read (not UTF-8, not JSON,
    not an object): those are skipped, and a last line cut short by a crash is skipped
    without being counted."""
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    lines = data.splitlines()
    if lines and not data.endswith(b"\n"):
        try:
            json.loads(lines[-1].decode())
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            lines.pop()  # the write a crash interrupted
    rows, bad = [], 0
    for line in lines:
        try:
            row = json.loads(line.decode())  # UTF-8, as the run wrote it
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif line.strip():
            bad += 1
    return rows, bad


def read_jsonl(path: Path) -> list[dict]:
    """A JSON-lines file (``steps.jsonl``, ``metrics.jsonl``) as rows; lines that cannot be read are skipped."""
    return jsonl_rows(path)[0]


def keep_through(path: Path, step: int) -> None:
    """Drop lines logged after ``step`` (a resume continues from the checkpoint's step)."""
    if path.exists():
        kept = [row for row in read_jsonl(path) if row.get("step", step + 1) <= step]
        path.write_text("".join(json.dumps(row) + "\n" for row in kept))
