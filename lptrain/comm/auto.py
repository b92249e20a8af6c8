"""``comm=auto``: per call, the algorithm this machine's measurements say is fastest.

For each (operation, message size) the first call asks the tuning file
(``lptrain.comm.tuning``, written by ``lptrain-bench --save-tuning``); where the file has
no answer (no tuning file, an operation it did not measure, a size outside its range) the
simulator prices lp, lp-rb, mst, be and ring on a model of the transport and the cheapest
wins. The choice is kept for later calls of the same shape and recorded in ``decisions``
(the trainer prints them and writes them to TensorBoard). The chosen communicators are
built once each and called directly, so a call costs one dictionary look-up more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lptrain.comm.algorithms import SCHEDULES, VARIANTS, WITH_VARIANTS
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.sizes import format_size
from lptrain.comm.tuning import Choice, TuningTable

SIMULATED = WITH_VARIANTS


def simulated_choice(op: str, nbytes: int, world_size: int, topology: str) -> Choice:
    """The cheapest schedule by the simulator on ``topology`` (LP at its cost-model block)."""
    from lptrain.sim.predict import predict
    from lptrain.sim.topology import build_topology

    topo = build_topology(topology, world_size)
    algos = SIMULATED if op == "allreduce" else SCHEDULES
    times = {a: predict(a, op, topo, max(nbytes, 4)).seconds * 1e6 for a in algos}
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    best = ranked[0][0]
    detail = f"{format_size(nbytes)} {op} on the {topology} model: " + ", ".join(f"{a} {t:.0f} us" for a, t in ranked)
    base, options = VARIANTS.get(best, (best, {}))
    return Choice(base, dict(options), "simulated", detail)


class AutoCommunicator:
    """Delegates each collective to the communicator chosen for its operation and size."""

    name = "auto"

    def __init__(
        self,
        build: Callable[[str, dict[str, Any]], Any],
        *,
        executor: str,
        device_type: str,
        world_size: int,
        tuning: str | None = None,
        topology: str | None = None,
        devices: tuple[torch.device, ...] | None = None,
        rank: int = 0,
    ) -> None:
        self._build = build
        self.world_size, self.rank = world_size, rank
        self.devices = devices
        self.topology = topology or ("pcie" if device_type == "cuda" else "host")
        self.table = TuningTable.load(tuning) if tuning else None
        if self.table is not None:
            mismatch = self.table.fits(executor, device_type, world_size)
            if mismatch:
                raise CollectiveInputError(
                    f"tuning file {tuning!r} does not describe this run: {mismatch}; measure this setting with "
                    "lptrain-bench --save-tuning FILE (under torchrun for processes) or leave comm.options.tuning "
                    "null to let the simulator choose"
                )
        self._comms: dict[tuple, Any] = {}
        self._chosen: dict[tuple[str, int], Any] = {}
        self.decisions: list[tuple[str, int, Choice]] = []  # in the order first met

    def __repr__(self) -> str:
        source = self.table.path if self.table is not None else f"the simulator ({self.topology} model)"
        return f"AutoCommunicator(from {source}, {self.world_size} ranks)"

    def choose(self, op: str, nbytes: int) -> Choice:
        """What runs ``op`` on ``nbytes`` bytes, and why."""
        choice = self.table.choose(op, nbytes) if self.table is not None else None
        return choice or simulated_choice(op, nbytes, self.world_size, self.topology)

    def prepare(self, op: str, nbytes: int) -> Any:
        """Choose (once) and build the communicator for ``op`` on ``nbytes`` bytes.

        A caller that knows its message sizes (the trainer's gradient buckets) calls this up
        front, so the decisions can be shown before the first step."""
        key = (op, nbytes)
        comm = self._chosen.get(key)
        if comm is None:
            choice = self.choose(op, nbytes)
            self.decisions.append((op, nbytes, choice))
            build_key = (choice.algo, tuple(sorted(choice.options.items())))
            if build_key not in self._comms:
                self._comms[build_key] = self._build(choice.algo, dict(choice.options))
            comm = self._chosen[key] = self._comms[build_key]
        return comm

    def _for(self, op: str, tensors) -> Any:
        first = tensors if isinstance(tensors, torch.Tensor) else tensors[0]
        return self.prepare(op, first.numel() * first.element_size())

    def broadcast(self, tensors, root: int = 0) -> None:
        self._for("broadcast", tensors).broadcast(tensors, root=root)

    def reduce(self, tensors, root: int = 0, op: str = "sum") -> None:
        self._for("reduce", tensors).reduce(tensors, root=root, op=op)

    def allreduce(self, tensors, op: str = "sum") -> None:
        self._for("allreduce", tensors).allreduce(tensors, op=op)

    def describe(self) -> list[str]:
        """One line per decision so far: what was chosen for which call, from what."""
        return [
            f"{op} of {format_size(nbytes)}: {c.label} ({c.source}: {c.detail})" for op, nbytes, c in self.decisions
        ]
