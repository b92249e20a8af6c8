"""``lptrain-report``: a sweep's runs ranked by communication time, with the figures to read it.

lptrain -m +recipe=alexnet comm=lp,mst,be,ring
lptrain-report multirun/2026-12-02/14-00-00        # table on stdout, report.png beside it

Each run is read from what it wrote: ``steps.jsonl`` (every step's times; the means and
spreads are over the timed steps, as in the run's own summary), ``metrics.jsonl`` (eval
accuracy, bytes per step), ``config.yaml`` and ``overrides.yaml`` (a run's label is every
override that differs between the runs: the swept ones). A run that failed (its folder
holds ``failed.json``: the one-line error and the exit code) is listed last, marked FAILED;
one that wrote neither ``summary.json`` nor ``failed.json`` (still running, or killed) is
marked UNFINISHED. A file that cannot be read (not UTF-8, not YAML or JSON, cut short)
marks its run BAD FILE and is named in one line under the table; the run is listed with
what its other files hold. Imports no Hydra, and torch only to read LP block sizes when
they were swept.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lptrain.exits import quiet_on_closed_pipe
from lptrain.train.stepstats import COMM_SHARE, comm_share, jsonl_rows, mean_std, share_text, timed

UNFINISHED = "UNFINISHED"  # the marker of a run with no summary.json and no failed.json

# Swept keys that make a numeric axis for "communication time against ..." (first found wins).
AXES = (
    ("trainer.devices", "replicas"),
    ("comm.options.block_size", "LP block size (bytes)"),
    ("trainer.bucket_mb", "bucket size (MiB)"),
)


@dataclass
class RunRecord:
    path: Path
    config: dict
    overrides: dict[str, str]
    steps: int
    timed_steps: int
    comm_ms: tuple[float, float]  # mean, standard deviation over the timed steps
    compute_ms: tuple[float, float]
    comm_share: float  # stepstats.comm_share of the timed steps: the summary's figure
    bytes_per_step: float | None
    final_eval_accuracy: float | None
    loss: list[tuple[int, float]] = field(default_factory=list)
    label: str = ""
    failed: str | None = None  # the failed run's one-line error (failed.json)
    finished: bool = True  # it wrote summary.json (or failed.json): not still running, not killed
    problems: list[str] = field(default_factory=list)  # one line per file that could not be read

    def get(self, dotted: str, default=None):
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def find_runs(root: Path) -> list[Path]:
    """Run folders under ``root``: those holding a ``steps.jsonl`` or a ``failed.json``."""
    return sorted({p.parent for name in ("steps.jsonl", "failed.json") for p in root.rglob(name)})


def _failure(run_dir: Path, problems: list[str]) -> str | None:
    path = run_dir / "failed.json"
    if not path.exists():
        return None
    try:
        said = json.loads(path.read_bytes().decode())
        return f"{said.get('error', 'failed')} (exit code {said.get('exit_code', '?')})"
    except (OSError, ValueError, AttributeError) as err:
        problems.append(f"{path}: not valid JSON ({_reason(err)})")
        return "failed (failed.json unreadable)"


def _reason(err: BaseException) -> str:
    """An error's first line, short enough for one line of the report."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _yaml(path: Path, kind: type, problems: list[str]):
    """``path`` as YAML of type ``kind`` (None when absent); a file that cannot be read is a
    line in ``problems`` and reads as absent."""
    import yaml

    if not path.exists():
        return None
    try:
        value = yaml.safe_load(path.read_bytes().decode())
    except (OSError, ValueError, yaml.YAMLError) as err:  # ValueError: UnicodeDecodeError
        problems.append(f"{path}: not valid YAML ({_reason(err)})")
        return None
    if value is not None and not isinstance(value, kind):
        problems.append(f"{path}: not a {'mapping' if kind is dict else 'list'} ({type(value).__name__})")
        return None
    return value


def _jsonl(path: Path, problems: list[str]) -> list[dict]:
    """Rows with a step number; lines that cannot be read are skipped and counted in one line."""
    try:
        rows, bad = jsonl_rows(path)
    except OSError as err:
        problems.append(f"{path}: unreadable ({_reason(err)})")
        return []
    kept = [r for r in rows if isinstance(r.get("step"), int) and all(isinstance(v, (int, float)) for v in r.values())]
    bad += len(rows) - len(kept)
    if bad:
        which = "line that is not a UTF-8 JSON row" if bad == 1 else "lines that are not UTF-8 JSON rows"
        problems.append(f"{path}: {bad} {which} with a step, skipped")
    return kept


def _finished(run_dir: Path, problems: list[str]) -> bool:
    """Whether the run wrote its summary.json (at its end, also after a Ctrl-C) and it reads."""
    path = run_dir / "summary.json"
    if not path.exists():
        return False
    try:
        summary = json.loads(path.read_bytes().decode())
    except (OSError, ValueError) as err:
        problems.append(f"{path}: not valid JSON ({_reason(err)})")
        return False
    if not isinstance(summary, dict):
        problems.append(f"{path}: not a JSON object ({type(summary).__name__})")
        return False
    return True


