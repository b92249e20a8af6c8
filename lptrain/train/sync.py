"""The paper's two BSP-SGD iterations, as two strategies the trainer's step calls.

* ``allreduce``: allreduce the gradients; every replica holds the average and takes the
  same step (the modern form, DDP's).
* ``reduce``: reduce the gradients to the root replica, update there, then broadcast the
  parameters back (the paper's formulation: broadcast, compute, reduce, update).

Both are exact: the replicas end every step bitwise identical. What differs is which
gradients travel, which replicas step, and whether parameters travel back; a strategy
answers those questions, so ``Trainer.train_step`` reads as the paper's iteration with no
test of the mode. Adding a mode is a class here and a line in ``SYNC_STRATEGIES``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class SyncStrategy(ABC):
    """How one step's gradients are combined and the replicas kept identical."""

    name: str
    reduction: str  # the collective the gradients take: its name for profiler ranges and comm=auto

    @abstractmethod
    def reduce_gradients(self, comm: Any, grads: Sequence[Any]) -> None:
        """Average one bucket's gradients (one tensor per replica of this process) with ``comm``."""

    @abstractmethod
    def updated(self, per_replica: Sequence[T]) -> Sequence[T]:
        """Of something held per replica (gradients, models, optimizers), the entries that
        the update touches: those whose gradient is the average after ``reduce_gradients``."""

    @abstractmethod
    def overflow_counts(self, rank: int) -> bool:
        """Whether process ``rank``'s fp16 overflow verdict counts (it holds the average)."""

    @abstractmethod
    def broadcast_parameters(self, comm: Any, params: Sequence[Any], buckets: Sequence[tuple[int, int]]) -> None:
        """After the update: make every replica's flat parameters equal to the root's."""

    @abstractmethod
    def messages(self, elements: int, grad_itemsize: int, param_itemsize: int) -> list[tuple[str, int]]:
        """(collective, bytes) of each message one bucket of ``elements`` costs per step."""

    def bytes_per_step(self, elements: int, grad_itemsize: int, param_itemsize: int) -> int:
        """Bytes each replica sends per step for ``elements`` parameters."""
        return sum(nbytes for _, nbytes in self.messages(elements, grad_itemsize, param_itemsize))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AllreduceSync(SyncStrategy):
    """Every replica gets the average gradient and steps; no parameters travel."""

    name = reduction = "allreduce"

    def reduce_gradients(self, comm: Any, grads: Sequence[Any]) -> None:
        comm.allreduce(grads, op="avg")

    def updated(self, per_replica: Sequence[T]) -> Sequence[T]:
        return per_replica

    def overflow_counts(self, rank: int) -> bool:
        return True

    def broadcast_parameters(self, comm: Any, params: Sequence[Any], buckets: Sequence[tuple[int, int]]) -> None:
        return None  # the replicas took the same step on the same gradient

    def messages(self, elements: int, grad_itemsize: int, param_itemsize: int) -> list[tuple[str, int]]:
        return [("allreduce", elements * grad_itemsize)]


class ReduceSync(SyncStrategy):
    """The root gets the average gradient and steps; its parameters are broadcast back."""

    name = reduction = "reduce"
    ROOT = 0

    def reduce_gradients(self, comm: Any, grads: Sequence[Any]) -> None:
        comm.reduce(grads, root=self.ROOT, op="avg")

    def updated(self, per_replica: Sequence[T]) -> Sequence[T]:
        return per_replica[: self.ROOT + 1]

    def overflow_counts(self, rank: int) -> bool:
        return rank == self.ROOT  # only the root process holds the sum

    def broadcast_parameters(self, comm: Any, params: Sequence[Any], buckets: Sequence[tuple[int, int]]) -> None:
        for a, b in buckets:
            comm.broadcast([w[a:b] for w in params], root=self.ROOT)

    def messages(self, elements: int, grad_itemsize: int, param_itemsize: int) -> list[tuple[str, int]]:
        return [("reduce", elements * grad_itemsize), ("broadcast", elements * param_itemsize)]


# trainer.sync: its name -> the strategy (stateless: one instance each serves every trainer)
SYNC_STRATEGIES: dict[str, SyncStrategy] = {s.name: s for s in (AllreduceSync(), ReduceSync())}
SYNC_MODES = tuple(SYNC_STRATEGIES)
