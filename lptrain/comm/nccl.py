"""``nccl``: the vendor library itself, single-process, through ``torch.cuda.nccl``.

Not a schedule: NCCL picks and runs its own algorithm. It is the baseline the schedules
are held to, behind the same interface (and the same float32 accumulation of half
precision, done by widening before the call).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lptrain.comm.checks import NCCL_DTYPES
from lptrain.comm.communicator import DeviceCommunicator
from lptrain.comm.devices import require_cuda
from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError


def nccl_available() -> bool:
    """True when CUDA is present and this torch build has NCCL."""
    return torch.cuda.is_available() and hasattr(torch._C, "_nccl_all_reduce")


class NcclCommunicator(DeviceCommunicator):
    name = "nccl"
    dtypes = NCCL_DTYPES

    def __init__(self, devices: Sequence[str | torch.device], *, accumulate_fp32: bool = True) -> None:
        require_cuda("the nccl communicator")
        if not nccl_available():
            raise BackendUnavailableError("this torch build has no NCCL (torch.cuda.nccl is missing)")
        super().__init__(devices, accumulate_fp32=accumulate_fp32)
        if any(d.type != "cuda" for d in self.devices):
            raise CollectiveInputError(
                f"nccl needs CUDA devices, got {[str(d) for d in self.devices]}; on CPU use lp, mst, be or ring"
            )
        if len({d.index for d in self.devices}) != len(self.devices):
            raise CollectiveInputError(
                f"single-process nccl needs distinct GPUs, got {[str(d) for d in self.devices]}; "
                "to share one GPU between replicas use lp, mst, be or ring"
            )
        self._nccl = torch.cuda.nccl

    def _run(self, op: str, flat: list[torch.Tensor], root: int | None, inputs_are_scratch: bool) -> None:
        if op == "broadcast":
            self._nccl.broadcast(flat, root=root)
        elif op == "reduce":
            self._nccl.reduce(flat, root=root)
        else:
            self._nccl.all_reduce(flat)
