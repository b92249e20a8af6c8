"""Model replicas whose parameters and gradients live in one flat buffer per device.

With flat buffers one collective covers the whole model (or one per bucket), instead of
one per tensor: the parameters and gradients of every module are views into them, so
the optimizer and autograd write straight into the buffers the communicator moves.

With ``channels_last`` each convolution's weight (and its gradient) is a view of its
slice of the flat buffer in NHWC order, so the kernels that prefer that order read it
without a copy. The buffer then holds those weights in another element order than the
plain module's; ``state_params`` and ``load_params`` read and write the plain order, so
a checkpoint is the same whichever format trained it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


class Replicas:
    """``len(devices)`` identical copies of ``model``, one per device."""

    def __init__(self, model: nn.Module, devices: Sequence[torch.device], channels_last: bool = False) -> None:
        self.devices = list(devices)
        self.channels_last = channels_last
        self.models = [copy.deepcopy(model).to(d) for d in self.devices]
        self.params: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.buffers: list[dict[torch.dtype, torch.Tensor]] = []
        for m, d in zip(self.models, self.devices):
            p, g = _flatten_parameters(m, d, channels_last)
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

    def state_params(self) -> torch.Tensor:
        """The root's parameters as one flat tensor in the plain module's element order (what
        a checkpoint holds): the flat buffer itself, unless channels_last reordered it."""
        if not self.channels_last:
            return self.params[0]
        return torch.cat([p.detach().reshape(-1) for p in _trainable(self.models[0])])

    def load_params(self, flat: torch.Tensor) -> None:
        """Every replica's parameters from ``flat``, in the plain module's element order."""
        with torch.no_grad():
            for model, buffer in zip(self.models, self.params):
                if not self.channels_last:
                    buffer.copy_(flat)
                    continue
                sizes = [p.numel() for p in _trainable(model)]
                for p, chunk in zip(_trainable(model), flat.split(sizes)):
                    p.copy_(chunk.view(p.shape))

    def identical(self) -> bool:
        """True when every replica's parameters equal the root's bit for bit."""
        root = self.params[0].cpu()
        return all(torch.equal(root, p.cpu()) for p in self.params[1:])


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _view(chunk: torch.Tensor, like: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``chunk`` shaped as ``like``: a 4-d weight in NHWC order with channels_last."""
    if channels_last and like.dim() == 4:
        n, c, h, w = like.shape
        return chunk.view(n, h, w, c).permute(0, 3, 1, 2)
    return chunk.view_as(like)


def _flatten_parameters(
    model: nn.Module, device: torch.device, channels_last: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    params = _trainable(model)
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
            view = _view(flat[offset : offset + n], p, channels_last)
            view.copy_(p)
            p.data = view
            p.grad = _view(grad[offset : offset + n], p, channels_last)
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
