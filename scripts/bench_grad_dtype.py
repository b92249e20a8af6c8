"""The default experiment with gradients communicated in fp32, bf16 and fp16: curves and bytes.

    python scripts/bench_grad_dtype.py                 # 300 steps each, docs/figures/grad_dtype.png
    python scripts/bench_grad_dtype.py --steps 100 --out curves.png --json grad_dtype.json

Same seed, same batches; only ``comm.grad_dtype`` differs. Prints per dtype the bytes per
step, the largest loss difference from fp32 over all steps, the final loss and the eval
accuracy, and overlays the loss curves in one figure. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from doctools import ROOT
from doctools.files import write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "grad_dtype.png")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = p.parse_args()
    curves: dict[str, list[float]] = {}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("fp32", "bf16", "fp16"):
            run_dir = Path(tmp) / dtype
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "lptrain",
                    f"comm.grad_dtype={dtype}",
                    f"trainer.steps={args.steps}",
                    "trainer.progress=false",
                    "trainer.checkpoint_every=0",
                    f"hydra.run.dir={run_dir}",
                    *args.overrides,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            summary = json.loads((run_dir / "summary.json").read_text())
            curves[dtype] = [s["loss"] for s in steps]
            worst = max(abs(a - b) for a, b in zip(curves["fp32"], curves[dtype]))
            size = [m["comm_bytes"] for m in metrics if "comm_bytes" in m][-1]
            print(
                f"{dtype}: {size / 2**20:.2f} MiB per step, max |loss - fp32 loss| {worst:.4f} over {len(steps)} steps,"
                f" final loss {summary['final_loss']:.4f}, eval accuracy {100 * summary['eval_accuracy']:.2f}%,"
                f" comm {summary['mean_comm_ms']:.2f} ms per step",
                flush=True,
            )
            rows.append(
                {
                    "dtype": dtype,
                    "mib_per_step": size / 2**20,
                    "max_loss_diff": worst,
                    "steps": len(steps),
                    "final_loss": summary["final_loss"],
                    "eval_accuracy": summary["eval_accuracy"],
                    "comm_ms": summary["mean_comm_ms"],
                }
            )
    if args.json:
        write_json(args.json, {"steps": args.steps, "overrides": args.overrides, "rows": rows})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (dtype, losses), style in zip(curves.items(), ["-", "--", ":"]):
        ax.plot(range(1, len(losses) + 1), losses, style, label=f"comm.grad_dtype={dtype}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("default experiment: gradients communicated in fp32, bf16, fp16")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
