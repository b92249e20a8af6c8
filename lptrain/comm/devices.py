"""Turning user device specifications into ``torch.device`` lists, with clear errors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError


def cuda_device_count() -> int:
    """GPUs usable by this process (0 when CUDA is absent)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_cuda(what: str) -> None:
    """Fail clearly, never fall back, when ``what`` needs CUDA and there is none."""
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"{what} needs CUDA, but torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}); use CPU devices such as ['cpu'] * 4 instead"
        )


def parse_devices(devices: Sequence[str | torch.device]) -> tuple[torch.device, ...]:
    """Check a list of devices: all CPU or all CUDA, CUDA indices that exist.

    A device may repeat: several replicas then share it (on CPU that is the only way to
    have several "devices"; on CUDA it exercises the streams with one GPU).
    """
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
        raise CollectiveInputError(
            f"devices must be a list such as ['cpu'] * 4 or ['cuda:0', 'cuda:1'], got {devices!r}"
        )
    if len(devices) == 0:
        raise CollectiveInputError("devices is empty: give at least one device, such as ['cpu']")
    parsed = []
    for d in devices:
        try:
            dev = torch.device(d)
        except (RuntimeError, TypeError) as err:
            raise CollectiveInputError(f"{d!r} is not a device; use 'cpu', 'cuda' or 'cuda:N'") from err
        if dev.type not in ("cpu", "cuda"):
            raise CollectiveInputError(f"device {d!r} has type {dev.type!r}; valid types: cpu, cuda")
        if dev.type == "cuda":
            require_cuda(f"device {str(d)!r}")
            index = torch.cuda.current_device() if dev.index is None else dev.index
            if index >= cuda_device_count():
                raise CollectiveInputError(
                    f"device {str(d)!r} does not exist: this machine has {cuda_device_count()} GPU(s), "
                    f"cuda:0..cuda:{cuda_device_count() - 1}"
                )
            dev = torch.device("cuda", index)
        parsed.append(dev)
    kinds = {d.type for d in parsed}
    if len(kinds) > 1:
        raise CollectiveInputError(f"devices mix CPU and CUDA ({[str(d) for d in parsed]}); use one kind")
    return tuple(parsed)


def expand_device_spec(spec: str) -> list[str]:
    """``"cpu:4"`` -> four CPU devices, ``"cuda:2"`` -> cuda:0 and cuda:1, or an explicit
    comma-separated list such as ``"cuda:0,cuda:0,cuda:1"`` (for command lines)."""
    spec = spec.strip()
    if "," in spec:
        return [s.strip() for s in spec.split(",") if s.strip()]
    kind, _, count = spec.partition(":")
    if kind not in ("cpu", "cuda") or not count.isdigit() or int(count) < 1:
        raise CollectiveInputError(
            f"device spec {spec!r} is not valid; use cpu:N, cuda:N (the first N GPUs) or a list like cuda:0,cuda:0"
        )
    n = int(count)
    if kind == "cpu":
        return ["cpu"] * n
    require_cuda(f"device spec {spec!r}")
    if n > cuda_device_count():
        raise CollectiveInputError(
            f"device spec {spec!r} asks for {n} GPUs but this machine has {cuda_device_count()}; "
            "to put several replicas on one GPU list them, e.g. cuda:0,cuda:0"
        )
    return [f"cuda:{i}" for i in range(n)]
