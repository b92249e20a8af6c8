"""Where a run's numbers go: TensorBoard, a JSON-lines file, and the console.

``metrics.jsonl`` is flushed line by line, so an interrupted run loses nothing it had
measured; TensorBoard gets the same scalars under the tags in ``TAGS``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

TAGS = {
    "loss": "train/loss",
    "accuracy": "train/accuracy",
    "eval_loss": "eval/loss",
    "eval_accuracy": "eval/accuracy",
    "data_ms": "time/data_ms",
    "compute_ms": "time/compute_ms",
    "comm_ms": "time/comm_ms",
    "step_ms": "time/step_ms",
    "comm_GBps": "comm/bandwidth_GBps",
    "comm_bytes": "comm/bytes",
    "images_per_s": "throughput/images_per_s",
    "lr": "optim/lr",
    "grad_norm": "optim/grad_norm",
}


class RunLog:
    def __init__(self, run_dir: Path, tensorboard: bool, purge_step: int | None = None, enabled: bool = True) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self.writer = None
        if not enabled:  # not rank 0 of a multi-process run: nothing is written
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "metrics.jsonl"
        if purge_step is not None and path.exists():
            # Resuming into the same folder: drop what the interrupted run logged after
            # its checkpoint, as TensorBoard's purge_step does for the event files.
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= purge_step]
            path.write_text("".join(line + "\n" for line in kept))
        self._jsonl = open(path, "a")  # noqa: SIM115 - closed in close()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps({"step": step, **values}) + "\n")
        self._jsonl.flush()
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(TAGS.get(key, key), value, step)

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        if self.writer is not None:
            clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
            self.writer.add_hparams(clean, {f"hparam/{k}": v for k, v in metrics.items()}, run_name="hparams")

    def close(self) -> None:
        if not self.enabled:
            return
        self._jsonl.close()
        if self.writer is not None:
            self.writer.close()


class Progress:
    """A live line on a terminal (rewritten every step), a plain line per interval elsewhere."""

    def __init__(self, total: int, every: int, enabled: bool = True, stream=None, messages: bool = True) -> None:
        self.total, self.every, self.enabled, self.messages = total, max(1, every), enabled, messages
        self.stream = stream or sys.stdout
        self.live = enabled and self.stream.isatty()
        self.t0 = time.perf_counter()

    def update(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        done = step + 1
        text = (
            f"step {done:>{len(str(self.total))}}/{self.total} | loss {values['loss']:.4f} | "
            f"acc {100 * values['accuracy']:5.1f}% | data {values['data_ms']:6.1f} ms | "
            f"compute {values['compute_ms']:7.1f} ms | "
            f"comm {values['comm_ms']:7.1f} ms | {values['images_per_s']:7.0f} img/s"
        )
        if self.live:
            elapsed = time.perf_counter() - self.t0
            bar = "#" * int(20 * done / self.total)
            print(f"\r[{bar:<20}] {text} | {elapsed:5.0f}s", end="", file=self.stream, flush=True)
            if done == self.total:
                print(file=self.stream)
        elif done % self.every == 0 or done == self.total:
            print(text, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """Shown even with the step lines turned off (but only by rank 0)."""
        if not self.messages:
            return
        if self.live:
            print(file=self.stream)
        print(text, file=self.stream, flush=True)
