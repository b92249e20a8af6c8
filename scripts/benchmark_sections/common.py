"""What several sections' tables share: the benchmark's rows as saved, size labels, the
spread of repeated rounds, medians with their range, and the sentence on the results' checks."""

from __future__ import annotations

import statistics

# The columns of lptrain-bench's JSON rows a section keeps (the rest is recomputed or unused).
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
    """lptrain-bench's rows with the :data:`KEEP` columns only (a missing one as None)."""
    return [{k: r.get(k) for k in KEEP} for r in rows]


def size_label(nbytes: int) -> str:
    """``64M``, ``1K``: the benchmark's own way of writing a size (bytes when not a round unit)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def spread(times: list[float]) -> float:
    """How far apart the rounds of one variant were: slowest / fastest - 1."""
    return max(times) / min(times) - 1 if len(times) > 1 else 0.0


def median_range(values: list[float]) -> str:
    """``0.93x (0.85-1.02)``: the median of per-round ratios and, in brackets, the lowest and
    highest round (the median alone where there was one round)."""
    middle = f"{statistics.median(values):.2f}x"
    return middle if len(values) < 2 else f"{middle} ({min(values):.2f}-{max(values):.2f})"


def wrong_sentence(rows: list[dict]) -> str:
    """The sentence that says whether every timed result was checked correct (``#wrong`` 0)."""
    checked = [r for r in rows if r.get("wrong") is not None]
    bad = [r for r in checked if r["wrong"]]
    if not bad:
        return f"Every result was checked before it was timed: `#wrong` was 0 in all {len(checked)} rows."
    return f"`#wrong` was not 0 in {len(bad)} of {len(checked)} rows: " + ", ".join(
        f"{r['algo']} {r['op']} {size_label(r['size'])}" for r in bad
    )


def present(names: tuple[str, ...], rows: list[dict]) -> list[str]:
    """The ``names`` that some row measured, in their order: a table shows what its data
    holds, so a record saved before an algorithm was added still renders as it was."""
    seen = {r["algo"] for r in rows}
    return [n for n in names if n in seen]
