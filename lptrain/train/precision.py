"""Mixed precision: autocast on every replica, and a loss scaler the replicas agree on.

``trainer.precision=bf16|fp16`` runs forward (and so backward) under autocast; the
parameters, the flat gradient buffers and the optimizer stay float32. For fp16 the loss
is multiplied by a scale before backward so that small gradients survive, and after the
gradients are averaged the step is skipped (and the scale halved) when they hold an inf
or a nan. That decision is taken once, on the averaged gradient of the root replica (in
allreduce mode every replica holds the same bits; in reduce mode only the root steps), and
shared with every process, so that no replica steps where another skips.

``comm.grad_dtype=bf16|fp16`` is separate: the dtype in which gradients travel (half the
bytes), summed with float32 accumulation and cast back into the float32 buffer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str):
    """The autocast context for one replica's forward pass (none for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=PRECISIONS[precision])


def check_precision(device_type: str, precision: str) -> str | None:
    """Why ``precision`` cannot run on ``device_type`` here, or None when it can (a tiny probe)."""
    if precision == "fp32":
        return None
    try:
        with torch.autocast(device_type=device_type, dtype=PRECISIONS[precision]):
            x = torch.ones(1, 3, 4, 4, device=device_type, requires_grad=True)
            w = torch.ones(2, 3, 3, 3, device=device_type, requires_grad=True)
            y = torch.nn.functional.conv2d(x, w).sum()
        y.backward()
    except (RuntimeError, TypeError) as err:
        return f"{precision} autocast does not run on {device_type} here ({str(err).splitlines()[0]})"
    return None


class LossScaler:
    """Dynamic loss scaling for fp16: x2 after ``growth_interval`` clean steps, /2 on an overflow."""

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.enabled, self.scale, self.growth_interval = enabled, float(init_scale), growth_interval
        self._clean_steps = 0
        self.skipped = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def found_overflow(self, grad: torch.Tensor) -> bool:
        """Whether the averaged gradient holds an inf or a nan (False when not scaling)."""
        return self.enabled and not bool(torch.isfinite(grad).all())

    def unscale(self, grads: Sequence[torch.Tensor]) -> None:
        if self.enabled:
            for g in grads:
                g.mul_(1.0 / self.scale)

    def update(self, overflow: bool) -> None:
        """After the step (or the skip): the same on every replica and process, given the same ``overflow``."""
        if not self.enabled:
            return
        if overflow:
            self.scale /= 2.0
            self._clean_steps = 0
            self.skipped += 1
        else:
            self._clean_steps += 1
            if self._clean_steps % self.growth_interval == 0:
                self.scale *= 2.0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self._clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])
        self.skipped = int(state.get("skipped", 0))
