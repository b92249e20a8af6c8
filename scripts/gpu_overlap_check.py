"""Train the same run with ``trainer.overlap=true`` and ``false`` and compare the parameters.

Overlap only moves when each bucket's collective starts; the buckets, the collectives and
the update are the same, so the two runs' parameters must agree to floating-point
tolerance (bitwise where every kernel is deterministic, which this script asks cuDNN for).
Each pair runs in this one process, in throw-away folders (no checkpoints, no TensorBoard
event files); what comes out is one block of lines per run, from the trainer's own
summary, and one verdict line per pair::

    python3 scripts/gpu_overlap_check.py --comm lp,ring -- +recipe=alexnet data=synthetic \\
        model.image_size=224 'trainer.devices=[cuda:0,cuda:0,cuda:0,cuda:0]' trainer.bucket_mb=25

Under torchrun (``python3 -m torch.distributed.run ... scripts/gpu_overlap_check.py ...``) every
process trains both runs; the trainers join the default group once. Exit status 0 when
every pair agrees, 1 when one does not (its largest difference named). lptrain must be
importable: installed, or the checkout on ``PYTHONPATH`` as ``scripts/gpu_check.sh`` sets it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from doctools.launch import QUIET
from lptrain.settings.locations import compose_config
from lptrain.train.trainer import Trainer


def train(overrides: list[str], run_dir: Path):
    """One run in ``run_dir``: its summary, its root replica's parameters (on the CPU) and its bucket count."""
    cfg = compose_config([*overrides, *QUIET])
    trainer = Trainer(cfg, run_dir)
    summary = trainer.fit()
    return summary, trainer.replicas.params[0].detach().cpu().clone(), len(trainer.buckets)


def compare(a: torch.Tensor, b: torch.Tensor, rtol: float) -> tuple[bool, float, bool]:
    """(within tolerance, largest difference relative to the largest parameter, bitwise equal)."""
    scale = max(float(a.abs().max()), 1e-12)
    worst = float((a - b).abs().max()) / scale
    return worst <= rtol, worst, torch.equal(a, b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comm", default="lp", help="comma-separated communicators, each trained both ways")
    parser.add_argument("--rtol", type=float, default=1e-4, help="largest difference / largest parameter allowed")
    parser.add_argument("overrides", nargs="*", help="lptrain overrides shared by every run")
    args = parser.parse_args(argv)
    torch.backends.cudnn.deterministic = True  # so that the two runs differ only by the overlap
    torch.backends.cudnn.benchmark = False
    failed = 0
    with tempfile.TemporaryDirectory(prefix="lptrain-overlap-") as tmp:
        for comm in args.comm.split(","):
            params = {}
            for overlap in ("true", "false"):
                run = [*args.overrides, f"comm={comm}", f"trainer.overlap={overlap}"]
                summary, params[overlap], buckets = train(run, Path(tmp) / f"{comm}-{overlap}")
                print(
                    f"overlap_check: comm={comm} overlap={overlap}: {summary.steps} steps, {buckets} bucket(s),"
                    f" compute {summary.mean_compute_ms:.1f} ms, comm {summary.mean_comm_ms:.1f} ms"
                    f" (exposed {summary.mean_comm_exposed_ms:.1f} ms), {summary.images_per_s:.0f} images/s,"
                    f" final loss {summary.final_loss:.4f}, replicas"
                    f" {'identical' if summary.replicas_identical else 'DIVERGED'}",
                    flush=True,
                )
                failed += not summary.replicas_identical
            ok, worst, bitwise = compare(params["true"], params["false"], args.rtol)
            verdict = "bitwise equal" if bitwise else f"largest difference {worst:.2e} of the largest parameter"
            print(f"overlap_check: comm={comm}: overlap on vs off: {'OK' if ok else 'DIFFER'} ({verdict})", flush=True)
            failed += not ok
    if torch.distributed.is_initialized():  # under torchrun: the trainers joined the default group
        torch.distributed.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