def read_run(run_dir: Path) -> RunRecord:
    """One run as its files say; a file that cannot be read is one line in ``problems``
    (the run is still listed, with what the other files hold)."""
    problems: list[str] = []
    config = _yaml(run_dir / "config.yaml", dict, problems) or _yaml(run_dir / ".hydra" / "config.yaml", dict, problems)
    listed = _yaml(run_dir / "overrides.yaml", list, problems)
    listed = listed or _yaml(run_dir / ".hydra" / "overrides.yaml", list, problems) or []
    overrides = dict(str(o).lstrip("+~").split("=", 1) for o in listed if "=" in str(o))
    rows = _jsonl(run_dir / "steps.jsonl", problems)
    kept = timed(rows)
    metrics = _jsonl(run_dir / "metrics.jsonl", problems)
    evals = [m["eval_accuracy"] for m in metrics if isinstance(m.get("eval_accuracy"), (int, float))]
    sizes = [m["comm_bytes"] for m in metrics if isinstance(m.get("comm_bytes"), (int, float))]
    failed = _failure(run_dir, problems)
    finished = _finished(run_dir, problems)
    return RunRecord(
        path=run_dir,
        config=config or {},
        overrides=overrides,
        steps=max((r["step"] for r in rows), default=0),
        timed_steps=len(kept),
        comm_ms=mean_std(kept, "comm_ms"),
        compute_ms=mean_std(kept, "compute_ms"),
        comm_share=comm_share(kept),
        bytes_per_step=sizes[-1] if sizes else None,
        final_eval_accuracy=evals[-1] if evals else None,
        loss=[(r["step"], r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float))],
        failed=failed,
        finished=finished or failed is not None,
        problems=problems,
    )


def swept_keys(records: Sequence[RunRecord]) -> list[str]:
    """Overrides whose value is not the same in every run, in the order they were given."""
    keys: list[str] = []
    for r in records:
        keys += [k for k in r.overrides if k not in keys]
    return [k for k in keys if len({r.overrides.get(k) for r in records}) > 1]


def label_runs(records: Sequence[RunRecord]) -> list[str]:
    keys = swept_keys(records)
    for r in records:
        r.label = " ".join(f"{k}={r.overrides.get(k, '(default)')}" for k in keys) or r.path.name
    return keys


def rank(records: Sequence[RunRecord]) -> list[RunRecord]:
    """Fastest communication first (runs without timed steps, then failed runs, last)."""
    return sorted(records, key=lambda r: (r.failed is not None, math.isnan(r.comm_ms[0]), r.comm_ms[0]))


def _marks(r: RunRecord) -> str:
    """What the row must say beside its figures: a failure, an unfinished run, a bad file."""
    marks = []
    if r.failed is not None and r.timed_steps:
        marks.append(f"FAILED: {r.failed}")
    if not r.finished:
        marks.append(UNFINISHED)
    if r.problems:
        marks.append(f"BAD FILE{'S' if len(r.problems) > 1 else ''} (below)")
    return "".join(f"  {m}" for m in marks)


def render_table(records: Sequence[RunRecord]) -> str:
    width = max([len("run (swept overrides)"), *(len(r.label) for r in records)])
    head = (
        f"{'#':>2} {'run (swept overrides)':<{width}} {'model':<10} {'steps':>5} {'timed':>5}"
        f" {'comm ms/iter':>16} {'compute ms/iter':>18} {'comm share':>10} {'eval acc':>9}"
    )
    lines = [head, "-" * len(head)]
    for i, r in enumerate(records, 1):
        if r.failed is not None and not r.timed_steps:
            lines.append(
                f"{i:>2} {r.label:<{width}} {str(r.get('model.name', '?')):<10} {r.steps:>5}   FAILED: {r.failed}"
                + _marks(r)
            )
            continue
        acc = f"{100 * r.final_eval_accuracy:8.2f}%" if r.final_eval_accuracy is not None else f"{'-':>9}"
        comm = f"{r.comm_ms[0]:.2f} ± {r.comm_ms[1]:.2f}"
        compute = f"{r.compute_ms[0]:.1f} ± {r.compute_ms[1]:.1f}"
        lines.append(
            f"{i:>2} {r.label:<{width}} {str(r.get('model.name', '?')):<10} {r.steps:>5} {r.timed_steps:>5}"
            f" {comm:>16} {compute:>18} {share_text(r.comm_share):>10} {acc}" + _marks(r)
        )
    lines.append("")
    lines.append(
        "comm ms/iter and compute ms/iter: mean ± standard deviation over the timed steps (all but the first of"
        f" each session); {COMM_SHARE}."
    )
    if any(not r.finished for r in records):
        lines.append(f"{UNFINISHED}: the run wrote no summary.json (nor failed.json): still running, or killed.")
    problems = [p for r in records for p in r.problems]
    if problems:
        lines.append("")
        lines.append(f"files that could not be read ({len(problems)}; their runs are listed with what the rest hold):")
        lines += [f"  {p}" for p in problems]
    return "\n".join(lines)


