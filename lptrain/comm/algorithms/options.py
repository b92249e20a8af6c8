"""An algorithm's options, declared the same way by every algorithm module.

Each module in ``lptrain.comm.algorithms`` sets ``OPTIONS`` to an ``AlgorithmOptions``:
the options a user may set, with their defaults, how they are checked, and the keyword
arguments they give the module's schedule functions for one message. Most algorithms
have none (``OPTIONS = AlgorithmOptions()``); LP declares its block, chain order and
allreduce construction. ``lptrain.comm.algorithms.schedule_builders`` turns any module and
its options into schedule builders the same way, so nothing downstream (the registry,
the simulator, ``auto``) knows one algorithm from another.

Where an option depends on the message (LP's automatic block), it is sized with the
link figures of ``Sizing``: measured across processes, a memory copy for CPU devices,
the paper's PCIe for GPUs. No torch here: these are plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sizing:
    """The figures an algorithm sizes its pieces by: the cost of one message, the time per
    byte on a link, and (across processes) a floor under an automatic piece as a function
    of the message's bytes (the executor's segment: on a fast link a smaller block only adds
    messages). ``link_block``: on a slow link, a pipelined chain's block
    (``lptrain.comm.program.pipeline_block_bytes``), which replaces the cost model's and the
    floor there, since a message's cost overlaps the link's transfer."""

    alpha_s: float
    beta_s_per_byte: float
    min_block: Callable[[int], int] | None = None
    link_block: int | None = None

    def floored(self, min_block: Callable[[int], int] | None) -> Sizing:
        """The same figures with ``min_block`` as the floor."""
        return Sizing(self.alpha_s, self.beta_s_per_byte, min_block, self.link_block)

    def on_link(self, link_block: int | None) -> Sizing:
        """The same figures with ``link_block`` as a pipelined chain's block."""
        return Sizing(self.alpha_s, self.beta_s_per_byte, self.min_block, link_block)


# GPUs in one process: PCIe Gen3 as in the paper (alpha ~ 15 us, ~11 GB/s).
PCIE = Sizing(15e-6, 1 / 11e9)
# Replicas that share one GPU: every "link" is a copy within the GPU's own memory, so the
# pipeline's blocks share one memory system and only their count costs: a launch, an event
# and a wait each from Python (~10 us). The memory moves ~1.9 TB/s (an H200's memcpy at
# 64 MiB, docs/BENCHMARKS.md). Sized for PCIe instead, an LP allreduce of 64 MiB over four
# replicas issued 276 blocks against the ring's 24, and reached half the others' bandwidth.
ONE_GPU = Sizing(10e-6, 1 / 1.9e12)
# CPU "devices" in one process: ~10 us of dispatch per transfer, ~13 GB/s per copy (measured
# with lptrain-bench on the 2-core development machine; the current figures are in
# docs/BENCHMARKS.md, "In-process collectives against memcpy").
HOST = Sizing(10e-6, 1 / 13e9)


class AlgorithmOptions:
    """No options: the ranks and the message decide the schedule. Subclasses declare theirs."""

    defaults: Mapping[str, Any] = {}

    def check(self, options: dict[str, Any], world_size: int) -> dict[str, Any]:
        """The options (every one of ``defaults``, given or not) checked for ``world_size``
        ranks and settled (an order as a list, for instance); a bad one raises a clear error."""
        return dict(options)

    def follows_sizing(self, options: dict[str, Any]) -> bool:
        """Whether these (settled) options size anything from the link figures, so that
        across processes the link is worth measuring for them."""
        return False

    def keywords(
        self, op: str, options: dict[str, Any], world_size: int, nbytes: int, itemsize: int, sizing: Sizing
    ) -> dict[str, Any]:
        """The keyword arguments of the module's ``op`` function for one message of
        ``nbytes`` bytes in elements of ``itemsize`` bytes."""
        return {}
