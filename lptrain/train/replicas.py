"""Model replicas whose parameters and gradients live in one flat buffer per device.

With flat buffers one collective covers the whole model (or one per bucket), instead of
one per tensor: the parameters and gradients of every module are views into them, so
the optimizer and autograd write straight into the buffers the communicator moves.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


class Replicas:
    """``len(devices)`` identical copies of ``model``, one per device."""

    def __init__(self, model: nn.Module, devices: Sequence[torch.device]) -> None:
        self.devices = list(devices)
        self.models = [copy.deepcopy(model).to(d) for d in self.devices]
        self.params: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.buffers: list[dict[torch.dtype, torch.Tensor]] = []
        for m, d in zip(self.models, self.devices):
            p, g = _flatten_parameters(m, d)
            self.params.append(p)
            self.grads.append(g)
            self.buffers.append(_flatten_buffers(m, d))
        self.numel = self.params[0].numel()
        gpus = list(dict.fromkeys(self.devices)) if self.devices[0].type == "cuda" else []
        self._by_gpu = [[r for r, d in enumerate(self.devices) if d == gpu] for gpu in gpus]
        self._pool = ThreadPoolExecutor(len(gpus)) if gpus else None

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def zero_grad(self) -> None:
        for g in self.grads:
            g.zero_()

    def run(self, fn: Callable[[int, nn.Module], object]) -> list:
        """``fn(rank, model)`` on every replica: concurrently on distinct GPUs (one thread
        per GPU, as ``torch.nn.parallel.parallel_apply`` does), in rank order on the CPU
        and among the replicas that share a GPU, so that those draw from the GPU's one
        generator in a fixed order."""
        if self._pool is None:
            return [fn(r, m) for r, m in enumerate(self.models)]

        def on_gpu(ranks: list[int]) -> list:
            with torch.cuda.device(self.devices[ranks[0]]):
                return [(r, fn(r, self.models[r])) for r in ranks]

        results: list = [None] * self.world_size
        for done in self._pool.map(on_gpu, self._by_gpu):
            for r, value in done:
                results[r] = value
        return results

    def identical(self) -> bool:
        """True when every replica's parameters equal the root's bit for bit."""
        root = self.params[0].cpu()
        return all(torch.equal(root, p.cpu()) for p in self.params[1:])


def _flatten_parameters(model: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise ValueError(f"flat buffers need one parameter dtype, the model has {sorted(map(str, dtypes))}")
    total = sum(p.numel() for p in params)
    flat = torch.empty(total, dtype=params[0].dtype, device=device)
    grad = torch.zeros_like(flat)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset : offset + n].copy_(p.reshape(-1))
            p.data = flat[offset : offset + n].view_as(p)
            p.grad = grad[offset : offset + n].view_as(p)
            offset += n
    return flat, grad


def _flatten_buffers(model: nn.Module, device: torch.device) -> dict[torch.dtype, torch.Tensor]:
    """Batch-norm statistics and the like, one flat buffer per dtype (broadcast from the root)."""
    by_dtype: dict[torch.dtype, list[tuple[nn.Module, str, torch.Tensor]]] = {}
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                by_dtype.setdefault(buf.dtype, []).append((module, name, buf))
    flats = {}
    for dtype, entries in by_dtype.items():
        flat = torch.empty(sum(b.numel() for _, _, b in entries), dtype=dtype, device=device)
        offset = 0
        for module, name, buf in entries:
            n = buf.numel()
            flat[offset : offset + n].copy_(buf.reshape(-1))
            module._buffers[name] = flat[offset : offset + n].view_as(buf)
            offset += n
        flats[dtype] = flat
    return flats
