"""The numerics guard: a run whose loss or gradient stops being finite ends there.

Without it a diverged run (a learning rate far too high, an overflow) trains on NaN to its
last step, overwrites its last good checkpoint with NaN weights and exits 0. With it the
step whose loss or averaged gradient is not finite ends the run with one line naming the
step and what was not finite (the loss, with the replicas it was not finite on, or the
gradient), and exit code 6 (``lptrain.exits.EXIT_DIVERGED``); the last checkpoint written
before it stays, and no checkpoint of non-finite weights is ever written.

What it costs, per step:

* the loss: each replica's loss is read as a Python float for the log anyway; the guard
  tests those floats;
* the gradient: one sum over the root replica's averaged gradient buffer, which is not
  finite when any element is not (an inf, a nan, or +inf and -inf together; a sum beyond
  float32's range, which only a gradient that would step the weights to inf reaches, counts
  too). It is queued after the collectives and read with the loss, and across processes its
  verdict travels in the loss's own sum: no collective and no wait of its own;
* a checkpoint: every floating tensor it holds is tested before it is written (every
  ``trainer.checkpoint_every`` steps, beside the copy to the CPU that saving makes anyway).

With fp16 the loss scaler already tests the averaged gradient and skips the step on an
overflow: a skipped step is normal and is not a divergence, so the gradient's verdict is
left to the scaler there, and only the loss (which is the unscaled one) counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


class NumericsError(RuntimeError):
    """The run diverged: a loss, a gradient or a checkpoint's tensor is not finite (exit code 6)."""


def gradient_probe(grad: torch.Tensor) -> torch.Tensor:
    """A 0-dim tensor on ``grad``'s device, not finite exactly when ``grad`` holds an inf or a nan
    (or sums beyond float32): queued, not waited for."""
    return grad.sum()


def gradient_verdict(probe: torch.Tensor | None, counts: bool) -> float:
    """1.0 when this process's averaged gradient (``probe``) is not finite and its verdict
    counts (it holds the average: in reduce mode only the root does), else 0.0; a number, so
    that the sum across processes carries it. ``probe`` None: not tested here (fp16)."""
    if probe is None or not counts:
        return 0.0
    return 0.0 if math.isfinite(float(probe)) else 1.0


def _replicas_text(bad: Sequence[int]) -> str:
    return f"replica {bad[0]}" if len(bad) == 1 else f"replicas {', '.join(map(str, bad))}"


def step_failure(
    step: int, losses: Sequence[float], first_replica: int, total_loss: float, bad_gradients: float
) -> str | None:
    """Why step ``step`` (counted from 1) diverged, or None when its loss and gradient are finite.

    ``losses`` are this process's replicas' losses, the first being global replica
    ``first_replica``; ``total_loss`` is the mean over every process (not finite when any
    replica's is) and ``bad_gradients`` the count of processes whose averaged gradient was
    not finite (``gradient_verdict`` summed)."""
    if not math.isfinite(total_loss):
        bad = [first_replica + r for r, value in enumerate(losses) if not math.isfinite(value)]
        where = f"on {_replicas_text(bad)}" if bad else "on another process's replicas"
        shown = next((value for value in losses if not math.isfinite(value)), total_loss)
        return f"the loss of step {step} is not finite ({shown}) {where}"
    if bad_gradients:
        return f"the averaged gradient of step {step} is not finite (an inf or a nan)"
    return None


def nonfinite_entry(state: Any, prefix: str = "") -> str | None:
    """The key (dotted) of the first floating tensor in ``state`` that holds an inf or a nan."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            return prefix or "the tensor"
        return None
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return None
    for key, value in items:
        found = nonfinite_entry(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None
