"""Tuning files: which algorithm (and LP block) is fastest here, per operation and size.

MPI implementations pick an algorithm per (operation, message size, ranks) from decision
tables, NCCL from a tuner; lptrain builds its table from this machine's own measurements.
``lptrain-bench --save-tuning FILE`` measures a grid and writes it; ``comm=auto`` reads it.

A tuning file is JSON::

    {"lptrain_tuning": 1, "executor": "in-process" | "distributed", "device_type": "cpu" | "cuda",
     "world_size": 4, "dtype": "float32", "date": "...", "machine": "...",
     "rows": [{"op": "allreduce", "bytes": 1048576, "algo": "ring", "options": {}, "time_us": 812.0}, ...]}

``choose`` answers at a measured size with the fastest measurement; between two measured
sizes it interpolates each candidate's time (log-log, between its two neighbours) and
takes the fastest; outside the measured range, or for an operation the grid does not
cover, it has no answer and the caller falls back to the simulator.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lptrain.comm.algorithms import SCHEDULES, check_options, variant_of
from lptrain.comm.algorithms.order import format_order, is_identity
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.sizes import format_size

FORMAT = 1
EXECUTORS = ("in-process", "distributed")
CANDIDATES = (*SCHEDULES, "nccl")


@dataclass(frozen=True)
class Choice:
    """What to run for one (op, size): a communicator name, its options, and why."""

    algo: str
    options: dict[str, Any]
    source: str  # "measured", "interpolated" or "simulated"
    detail: str  # the figures the choice was made from

    @property
    def summary(self) -> str:
        """``lp block=auto order=0-2-1-3``: every setting that was chosen, for a table's row."""
        block = self.options.get("block_size")
        order = self.options.get("order")
        text = variant_of(self.algo, self.options) + (f" block={block}" if "block_size" in self.options else "")
        return text + f" order={'natural' if order is None or is_identity(order) else format_order(order)}"

    @property
    def label(self) -> str:
        """``lp (block 65536) order 0-2-1-3``: the algorithm, a fixed block, an order other than 0..P-1."""
        block = self.options.get("block_size")
        order = self.options.get("order")
        text = variant_of(self.algo, self.options) + (f" (block {block})" if block not in (None, "auto") else "")
        return text + (f" order {format_order(order)}" if order is not None and not is_identity(order) else "")


