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

from lptrain.comm.checks import check_arguments, first_tensor
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.protocol import Communicator, wants


class HierarchicalCommunicator:
    """``local`` inside (an in-process communicator over this process's ``devices``), ``remote``
    across (one tensor per process, with this process's ``rank``)."""

    def __init__(self, local: Communicator, remote: Communicator) -> None:
        self.local, self.remote = local, remote
        self.name = remote.name
        self.devices = local.devices
        self.world_size = local.world_size * remote.world_size
        self.link = remote.link

    def __repr__(self) -> str:
        return f"HierarchicalCommunicator({self.local!r} inside, {self.remote!r} across)"

    def _check(self, tensors: Sequence[torch.Tensor], root: int | None, op: str | None, what: str) -> None:
        """The checks every executor shares, before either part touches a tensor; then the
        root, which must be replica 0 (the first device of process 0)."""
        check_arguments(self.world_size, root=root, op=op, dtype=first_tensor(tensors).dtype)
        if root not in (None, 0):
            raise CollectiveInputError(f"the hierarchical {what} replica 0, got root={root}")

    def allreduce(self, tensors: Sequence[torch.Tensor], op: str = "sum") -> None:
        self._check(tensors, None, op, "allreduce")
        self.local.reduce(tensors, root=0)
        self.remote.allreduce(tensors[:1])
        if op == "avg":
            tensors[0].div_(self.world_size)
        self.local.broadcast(tensors, root=0)

    def reduce(self, tensors: Sequence[torch.Tensor], root: int = 0, op: str = "sum") -> None:
        """Into the first device of process 0 (``root`` must be 0); other tensors are unchanged."""
        self._check(tensors, root, op, "reduce goes to")
        keep = tensors[0].clone() if self.remote.rank != 0 else None
        self.local.reduce(tensors, root=0)
        self.remote.reduce(tensors[:1], root=0)
        if keep is not None:
            tensors[0].copy_(keep)
        elif op == "avg":
            tensors[0].div_(self.world_size)

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        self._check(tensors, root, None, "broadcast starts at")
        self.remote.broadcast(tensors[:1], root=0)
        self.local.broadcast(tensors, root=0)

    def describe(self, topic: str | None = None) -> list[str]:
        """Both parts' lines: the choices prefixed with where they run ("inside the process, ",
        "across processes, "); how they run as each part says it (the part across processes
        names itself)."""
        lines = []
        if wants(topic, "choice"):
            lines += [f"inside the process, {line}" for line in self.local.describe("choice")]
            lines += [f"across processes, {line}" for line in self.remote.describe("choice")]
        if wants(topic, "execution"):
            lines += self.local.describe("execution") + self.remote.describe("execution")
        return lines

    def prepare(self, op: str, nbytes: int) -> None:
        """Forwarded to both parts."""
        self.local.prepare(op, nbytes)
        self.remote.prepare(op, nbytes)

    def schedule(self, op: str, count: int, root: int | None = 0, dtype: torch.dtype = torch.float32):
        return self.remote.schedule(op, count, root, dtype)
