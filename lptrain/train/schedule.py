"""Learning-rate schedules as pure functions of the step (nothing to checkpoint)."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "step", "cosine")


def learning_rate(
    step: int,
    total: int,
    lr: float,
    schedule: str,
    warmup_steps: int = 0,
    step_size: int = 100,
    gamma: float = 0.1,
    min_lr: float = 0.0,
) -> float:
    """Linear warm-up over ``warmup_steps``, then the named schedule."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; valid schedules: {', '.join(SCHEDULES)}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "step":
        return lr * gamma ** ((step - warmup_steps) // max(1, step_size))
    span = max(1, total - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
