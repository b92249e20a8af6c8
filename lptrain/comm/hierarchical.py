"""Several devices per process, several processes: reduce inside, then across, then back.

A node of GPUs runs as one process with the in-process executor (peer copies over the
node's links) while the nodes talk through ``torch.distributed``: an allreduce is a
local reduce to the process's first device, an allreduce of that tensor across the
processes, and a local broadcast. ``tensors[i]`` is on the process's ``i``-th device;
the ``world_size`` is devices per process times processes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lptrain.comm.communicator import Communicator
from lptrain.comm.distributed import DistributedCommunicator
from lptrain.comm.errors import CollectiveInputError


class HierarchicalCommunicator:
    def __init__(self, local: Communicator, remote: DistributedCommunicator) -> None:
        self.local, self.remote = local, remote
        self.name = remote.name
        self.devices = local.devices
        self.world_size = local.world_size * remote.world_size

    def __repr__(self) -> str:
        return f"HierarchicalCommunicator({self.local!r} inside, {self.remote!r} across)"

    def _avg(self, tensor: torch.Tensor, op: str) -> None:
        if op == "avg":
            if not tensor.is_floating_point():
                raise CollectiveInputError(f"op='avg' needs a floating-point dtype, got {tensor.dtype}; use op='sum'")
            tensor.div_(self.world_size)

    def allreduce(self, tensors: Sequence[torch.Tensor], op: str = "sum") -> None:
        self.local.reduce(tensors, root=0)
        self.remote.allreduce(tensors[0])
        self._avg(tensors[0], op)
        self.local.broadcast(tensors, root=0)

    def reduce(self, tensors: Sequence[torch.Tensor], root: int = 0, op: str = "sum") -> None:
        """Into the first device of process 0 (``root`` must be 0); other tensors are unchanged."""
        if root != 0:
            raise CollectiveInputError(f"the hierarchical reduce goes to replica 0, got root={root}")
        keep = tensors[0].clone() if self.remote.rank != 0 else None
        self.local.reduce(tensors, root=0)
        self.remote.reduce(tensors[0], root=0)
        if keep is None:
            self._avg(tensors[0], op)
        else:
            tensors[0].copy_(keep)

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        if root != 0:
            raise CollectiveInputError(f"the hierarchical broadcast starts at replica 0, got root={root}")
        self.remote.broadcast(tensors[0], root=0)
        self.local.broadcast(tensors, root=0)

    def schedule(self, op: str, count: int, root: int | None = 0, dtype: torch.dtype = torch.float32):
        return self.remote.schedule(op, count, root, dtype)
