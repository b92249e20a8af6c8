"""What the benchmarks share: the table's rows and their format, nccl-tests' bus factors,
the message-size ranges, the check pattern and the timed call.

``lptrain.bench`` (in one process) and ``lptrain.bench_dist`` (under torchrun or mpirun)
both use it, and ``lptrain-sim`` prints its predictions in the same rows; neither bench
module imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.comm.sizes import format_size

OPS = ("allreduce", "broadcast", "reduce")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
}


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw factor: how much of the message each rank's busiest link carries."""
    return 2 * (world_size - 1) / world_size if op == "allreduce" else 1.0


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


def message_sizes(begin: int, end: int, factor: int) -> list[int]:
    if begin < 1:
        raise ValueError(f"-b (min bytes) must be at least 1, got {begin}")
    if end < begin:
        raise ValueError(f"the size range is empty: -b {begin} is above -e {end}")
    if factor < 2:
        raise ValueError(f"-f (step factor) must be at least 2, got {factor}")
    sizes, s = [], begin
    while s <= end:
        sizes.append(s)
        s *= factor
    return sizes


def pattern(rank: int, count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Small integers, exact in every dtype, different on every rank."""
    i = torch.arange(count, device=device)
    return (((rank + 1) * (i % 13 + 1)) % 7 - 3).to(dtype)


def collective_call(comm, op: str, tensors, root: int):
    """A no-argument call of ``op`` for the timer: any communicator (in-process, distributed,
    MPI) with ``allreduce``, ``reduce`` and ``broadcast``, on its tensors or its one tensor."""
    if op == "allreduce":
        return lambda: comm.allreduce(tensors)
    if op == "reduce":
        return lambda: comm.reduce(tensors, root=root)
    return lambda: comm.broadcast(tensors, root=root)


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
            f" {_bandwidth(row.algbw)} {_bandwidth(row.busbw)} {moved} {vs} {wrong}",
            file=out,
            flush=True,
        )
    return row


def algo_variants(wanted: list[str], args) -> dict[str, tuple[str, dict]]:
    """Row label -> (communicator name, options) for the algorithms asked for.

    ``--lp-block`` may list several sizes (``256K,1M,4M``): lp and lp-rb then get one row
    per block (``lp@1M``), which is how a tuning grid learns LP's best block here. ``auto``
    reads ``--tuning`` (or lets the simulator choose)."""
    blocks = [b.strip() for b in str(args.lp_block).split(",") if b.strip()] or ["auto"]
    variants: dict[str, tuple[str, dict]] = {}
    for algo in wanted:
        if algo in ("lp", "lp-rb"):
            mode = "reduce_broadcast" if algo == "lp-rb" else args.lp_allreduce
            for block in blocks:
                label = algo if len(blocks) == 1 else f"{algo}@{block}"
                variants[label] = ("lp", {"block_size": block, "allreduce": mode})
        elif algo == "auto":
            variants[algo] = ("auto", {"tuning": args.tuning} if getattr(args, "tuning", None) else {})
        else:
            variants[algo] = (algo, {})
    return _with_reduce_kernels(variants, getattr(args, "reduce_kernel", None))


def _with_reduce_kernels(variants: dict[str, tuple[str, dict]], spec: str | None) -> dict[str, tuple[str, dict]]:
    """``--reduce-kernel peer,staged``: each schedule's row once per reduction path."""
    if not spec:
        return variants
    from lptrain.comm.peer_kernel import check_reduce_kernel

    kernels = [check_reduce_kernel(k.strip()) for k in spec.split(",") if k.strip()]
    out: dict[str, tuple[str, dict]] = {}
    for label, (name, options) in variants.items():
        if name not in ("lp", "mst", "be", "ring"):
            out[label] = (name, options)
            continue
        for kernel in kernels:
            out[label if len(kernels) == 1 else f"{label}/{kernel}"] = (name, {**options, "reduce_kernel": kernel})
    return out


def save_tuning(
    path: str,
    rows: list[Row],
    variants: dict[str, tuple[str, dict]],
    *,
    executor: str,
    device_type: str,
    world_size: int,
    dtype: str,
) -> int:
    """Write the measured rows as a tuning file for comm=auto; the number of rows written.

    Only the fixed algorithms go in (not memcpy, mpi or auto); the backend's own collective
    (labelled gloo or nccl across processes) is the ``nccl`` communicator."""
    import datetime
    import platform

    from lptrain.comm.tuning import TuningTable

    entries = []
    for row in rows:
        if row.algo in ("gloo", "nccl"):
            name, options = "nccl", {}
        elif row.algo in variants and variants[row.algo][0] != "auto":
            name, options = variants[row.algo]
        else:
            continue
        kept = {k: v for k, v in options.items() if not (k == "allreduce" and v == "overlapped")}
        if kept.get("block_size") == "auto":
            del kept["block_size"]
        entries.append({"op": row.op, "bytes": row.size, "algo": name, "options": kept, "time_us": row.time_us})
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "command": "lptrain-bench"}
    table = TuningTable(executor, device_type, world_size, dtype, entries, meta)
    table.save(path)
    return len(entries)