@dataclass
class TuningTable:
    executor: str
    device_type: str
    world_size: int
    dtype: str
    rows: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    # -- reading and writing ------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> TuningTable:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CollectiveInputError(
                f"tuning file {str(path)!r} does not exist; write one with lptrain-bench --save-tuning FILE"
            ) from None
        except (OSError, ValueError) as err:
            raise CollectiveInputError(f"tuning file {str(path)!r} is not readable JSON: {err}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, path: str | None = None) -> TuningTable:
        where = f"tuning file {path!r}" if path else "tuning data"
        if not isinstance(data, dict) or data.get("lptrain_tuning") != FORMAT:
            raise CollectiveInputError(f"{where} is not an lptrain tuning file (format {FORMAT})")
        for key in ("executor", "device_type", "world_size", "dtype", "rows"):
            if key not in data:
                raise CollectiveInputError(f"{where} has no {key!r}")
        if data["executor"] not in EXECUTORS:
            raise CollectiveInputError(f"{where}: executor {data['executor']!r} is not one of {', '.join(EXECUTORS)}")
        world = data["world_size"]
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise CollectiveInputError(f"{where}: world_size={world!r} is not valid; use a whole number of ranks >= 1")
        if not isinstance(data["rows"], list):
            raise CollectiveInputError(
                f"{where}: rows must be a list of measurements, got {type(data['rows']).__name__}"
            )
        if not data["rows"]:
            raise CollectiveInputError(
                f"{where} has no rows: nothing was measured; write it again with lptrain-bench --save-tuning FILE "
                "or leave comm.options.tuning null to let the simulator choose"
            )
        rows = []
        for i, row in enumerate(data["rows"]):
            try:
                op, nbytes, algo, time_us = row["op"], int(row["bytes"]), row["algo"], float(row["time_us"])
            except (KeyError, TypeError, ValueError):
                raise CollectiveInputError(f"{where}: row {i} needs op, bytes, algo and time_us, got {row!r}") from None
            if algo not in CANDIDATES:
                raise CollectiveInputError(f"{where}: row {i} names algorithm {algo!r}; valid: {', '.join(CANDIDATES)}")
            if nbytes < 1 or not 0 < time_us < math.inf:
                raise CollectiveInputError(f"{where}: row {i} needs bytes >= 1 and a finite time_us > 0, got {row!r}")
            options = _checked_options(where, i, algo, row.get("options"), world)
            rows.append({"op": op, "bytes": nbytes, "algo": algo, "options": options, "time_us": time_us})
        meta = {k: v for k, v in data.items() if k not in ("rows",)}
        return cls(data["executor"], data["device_type"], world, data["dtype"], rows, meta, path)

    def to_dict(self) -> dict[str, Any]:
        head = {
            **self.meta,
            "lptrain_tuning": FORMAT,
            "executor": self.executor,
            "device_type": self.device_type,
            "world_size": self.world_size,
            "dtype": self.dtype,
        }
        return {**head, "rows": self.rows}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    # -- choosing -------------------------------------------------------------------------------
    def fits(self, executor: str, device_type: str, world_size: int) -> str | None:
        """Why this table does not describe that setting, or None when it does."""
        if (self.executor, self.device_type, self.world_size) != (executor, device_type, world_size):
            return (
                f"it was measured for {self.executor}, {self.device_type}, {self.world_size} ranks, not "
                f"{executor}, {device_type}, {world_size}"
            )
        return None

    def _curves(self, op: str) -> dict[tuple, dict[int, float]]:
        curves: dict[tuple, dict[int, float]] = {}
        for row in self.rows:
            if row["op"] == op:
                key = (row["algo"], tuple(sorted(row["options"].items())))
                curves.setdefault(key, {})[row["bytes"]] = row["time_us"]
        return curves

    def choose(self, op: str, nbytes: int) -> Choice | None:
        """The fastest candidate for ``op`` on ``nbytes`` by the measurements, or None."""
        curves = self._curves(op)
        estimates: dict[tuple, float] = {}
        exact = True
        for key, points in curves.items():
            sizes = sorted(points)
            if nbytes in points:
                estimates[key] = points[nbytes]
            elif sizes[0] < nbytes < sizes[-1]:
                exact = False
                hi = next(s for s in sizes if s > nbytes)
                lo = max(s for s in sizes if s < nbytes)
                w = (math.log(nbytes) - math.log(lo)) / (math.log(hi) - math.log(lo))
                estimates[key] = math.exp((1 - w) * math.log(points[lo]) + w * math.log(points[hi]))
        if not estimates:
            return None
        ranked = sorted(estimates.items(), key=lambda kv: kv[1])
        (algo, options), best = ranked[0]
        others = ", ".join(f"{_label(k)} {t:.0f}" for k, t in ranked[1:4])
        detail = f"{format_size(nbytes)} {op}: {_label(ranked[0][0])} {best:.0f} us" + (f"; {others}" if others else "")
        return Choice(algo, dict(options), "measured" if exact else "interpolated", detail)


def _checked_options(where: str, i: int, algo: str, options: Any, world_size: int) -> dict[str, Any]:
    """Row ``i``'s options as given, refused here (naming the file and the row) when the
    algorithm would refuse them: a bad block found only when comm=auto chose that row
    would end a run that had already started."""
    if options is not None and not isinstance(options, dict):
        raise CollectiveInputError(f"{where}: row {i} options must be a mapping, got {options!r}")
    options = dict(options or {})
    if algo in SCHEDULES:
        try:
            check_options(algo, world_size, options)
        except (CollectiveInputError, ValueError) as err:
            raise CollectiveInputError(f"{where}: row {i} ({algo} {options}): {err}") from None
    elif options:
        raise CollectiveInputError(f"{where}: row {i} gives {algo} options {options}; it takes none")
    return options


def _label(key: tuple) -> str:
    algo, options = key
    opts = dict(options)
    block = opts.get("block_size")
    return variant_of(algo, opts) + (f"@{block}" if block not in (None, "auto") else "")
