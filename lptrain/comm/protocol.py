"""The one communicator protocol: what every communicator offers and answers.

Every communicator, whichever executor runs it (in one process over several devices,
across processes over ``torch.distributed``, both as a hierarchy, or ``auto`` choosing
among them), is called the same way and answers the same questions, so a caller (the
trainer, the DDP hook, the benchmark) neither knows which kind it holds nor probes it
with ``getattr``.

``tensors`` is this process's tensors, one per device it drives, changed in place: in
one process one per device; across processes one, given in a list or bare; in a
hierarchy one per local device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.transport import LinkCost

Tensors = Sequence[torch.Tensor] | torch.Tensor

# What ``describe`` tells: "choice", the algorithm chosen for each message and why (auto);
# "execution", how the messages run (the CUDA reduce kernel of each pair of GPUs, the
# cuda_graph decisions, the transport the segments and blocks were sized for).
TOPICS = ("choice", "execution")


@runtime_checkable
class Communicator(Protocol):
    """In-place ``allreduce``, ``reduce`` and ``broadcast`` of this process's tensors."""

    name: str  # the algorithm: lp, mst, be, ring, nccl or auto
    world_size: int  # how many tensors take part, over every process
    link: LinkCost | None  # the transport across processes as measured; None in one process

    def allreduce(self, tensors: Tensors, op: str = "sum") -> None:
        """Sum (``op="sum"``) or average (``"avg"``) every tensor; all end bitwise identical."""
        ...

    def reduce(self, tensors: Tensors, root: int = 0, op: str = "sum") -> None:
        """Sum or average every tensor into the one of rank ``root``; the others are unchanged."""
        ...

    def broadcast(self, tensors: Tensors, root: int = 0) -> None:
        """Copy the tensor of rank ``root`` into every other."""
        ...

    def describe(self, topic: str | None = None) -> list[str]:
        """What this communicator decided and why, one line each, on ``topic`` (one of
        ``TOPICS``; None: all of them)."""
        ...

    def prepare(self, op: str, nbytes: int) -> None:
        """Get ready for ``op`` on messages of ``nbytes`` bytes (``auto`` chooses and builds
        its communicator now, so ``describe`` can tell before the first call)."""
        ...


def wants(topic: str | None, which: str) -> bool:
    """Whether ``describe(topic)`` asks for the lines on ``which``; an unknown topic is refused."""
    if topic is not None and topic not in TOPICS:
        raise CollectiveInputError(f"unknown topic {topic!r}; valid topics: {', '.join(TOPICS)} (or None: all)")
    return topic is None or topic == which
