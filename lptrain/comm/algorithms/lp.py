"""Linear pipelining (LP), the paper's method.

The ranks form a chain; the message is cut into blocks, and at every step each link of
the chain carries a different block, so all links work at once. A broadcast or reduce
takes ``P - 2 + k`` steps for ``k`` blocks: for large messages its time approaches
``n * beta`` whatever the number of ranks.

Allreduce comes in the paper's two constructions:

* ``reduce_broadcast`` (A): reduce to the end of the chain, then broadcast back along
  the reverse links once the reduce has finished: ``2 (P - 2 + k)`` steps.
* ``overlapped`` (B): each block starts back along the reverse links as soon as it is
  fully reduced, so forward and reverse links work together: ``2P - 3 + k`` steps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from lptrain.comm.algorithms.options import PCIE, AlgorithmOptions, Sizing
from lptrain.comm.algorithms.order import check_order
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.schedule import Kind, Schedule, ScheduleBuilder, block_bounds
from lptrain.comm.sizes import parse_size

NAME = "lp"
# How the multi-process executor may overlap steps (lptrain.comm.program.ISSUE_POLICIES):
# the chain's pipeline is the point: every rank forwards each segment the moment it is in.
ISSUE_ORDER = {"broadcast": "eager", "reduce": "eager", "allreduce": "eager"}
ALLREDUCE_MODES = ("overlapped", "reduce_broadcast")


def issue_orders_for(options: Mapping[str, Any]) -> dict[str, str]:
    """``ISSUE_ORDER`` under ``options``: the reduce-then-broadcast allreduce holds each
    broadcast block back until the reduce is in (``phases``), as its construction says;
    eager, the chain's last rank would start the broadcast into a port the reduce still
    needs (``lptrain.comm.program`` has the figures)."""
    if options.get("allreduce") == "reduce_broadcast":
        return {**ISSUE_ORDER, "allreduce": "phases"}
    return ISSUE_ORDER


# Block-size rule defaults: PCIe Gen3 figures from the paper (alpha ~ 15 us, ~11 GB/s).
DEFAULT_ALPHA_S = PCIE.alpha_s
DEFAULT_BETA_S_PER_BYTE = PCIE.beta_s_per_byte
MIN_AUTO_BLOCK_BYTES = 256 * 1024
MAX_AUTO_BLOCK_BYTES = 16 * 1024 * 1024


def pipeline_fill(op: str, world_size: int, mode: str = "overlapped") -> int:
    """Steps a ``k``-block schedule takes beyond ``k``: ``P - 2`` for broadcast and reduce
    (and each half of ``reduce_broadcast``), ``2P - 3`` for the overlapped allreduce, whose
    blocks travel the chain and back."""
    if op == "allreduce" and mode == "overlapped":
        return 2 * world_size - 3
    return world_size - 2


def optimal_block_bytes(
    message_bytes: int,
    world_size: int,
    alpha: float = DEFAULT_ALPHA_S,
    beta: float = DEFAULT_BETA_S_PER_BYTE,
    fill: int | None = None,
) -> int:
    """The block size minimising ``(fill + n/b)(alpha + b beta)``, clamped to 256 KiB..16 MiB.

    ``b* = sqrt(n alpha / (fill beta))``, where ``fill`` is the pipeline's extra steps
    (``pipeline_fill``; default ``P - 2``, a broadcast's). With no pipeline to fill (a
    broadcast or reduce between two ranks) the largest block wins, so the upper clamp
    applies. An overlapped allreduce between two ranks does fill one step: with a single
    block its two directions would never carry data at the same time.
    """
    if message_bytes <= 0:
        return MIN_AUTO_BLOCK_BYTES
    fill = world_size - 2 if fill is None else fill
    best = float(MAX_AUTO_BLOCK_BYTES) if fill <= 0 else math.sqrt(message_bytes * alpha / (fill * beta))
    return int(min(max(best, MIN_AUTO_BLOCK_BYTES), MAX_AUTO_BLOCK_BYTES))


class LpOptions(AlgorithmOptions):
    """``block_size``: bytes per block (an int, ``"4M"``, or ``"auto"``: the cost model's
    optimum for the link figures, see ``optimal_block_bytes``); ``allreduce``:
    ``"overlapped"`` or ``"reduce_broadcast"``, the paper's two constructions. The chain is
    the ``order`` every algorithm takes (``lptrain.comm.algorithms.order``)."""

    defaults = {"block_size": "auto", "allreduce": "overlapped"}

    def check(self, options: dict[str, Any], world_size: int) -> dict[str, Any]:
        mode = options["allreduce"]
        if mode not in ALLREDUCE_MODES:
            raise CollectiveInputError(f"unknown lp allreduce mode {mode!r}; valid modes: {', '.join(ALLREDUCE_MODES)}")
        block_size = options["block_size"]
        if block_size != "auto" and parse_size(block_size, "lp block_size") < 1:
            raise CollectiveInputError(f"lp block_size must be at least 1 byte, got {block_size!r}")
        return dict(options)

    def follows_sizing(self, options: dict[str, Any]) -> bool:
        return options["block_size"] == "auto"

    def keywords(
        self, op: str, options: dict[str, Any], world_size: int, nbytes: int, itemsize: int, sizing: Sizing
    ) -> dict[str, Any]:
        block_size = options["block_size"]
        if block_size == "auto":
            block_bytes = auto_block_bytes(op, world_size, nbytes, options["allreduce"], sizing)
        else:
            block_bytes = parse_size(block_size, "lp block_size")
        keywords = {"block": max(1, block_bytes // itemsize)}
        return {**keywords, "mode": options["allreduce"]} if op == "allreduce" else keywords


OPTIONS = LpOptions()


def auto_block_bytes(op: str, world_size: int, nbytes: int, mode: str, sizing: Sizing) -> int:
    """``block_size=auto``: the cost model's block for ``op`` on an ``nbytes`` message with
    the link figures of ``sizing``, no smaller than its floor (across processes, a segment);
    on a slow link, where the chain has a pipeline to fill, the link's block
    (``Sizing.link_block``, ``lptrain.comm.program.pipeline_block_bytes`` says why)."""
    fill = pipeline_fill(op, world_size, mode)
    if sizing.link_block is not None and fill > 0:
        return sizing.link_block
    block = optimal_block_bytes(nbytes, world_size, sizing.alpha_s, sizing.beta_s_per_byte, fill)
    return block if sizing.min_block is None else max(block, sizing.min_block(nbytes))


def _rotate_to(chain: list[int], rank: int) -> list[int]:
    i = chain.index(rank)
    return chain[i:] + chain[:i]


def _pipeline(
    steps: dict[int, list[tuple[int, int, int, int, Kind]]],
    chain: list[int],
    bounds: list[int],
    kind: Kind,
    offset: int = 0,
) -> None:
    """Block ``j`` crosses link ``chain[i] -> chain[i+1]`` at step ``offset + j + i``."""
    for j in range(len(bounds) - 1):
        t0 = offset + j
        for i in range(len(chain) - 1):
            steps[t0 + i].append((chain[i], chain[i + 1], bounds[j], bounds[j + 1], kind))


def _finish(steps: dict, op: str, label: str, world_size: int, count: int, root: int | None) -> Schedule:
    builder = ScheduleBuilder()
    for t in sorted(steps):
        builder.step(steps[t])
    return builder.build(op, label, world_size, count, root)


def broadcast(
    world_size: int, count: int, root: int = 0, *, block: int, order: Sequence[int] | None = None
) -> Schedule:
    """Pipelined broadcast down the chain, starting at ``root``."""
    chain = _rotate_to(check_order(order, world_size), root)
    steps: dict = defaultdict(list)
    _pipeline(steps, chain, block_bounds(count, block), Kind.COPY)
    return _finish(steps, "broadcast", f"lp(block={block})", world_size, count, root)


def reduce(world_size: int, count: int, root: int = 0, *, block: int, order: Sequence[int] | None = None) -> Schedule:
    """Pipelined reduce up the chain, ending at ``root`` (the broadcast chain reversed)."""
    chain = _rotate_to(check_order(order, world_size), root)[::-1]
    steps: dict = defaultdict(list)
    _pipeline(steps, chain, block_bounds(count, block), Kind.REDUCE)
    return _finish(steps, "reduce", f"lp(block={block})", world_size, count, root)


def allreduce(
    world_size: int,
    count: int,
    *,
    block: int,
    order: Sequence[int] | None = None,
    mode: str = "overlapped",
) -> Schedule:
    """Reduce along the chain to its last rank and broadcast back along the reverse links."""
    if mode not in ALLREDUCE_MODES:
        raise ValueError(f"unknown lp allreduce mode {mode!r}; valid modes: {', '.join(ALLREDUCE_MODES)}")
    chain = check_order(order, world_size)
    bounds = block_bounds(count, block)
    k, p = len(bounds) - 1, world_size
    steps: dict = defaultdict(list)
    _pipeline(steps, chain, bounds, Kind.REDUCE)
    # Overlapped: block j is complete at the chain's end after step j + P - 2 and turns
    # back at once. Reduce-then-broadcast: it waits for the last reduce step, k + P - 3.
    back_offset = p - 1 if mode == "overlapped" else k + p - 2
    _pipeline(steps, chain[::-1], bounds, Kind.COPY, back_offset)
    return _finish(steps, "allreduce", f"lp(block={block}, {mode})", world_size, count, None)
