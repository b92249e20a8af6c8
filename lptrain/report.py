"""``lptrain-report``: a table and a plot of a sweep, read back from its TensorBoard files.

lptrain -m +recipe=alexnet comm=lp,mst,be,ring
lptrain-report multirun/2026-12-02/14-00-00        # table on stdout, report.png beside it
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lptrain.train.log import TAGS


@dataclass
class RunRecord:
    path: Path
    comm: str
    devices: str
    sync: str
    model: str
    steps: int
    mean_comm_ms: float
    final_eval_accuracy: float | None
    loss: list[tuple[int, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.comm} {self.devices} {self.sync}"


def find_runs(root: Path) -> list[Path]:
    """Run folders under ``root``: those holding a ``tb/`` folder of event files."""
    return sorted({p.parent.parent for p in root.rglob("tb/events.out.tfevents.*")})


def read_run(run_dir: Path) -> RunRecord:
    from omegaconf import OmegaConf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))

    def series(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else []

    comm_ms = [v for _, v in series(TAGS["comm_ms"])]
    comm_ms = comm_ms[1:] or comm_ms  # the first logged step carries set-up costs
    evals = series(TAGS["eval_accuracy"])
    loss = series(TAGS["loss"])
    cfg_file = run_dir / ".hydra" / "config.yaml"
    cfg = OmegaConf.load(cfg_file) if cfg_file.exists() else OmegaConf.create({})
    return RunRecord(
        path=run_dir,
        comm=str(OmegaConf.select(cfg, "comm.name", default="?")),
        devices=str(OmegaConf.select(cfg, "trainer.devices", default="?")),
        sync=str(OmegaConf.select(cfg, "trainer.sync", default="?")),
        model=str(OmegaConf.select(cfg, "model.name", default="?")),
        steps=max((s for s, _ in loss), default=0),
        mean_comm_ms=statistics.fmean(comm_ms) if comm_ms else float("nan"),
        final_eval_accuracy=evals[-1][1] if evals else None,
        loss=loss,
    )


def render_table(records: Sequence[RunRecord]) -> str:
    head = (
        f"{'communicator':<13} {'devices':<10} {'sync':<10} {'model':<10} {'steps':>6}"
        f" {'comm ms/iter':>13} {'final acc':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        acc = f"{100 * r.final_eval_accuracy:9.2f}%" if r.final_eval_accuracy is not None else f"{'-':>10}"
        lines.append(
            f"{r.comm:<13} {r.devices:<10} {r.sync:<10} {r.model:<10} {r.steps:>6} {r.mean_comm_ms:>13.2f} {acc}"
        )
    return "\n".join(lines)


def plot(records: Sequence[RunRecord], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [r.label for r in records]
    bars.barh(labels, [r.mean_comm_ms for r in records], color="tab:blue")
    bars.set_xlabel("mean communication time per iteration (ms)")
    bars.set_title("gradient communication")
    bars.invert_yaxis()
    for r in records:
        if r.loss:
            steps, values = zip(*r.loss)
            curves.plot(steps, values, label=r.label)
    curves.set_xlabel("step")
    curves.set_ylabel("training loss")
    curves.set_title("convergence (curves should overlap)")
    curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lptrain-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a multirun folder (or any folder holding lptrain runs)")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: SWEEP/report.png)")
    args = parser.parse_args(argv)
    if not args.sweep.is_dir():
        parser.error(f"{args.sweep} is not a folder")
    runs = find_runs(args.sweep)
    if not runs:
        parser.error(f"no lptrain runs (tb/ event files) under {args.sweep}")
    records = [read_run(r) for r in runs]
    print(render_table(records))
    out = plot(records, args.out or args.sweep / "report.png")
    print(f"\nplot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
