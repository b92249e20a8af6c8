"""The argument checks every executor shares, written once.

In one process, across processes, through a hierarchy or through ``auto``: a collective
refuses a root that is not a rank, a reduce op it does not know, an average of integers
and a dtype its transport cannot move with the same sentence, before any tensor is
touched. Each executor adds only what is its own (one tensor per device and their
devices in one process; one tensor per rank across processes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lptrain.comm.errors import CollectiveInputError

SUPPORTED_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
)
HALF_DTYPES = (torch.float16, torch.bfloat16)
# NCCL has no 16-bit integer type (ncclInt8/Uint8/Int32/Uint32/Int64/Uint64 and the floats):
# an int16 tensor makes torch's NCCL bindings fail with "Unconvertible NCCL type".
NCCL_DTYPES = tuple(d for d in SUPPORTED_DTYPES if d is not torch.int16)
REDUCE_OPS = ("sum", "avg")


def backend_dtypes(backend: str) -> tuple[torch.dtype, ...]:
    """The dtypes a torch.distributed backend (or the single-process nccl) can move."""
    return NCCL_DTYPES if backend == "nccl" else SUPPORTED_DTYPES


def check_dtype(dtype: torch.dtype, valid: Sequence[torch.dtype], who: str = "") -> None:
    """A clear refusal of a dtype the algorithm or its transport cannot move."""
    if dtype not in valid:
        names = ", ".join(str(d).removeprefix("torch.") for d in valid)
        raise CollectiveInputError(f"dtype {dtype} is not supported{who}; valid dtypes: {names}")


def check_root(root: object, world_size: int) -> None:
    """``root`` must be a rank (an int, not a bool) in ``0..world_size - 1``."""
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < world_size:
        raise CollectiveInputError(f"root must be a rank in 0..{world_size - 1}, got {root!r}")


def check_op(op: object, dtype: torch.dtype | None = None) -> None:
    """``op`` must be one of ``REDUCE_OPS``; an average needs a floating-point ``dtype``."""
    if op not in REDUCE_OPS:
        raise CollectiveInputError(f"unknown op {op!r}; valid ops: {', '.join(REDUCE_OPS)}")
    if op == "avg" and dtype is not None and not dtype.is_floating_point:
        raise CollectiveInputError(f"op='avg' needs a floating-point dtype, got {dtype}; use op='sum'")


def check_arguments(
    world_size: int, *, root: object = None, op: object = None, dtype: torch.dtype | None = None
) -> None:
    """The root (where the collective has one) and the reduce op (where it reduces)."""
    if root is not None:
        check_root(root, world_size)
    if op is not None:
        check_op(op, dtype)


def first_tensor(tensors: object) -> torch.Tensor:
    """The first of this process's tensors (or the one given bare), to size a call by."""
    first = tensors if isinstance(tensors, torch.Tensor) else None
    if first is None and isinstance(tensors, Sequence) and len(tensors) > 0:
        first = tensors[0]
    if not isinstance(first, torch.Tensor):
        raise CollectiveInputError(
            f"expected this process's tensors (one per device, or one tensor), got {type(tensors).__name__}"
        )
    return first
