"""``trainer.profile=STEP_RANGE``: PyTorch's profiler over a few steps, a Chrome trace per process.

The steps are counted from 1 as the progress lines count them: ``3`` profiles step 3,
``2-4`` steps 2, 3 and 4. The profiler records every thread (``profile_all_threads``):
the trainer's communication thread runs the buckets' collectives there while backward
runs on the main thread, and the trace shows both, with lptrain's phase and collective
ranges (``lptrain.comm.ranges``) beside autograd's operators. The trace is written to
``profile/trace_rank<R>.json`` in the run folder when the last step of the range ends (or
the run does); it opens in Perfetto (ui.perfetto.dev) or chrome://tracing.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from lptrain.errors import ConfigError

__all__ = ["StepProfiler", "parse_step_range"]


def parse_step_range(value: object) -> tuple[int, int] | None:
    """``None``, ``N`` or ``A-B`` (1 <= A <= B) as (first, last); anything else a ConfigError."""
    if value is None:
        return None
    text = str(value).strip()
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    if match:
        first, last = int(match[1]), int(match[2] or match[1])
        if 1 <= first <= last:
            return first, last
    raise ConfigError(
        f"trainer.profile={text} is not valid; use a step N or a range A-B of steps counted from 1 (such as 2-4), "
        "or null"
    )


class StepProfiler:
    """Starts the profiler before step ``first`` and writes the trace after step ``last``."""

    def __init__(self, steps: tuple[int, int], run_dir: Path, rank: int, cuda: bool) -> None:
        self.first, self.last = steps
        self.path = Path(run_dir) / "profile" / f"trace_rank{rank}.json"
        self.cuda = cuda
        self._prof: profile | None = None
        self.written: Path | None = None

    def before(self, step: int) -> None:
        """Before the step counted ``step`` (from 1)."""
        if step == self.first and self._prof is None and self.written is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
            self._prof = profile(activities=activities, record_shapes=False, experimental_config=config)
            self._prof.__enter__()

    def after(self, step: int) -> None:
        if step >= self.last:
            self.close()

    def close(self) -> None:
        """Stop and write the trace (at the range's end, or when the run ends inside it)."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".part")
        prof.export_chrome_trace(str(partial))
        partial.replace(self.path)  # never a half-written trace under the final name
        self.written = self.path