def replicas_of(spec, device_type=None) -> int | None:
    """How many replicas ``trainer.devices`` names, read without torch (None for auto, cuda)."""
    if isinstance(spec, bool) or spec is None:
        return None
    if isinstance(spec, int):
        return spec
    if isinstance(spec, list):
        return len(spec)
    text = str(spec)
    if text.isdigit():
        return int(text)
    if "*" in text and text.rpartition("*")[2].isdigit():
        return int(text.rpartition("*")[2])
    if text in ("auto", "cuda"):
        return None
    return len(text.split(","))


def _axis_value(r: RunRecord, key: str) -> float | None:
    if key == "trainer.devices":
        return replicas_of(r.get("trainer.devices"))
    value = r.get(key)
    if key == "comm.options.block_size":
        from lptrain.comm.errors import CollectiveInputError
        from lptrain.comm.sizes import parse_size  # only when block sizes were swept (it imports torch)

        try:
            return float(parse_size(value, "block_size"))
        except CollectiveInputError:
            return None  # auto
    return float(value) if isinstance(value, (int, float)) else None


def numeric_axis(records: Sequence[RunRecord], keys: Sequence[str]) -> tuple[str, str, list[float | None]] | None:
    """A swept quantity to plot communication time against: replicas, block size, bucket size
    or, when the runs' messages differ in size (another model), the bytes per step."""
    for key, title in AXES:
        if key in keys:
            values = [_axis_value(r, key) for r in records]
            if len({v for v in values if v is not None}) > 1:
                return key, title, values
    sizes = [r.bytes_per_step for r in records]
    if len({s for s in sizes if s}) > 1:
        return "bytes", "message per step (MiB)", [s / 2**20 if s else None for s in sizes]
    return None


def plot(records: Sequence[RunRecord], keys: Sequence[str], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = numeric_axis(records, keys)
    panels = 3 if axis else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 0.5 * len(records) + 3.5))
    bars, curves = axes[0], axes[-1]
    labels = [r.label for r in records]
    means = [r.comm_ms[0] for r in records]
    spreads = [r.comm_ms[1] for r in records]
    bars.barh(labels, means, xerr=spreads, color="tab:blue", ecolor="black", capsize=3)
    for y, (m, s) in enumerate(zip(means, spreads)):
        bars.text(m + s, y, f" {m:.2f} ± {s:.2f}", va="center", fontsize=8)
    bars.set_xlabel("communication per iteration (ms), mean ± sd over timed steps")
    bars.set_title("gradient communication, fastest first")
    bars.invert_yaxis()
    bars.set_xlim(left=0)
    bars.margins(x=0.3)
    if axis:
        key, title, values = axis
        ax = axes[1]
        groups: dict[str, list[tuple[float, float, float]]] = {}
        others = [k for k in keys if k != key]
        for r, v in zip(records, values):
            if v is None:
                continue
            name = " ".join(f"{k}={r.overrides.get(k, '(default)')}" for k in others) or str(r.get("comm.name", "?"))
            groups.setdefault(name, []).append((v, r.comm_ms[0], r.comm_ms[1]))
        for name, pts in sorted(groups.items()):
            pts.sort()
            ax.errorbar(
                [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=name
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel(title)
        ax.set_ylabel("communication per iteration (ms)")
        ax.set_title(f"communication time against {title.split(' (')[0]}")
        ax.legend(fontsize=8)
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "v", "D", "x", "+", "*"]
    for i, r in enumerate(records):
        if r.loss:
            steps, values = zip(*r.loss)
            every = max(1, len(steps) // 10)
            curves.plot(
                steps,
                values,
                linestyle=styles[i % len(styles)],
                marker=markers[i % len(markers)],
                markevery=every,
                markersize=4,
                linewidth=1.2,
                label=r.label,
            )
    curves.set_xlabel("step")
    curves.set_ylabel("training loss (every step)")
    curves.set_title("training loss per step (identical runs overlap)")
    curves.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lptrain-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a multirun folder (or any folder holding lptrain runs)")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: SWEEP/report.png)")
    args = parser.parse_args(argv)
    if not args.sweep.is_dir():
        parser.error(f"{args.sweep} is not a folder")
    runs = find_runs(args.sweep)
    if not runs:
        parser.error(f"no lptrain runs (folders holding steps.jsonl or failed.json) under {args.sweep}")
    records = [read_run(r) for r in runs]
    keys = label_runs(records)
    records = rank(records)
    print(render_table(records))
    plotted = [r for r in records if r.timed_steps]  # a failed run may have no steps to draw
    out = plot(plotted or records, keys, args.out or args.sweep / "report.png")
    print(f"\nplot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
