"""What a run of the benchmark measures, the same in one process and across processes: the
dtypes ``-d`` names, the check's inputs, the labelled communicators that ``--algo``,
``--lp-block`` and ``--reduce-kernel`` ask for, and, back from the measured rows, the
tuning file ``--save-tuning`` writes for comm=auto.
"""

from __future__ import annotations

import torch

from lptrain.bench.table import Row
from lptrain.comm.algorithms import SCHEDULES, VARIANTS, module_of, resolve
from lptrain.communicators import NAMES


def parse_algos(text: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The names ``--algo`` lists, each checked: lptrain's communicators, their variants,
    ``mpi``, and the ``extra`` names a run also knows (across processes, the backend's own)."""
    valid = [*NAMES, *VARIANTS, "mpi", *extra]  # NAMES includes nccl and auto
    algos = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in algos if a not in valid]
    if bad or not algos:
        raise ValueError(
            f"unknown algorithm(s) {', '.join(bad) or '(none)'}; valid: {', '.join(valid)} "
            "(lp-rb is lp with the reduce-then-broadcast allreduce)"
        )
    return algos


DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
}


def pattern(rank: int, count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Small integers, exact in every dtype, different on every rank."""
    i = torch.arange(count, device=device)
    return (((rank + 1) * (i % 13 + 1)) % 7 - 3).to(dtype)


def algo_variants(wanted: list[str], args) -> dict[str, tuple[str, dict]]:
    """Row label -> (communicator name, options) for the algorithms asked for.

    ``--lp-block`` may list several sizes (``256K,1M,4M``): lp and lp-rb then get one row
    per block (``lp@1M``), which is how a tuning grid learns LP's best block here. ``auto``
    reads ``--tuning`` (or lets the simulator choose)."""
    blocks = [b.strip() for b in str(args.lp_block).split(",") if b.strip()] or ["auto"]
    variants: dict[str, tuple[str, dict]] = {}
    for algo in wanted:
        base, preset = resolve(algo)  # lp-rb: lp with its reduce-then-broadcast allreduce
        if base == "lp":  # --lp-block and --lp-allreduce, under the variant's own presets
            for block in blocks:
                label = algo if len(blocks) == 1 else f"{algo}@{block}"
                variants[label] = ("lp", {"block_size": block, "allreduce": args.lp_allreduce, **preset})
        elif algo == "auto":
            chosen_from = {k: getattr(args, k, None) for k in ("tuning", "topology")}
            variants[algo] = ("auto", {k: v for k, v in chosen_from.items() if v})
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
        if name not in SCHEDULES:
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

    from lptrain.auto.tuning import TuningTable

    entries = []
    for row in rows:
        if row.algo in ("gloo", "nccl"):
            name, options = "nccl", {}
        elif row.algo in variants and variants[row.algo][0] != "auto":
            name, options = variants[row.algo]
        else:
            continue
        defaults = module_of(name).OPTIONS.defaults if name in SCHEDULES else {}
        kept = {k: v for k, v in options.items() if k not in defaults or v != defaults[k]}  # what the row chose
        entries.append({"op": row.op, "bytes": row.size, "algo": name, "options": kept, "time_us": row.time_us})
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "command": "lptrain-bench"}
    table = TuningTable(executor, device_type, world_size, dtype, entries, meta)
    table.save(path)
    return len(entries)
