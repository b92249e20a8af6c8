"""Where a run's numbers go: TensorBoard, two JSON-lines files, and the console.

``steps.jsonl`` holds every step's raw measurements (what the summary and the sweep report
average); ``metrics.jsonl`` and TensorBoard hold one point per logged interval, the
interval's means (``stepstats.interval_mean``), under the tags in ``TAGS``. Both files are
flushed line by line, so an interrupted run loses nothing it had measured. The run's
hyper-parameters go to TensorBoard at the start, so a run that never ends still has them.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lptrain.train.stepstats import keep_through

TAGS = {
    "loss": "train/loss",
    "accuracy": "train/accuracy",
    "eval_loss": "eval/loss",
    "eval_accuracy": "eval/accuracy",
    "data_ms": "time/data_ms",
    "compute_ms": "time/compute_ms",
    "comm_ms": "time/comm_ms",
    "comm_exposed_ms": "time/comm_exposed_ms",
    "comm_handoff_ms": "time/comm_handoff_ms",
    "step_ms": "time/step_ms",
    "wall_ms": "time/wall_ms",  # the whole iteration by the clock, data wait and logging of the loss included
    "comm_GBps": "comm/bandwidth_GBps",
    "comm_bytes": "comm/bytes",
    "images_per_s": "throughput/images_per_s",
    "lr": "optim/lr",
    "grad_norm": "optim/grad_norm",
    "loss_scale": "optim/loss_scale",
}


STEP_KEYS = (
    "loss",
    "accuracy",
    "data_ms",
    "compute_ms",
    "comm_ms",
    "comm_exposed_ms",
    "comm_handoff_ms",
    "step_ms",
    "wall_ms",
)


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """An ``OSError`` inside (a full disk, a read-only mount) raised again naming ``path``:
    a file object's write and flush report ENOSPC with no file name."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, err.strerror or " ".join(str(err).split()), str(path)) from None


