"""The benchmark's rows: one per message size and algorithm, printed as a table in
nccl-tests' layout (with ``moved``, ``vs_memcpy`` and ``#wrong`` beside it) and written as
JSON for ``--json``.

Both measurements (``lptrain.bench.inprocess`` and ``lptrain.bench.distributed``) print
their rows here, so the two tables read alike.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from lptrain.comm.sizes import format_size


@dataclass
class Row:
    op: str
    size: int
    count: int
    dtype: str
    algo: str
    devices: int
    time_us: float
    algbw: float
    busbw: float
    moved: float | None
    vs_memcpy: float | None
    wrong: int | None
    segment: int | None = None  # across processes: bytes per message of the schedules
    block: int | None = None  # lp's block in bytes
    link_alpha_s: float | None = None  # the transport as measured (segments and lp's blocks follow it)
    link_bytes_per_s: float | None = None
    chose: str | None = None  # auto: what it ran (algorithm, block, order)
    link_port_bytes_per_s: float | None = None  # a port's rate where it stood apart (sends are paced at it)


def print_header(
    out, op: str, p: int, device: str, dtype: str, reference: str = "memcpy = one copy_ of the same bytes"
):
    if out is None:
        return
    print(
        f"# lptrain-bench {op}: {p} x {device}, {dtype}, op sum; {reference}; times are medians of round-robin trials",
        file=out,
    )
    print(
        f"#{'size':>9} {'count':>11} {'type':>8} {'algo':>7} {'time(us)':>11} {'algbw':>7} {'busbw':>7}"
        f" {'moved':>7} {'vs_memcpy':>9} {'#wrong':>6}",
        file=out,
    )
    print(
        f"#{'(B)':>9} {'(elements)':>11} {'':>8} {'':>7} {'':>11} {'(GB/s)':>7} {'(GB/s)':>7} {'(GB/s)':>7}",
        file=out,
        flush=True,
    )


def _bandwidth(gb_per_s: float) -> str:
    """GB/s in 7 characters: two decimals, or three significant digits below 0.1 (slow links)."""
    return f"{gb_per_s:7.2f}" if gb_per_s >= 0.1 or gb_per_s == 0 else f"{gb_per_s:7.3g}"


def print_row(out, row: Row) -> Row:
    if out is not None:
        moved = _bandwidth(row.moved) if row.moved is not None else f"{'-':>7}"
        vs = f"{row.vs_memcpy:9.2f}" if row.vs_memcpy is not None else f"{'-':>9}"
        wrong = f"{row.wrong:6d}" if row.wrong is not None else f"{'-':>6}"
        print(
            f" {format_size(row.size):>9} {row.count:>11} {row.dtype:>8} {row.algo:>7} {row.time_us:11.1f}"
            f" {_bandwidth(row.algbw)} {_bandwidth(row.busbw)} {moved} {vs} {wrong}"
            + (f"  {row.algo}: {row.chose}" if row.chose else ""),
            file=out,
            flush=True,
        )
    return row


def write_json(path: str, rows: list[Row]) -> None:
    """``--json FILE``: every row with every field, in the order measured."""
    with open(path, "w") as f:
        json.dump([asdict(r) for r in rows], f, indent=1)
