"""Turning user device specifications into ``torch.device`` lists, with clear errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError

DEVICE_TYPES = ("auto", "cpu", "cuda")


def cuda_device_count() -> int:
    """GPUs usable by this process (0 when CUDA is absent)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_cuda(what: str) -> None:
    """Fail clearly, never fall back, when ``what`` needs CUDA and there is none."""
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"{what} needs CUDA, but torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}); use CPU devices instead (on the command line: cpu*4)"
        )


def parse_devices(devices: Sequence[str | torch.device]) -> tuple[torch.device, ...]:
    """Check a list of devices: all CPU or all CUDA, CUDA indices that exist.

    A device may repeat: several replicas then share it (on CPU that is the only way to
    have several "devices"; on CUDA it exercises the streams with one GPU).
    """
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
        raise CollectiveInputError(
            f"devices must be a list such as ['cpu', 'cpu'] or ['cuda:0', 'cuda:1'], got {devices!r}"
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


@dataclass(frozen=True)
class SpecSyntax:
    """How a command line writes device specs, so that errors show its own syntax."""

    option: str = "devices"  # "trainer.devices", "--devices"
    count_hint: str = "devices=4 device_type=cpu, or cpu*4"  # how to ask for N devices of a type
    list_hint: str = "cuda:0,cuda:2"  # how to list devices


def is_count(spec: object) -> bool:
    """Whether a device spec is a count (``4``, ``cpu*4``) rather than devices named one by one."""
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return False
    text = str(spec).strip()
    return text.isdigit() or "*" in text


def device_list(spec: object, device_type: str = "auto", syntax: SpecSyntax = SpecSyntax()) -> list[str]:
    """Device specs as PyTorch users write them, to a list of device names.

    ``cuda:0`` is GPU 0 and ``cuda:0,cuda:2`` (or a list) several; ``cuda`` is every GPU,
    ``cpu`` one CPU replica, ``auto`` every GPU or else four CPU replicas. A count is a
    separate form: an integer ``N`` (``device_type`` says of what: cpu, cuda, or auto for
    cuda where there is a GPU), or ``cpu*N`` / ``cuda*N``. A device may repeat: replicas
    then share it (several CPU "devices", or streams on one GPU).
    """
    if isinstance(spec, bool) or spec is None:
        raise _spec_error(spec, syntax, "give devices")
    if device_type not in DEVICE_TYPES:
        raise CollectiveInputError(
            f"{syntax.option.replace('devices', 'device_type')}={device_type} is not valid; "
            f"valid choices: {', '.join(DEVICE_TYPES)}"
        )
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        names = [str(s).strip() for s in spec]
    else:
        text = str(spec).strip()
        if is_count(text):
            kind, _, count = text.rpartition("*") if "*" in text else (device_type, "", text)
            if kind not in DEVICE_TYPES or not count.isdigit() or int(count) < 1:
                raise _spec_error(text, syntax, "a count is a positive N, or cpu*N / cuda*N")
            return _count(int(count), kind, text, syntax)
        if text == "auto":
            return _count(cuda_device_count(), "cuda", text, syntax) if cuda_device_count() else ["cpu"] * 4
        if text == "cuda":
            require_cuda(f"{syntax.option}=cuda")
            return [f"cuda:{i}" for i in range(cuda_device_count())]
        names = [s.strip() for s in text.split(",")]
    for name in names:
        kind, _, index = name.partition(":")
        if kind == "cpu" and index:
            raise _spec_error(name, syntax, f"a CPU device has no index (for {index} CPU replicas: cpu*{index})")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
            raise _spec_error(name, syntax, "a device is cpu, cuda or cuda:N (GPU N)")
        if kind == "cuda":
            require_cuda(f"{syntax.option}={name}")
            gpus = cuda_device_count()
            if index and int(index) >= gpus:
                raise _spec_error(name, syntax, f"this machine has {gpus} GPU(s): cuda:0..cuda:{gpus - 1}")
    return names


def _count(n: int, kind: str, text: str, syntax: SpecSyntax) -> list[str]:
    if kind == "auto":
        kind = "cuda" if cuda_device_count() else "cpu"
    if kind == "cpu":
        return ["cpu"] * n
    require_cuda(f"{syntax.option}={text}")
    if n > cuda_device_count():
        raise _spec_error(
            text,
            syntax,
            f"it asks for {n} GPUs but this machine has {cuda_device_count()}; to put several replicas on one GPU "
            f"list them, e.g. cuda:0,cuda:0",
        )
    return [f"cuda:{i}" for i in range(n)]


def _spec_error(value: object, syntax: SpecSyntax, why: str) -> CollectiveInputError:
    return CollectiveInputError(
        f"{syntax.option}={value} is not valid: {why}; valid: auto, cuda, cuda:0, {syntax.list_hint}, cpu, "
        f"or a count ({syntax.count_hint})"
    )