def _quiet_tensorboard_threads() -> None:
    """TensorBoard writes its events on a thread of its own; when a write fails there (a
    full disk), the thread stores the error, which the writer's next call in the main
    thread raises, and also lets it print a traceback of its own into stderr. That print
    is left out here (the error is still raised, and reported in one line); every other
    thread's uncaught error is printed as before."""
    try:
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    except ImportError:  # pragma: no cover - another tensorboard: its threads print as they do
        return
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not (isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class RunLog:
    """The run's JSON-lines files and TensorBoard's events. A write that fails raises an
    ``OSError`` naming the file (``writing``)."""

    def __init__(self, run_dir: Path, tensorboard: bool, purge_step: int | None = None, enabled: bool = True) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self.writer = None
        if not enabled:  # not rank 0 of a multi-process run: nothing is written
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if purge_step is not None:
            # Resuming into the same folder: drop what the interrupted run logged after
            # its checkpoint, as TensorBoard's purge_step does for the event files.
            for name in ("metrics.jsonl", "steps.jsonl"):
                with writing(run_dir / name):
                    keep_through(run_dir / name, purge_step)
        self._jsonl = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
        self._steps = open(run_dir / "steps.jsonl", "a")  # noqa: SIM115 - closed in close()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_threads()
            with writing(run_dir / "tb"):
                self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def _events(self) -> Path | str:
        """TensorBoard's event file (its folder where the writer does not say)."""
        events = getattr(self.writer.file_writer, "event_writer", None) if self.writer is not None else None
        return getattr(events, "_file_name", None) or self.run_dir / "tb"

    def _line(self, f, row: dict[str, Any]) -> None:
        with writing(f.name):
            f.write(json.dumps(row) + "\n")
            f.flush()

    def step(self, step: int, values: dict[str, float], warmup: bool) -> None:
        """One step's raw measurements (``warmup``: the first of a session, left out of the means)."""
        if not self.enabled:
            return
        self._line(self._steps, {"step": step, **{k: values[k] for k in STEP_KEYS if k in values}, "warmup": warmup})

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._line(self._jsonl, {"step": step, **values})
        if self.writer is not None:
            with writing(self._events()):
                for key, value in values.items():
                    self.writer.add_scalar(TAGS.get(key, key), value, step)

    def hparams(self, hparams: dict[str, Any]) -> None:
        """The run's options, written at the start; TensorBoard's HParams tab shows them
        beside the metrics the run logs as it goes (eval accuracy, communication time)."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        metrics = {TAGS[k]: 0.0 for k in ("eval_accuracy", "loss", "comm_ms", "compute_ms", "images_per_s")}
        experiment, start, _ = hparams_summary(clean, metrics)
        with writing(self._events()):
            file_writer = self.writer._get_file_writer()
            file_writer.add_summary(experiment)
            file_writer.add_summary(start)

    def text(self, tag: str, text: str) -> None:
        """A note for TensorBoard's Text tab (what comm=auto chose, for instance)."""
        if self.writer is not None:
            with writing(self._events()):
                self.writer.add_text(tag, text, 0)

    def close(self) -> None:
        """Close every file. A failed write among them is raised (naming its file) unless the
        run is already ending on an error (``close`` runs in the trainer's ``finally``): that
        error is the one the user reads, and a full disk fails each file in turn."""
        if not self.enabled:
            return
        first: OSError | None = None
        closers = [(self._jsonl.name, self._jsonl.close), (self._steps.name, self._steps.close)]
        if self.writer is not None:
            closers.append((self._events(), self.writer.close))
        for path, close in closers:
            try:
                with writing(path):
                    close()
            except OSError as err:
                first = first or err
        if first is not None and sys.exc_info()[1] is None:
            raise first


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested options as dotted keys: ``{"comm": {"options": {"block_size": 1}}}`` -> ``comm.options.block_size``."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_hparams(groups: dict[str, Any]) -> dict[str, Any]:
    """Every option of the run (``RunConfig.groups()``), flattened (``comm.options.block_size``,
    ``trainer.bucket_mb``, ...)."""
    return {key: "null" if value is None else value for key, value in flatten(groups).items()}


def _eta(seconds: float) -> str:
    from tqdm import tqdm

    return tqdm.format_interval(max(0.0, seconds))


class Progress:
    """A tqdm bar with rate and ETA on a terminal; elsewhere (a log file, CI) a plain line
    per logged interval, with the interval's means, the elapsed time and the ETA."""

    def __init__(
        self, total: int, every: int, enabled: bool = True, stream=None, messages: bool = True, initial: int = 0
    ) -> None:
        self.total, self.every, self.enabled, self.messages = total, max(1, every), enabled, messages
        self.initial = initial
        self.stream = stream or sys.stdout
        self.live = enabled and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.bar = None
        if self.live:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", file=self.stream, dynamic_ncols=True, leave=True)

    def _line(self, done: int, values: dict[str, float]) -> str:
        elapsed = time.perf_counter() - self.t0
        rate = (done - self.initial) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        return (
            f"step {done:>{len(str(self.total))}}/{self.total} | loss {values['loss']:.4f} | "
            f"acc {100 * values['accuracy']:5.1f}% | data {values['data_ms']:6.1f} ms | "
            f"compute {values['compute_ms']:7.1f} ms | comm {values['comm_ms']:7.1f} ms"
            f" (exposed {values['comm_exposed_ms']:6.1f}, hand-off {values['comm_handoff_ms']:4.1f}) | "
            f"{values['images_per_s']:5.0f} img/s | {_eta(elapsed)} elapsed, ETA {_eta(eta) if eta == eta else '?'}"
        )

    def update(self, step: int, values: dict[str, float], interval: dict[str, float] | None = None) -> None:
        """After ``step``: ``values`` are its own, ``interval`` the logged interval's means (at log points)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{values['loss']:.4f}", comm_ms=f"{values['comm_ms']:.1f}", refresh=False)
        elif interval is not None:
            print(self._line(step + 1, interval), file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """Shown even with the step lines turned off (but only by rank 0)."""
        if not self.messages:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
