"""``comm=auto``: per call, the algorithm this machine's measurements say is fastest.

For each (operation, message size) the first call asks the tuning file
(``lptrain.auto.tuning``, written by ``lptrain-bench --save-tuning``); where the file has
no answer (no tuning file, an operation it did not measure, a size outside its range) the
simulator prices lp, lp-rb, mst, be and ring, each in the rank orders the machine calls
for, on a model of the machine and the cheapest wins (``lptrain.auto.simulated``). The
model is a shipped one (``host``; ``pcie`` on GPUs), racks declared in the configuration
(``racks:2@1/2``, ``lptrain.sim.declared``), or racks measured across the processes at
start (``probe``: ``lptrain.auto.probed``). The choice is kept for later calls of the same shape
and recorded in ``decisions`` (``describe("choice")`` tells them: the trainer prints them
and writes them to TensorBoard). The chosen communicators are built once each, by the
``build`` function given (the factory's), and called directly, so a call costs one
dictionary look-up more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lptrain.auto.simulated import simulated_choice
from lptrain.auto.tuning import Choice, TuningTable
from lptrain.comm.checks import check_arguments, first_tensor
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.protocol import Communicator, Tensors, wants
from lptrain.comm.sizes import format_size
from lptrain.comm.transport import LinkCost
from lptrain.sim.declared import topology_of
from lptrain.sim.topology import Topology


class AutoCommunicator:
    """Delegates each collective to the communicator chosen for its operation and size."""

    name = "auto"
    link: LinkCost | None = None  # it measures nothing itself: the communicators it builds do

    def __init__(
        self,
        build: Callable[[str, dict[str, Any]], Communicator],
        *,
        executor: str,
        device_type: str,
        world_size: int,
        tuning: str | None = None,
        topology: str | Topology | None = None,
        devices: tuple[torch.device, ...] | None = None,
        rank: int = 0,
    ) -> None:
        self._build = build
        self.world_size, self.rank = world_size, rank
        self.devices = devices
        topology = topology or ("pcie" if device_type == "cuda" else "host")
        if topology == "probe":
            raise CollectiveInputError(
                "comm=auto: topology=probe measures the links between processes; in one process name a model "
                "(host, pcie ...) or declare racks (racks:2@1/2)"
            )
        try:
            self.model = topology if isinstance(topology, Topology) else topology_of(topology, world_size)
        except ValueError as err:
            raise CollectiveInputError(f"comm=auto: {err}") from None
        self.topology = topology if isinstance(topology, str) else topology.name
        self.table = TuningTable.load(tuning) if tuning else None
        if self.table is not None:
            mismatch = self.table.fits(executor, device_type, world_size)
            if mismatch:
                raise CollectiveInputError(
                    f"tuning file {tuning!r} does not describe this run: {mismatch}; measure this setting with "
                    "lptrain-bench --save-tuning FILE (under torchrun for processes) or leave comm.options.tuning "
                    "null to let the simulator choose"
                )
        self._comms: dict[tuple, Communicator] = {}
        self._chosen: dict[tuple[str, int], Communicator] = {}
        self.decisions: list[tuple[str, int, Choice]] = []  # in the order first met

    def __repr__(self) -> str:
        source = self.table.path if self.table is not None else f"the simulator ({self.topology} model)"
        return f"AutoCommunicator(from {source}, {self.world_size} ranks)"

    def choose(self, op: str, nbytes: int) -> Choice:
        """What runs ``op`` on ``nbytes`` bytes, and why."""
        choice = self.table.choose(op, nbytes) if self.table is not None else None
        return choice or simulated_choice(op, nbytes, self.world_size, self.model)

    def chosen(self, op: str, nbytes: int) -> Communicator:
        """The communicator for ``op`` on ``nbytes`` bytes: chosen and built at the first ask."""
        key = (op, nbytes)
        comm = self._chosen.get(key)
        if comm is None:
            choice = self.choose(op, nbytes)
            self.decisions.append((op, nbytes, choice))
            build_key = (choice.algo, tuple(sorted((k, repr(v)) for k, v in choice.options.items())))
            if build_key not in self._comms:
                self._comms[build_key] = self._build(choice.algo, dict(choice.options))
            comm = self._chosen[key] = self._comms[build_key]
        return comm

    def chose(self, op: str, nbytes: int) -> str:
        """What runs ``op`` on ``nbytes`` bytes, every setting named (``lp block=auto
        order=0-2-1-3``): what a benchmark's row shows beside its time."""
        self.chosen(op, nbytes)
        return next(c.summary for o, n, c in self.decisions if (o, n) == (op, nbytes))

    def prepare(self, op: str, nbytes: int) -> None:
        """Choose (once) and build the communicator for ``op`` on ``nbytes`` bytes.

        A caller that knows its message sizes (the trainer's gradient buckets) calls this up
        front, so the decisions can be shown before the first step."""
        self.chosen(op, nbytes)

    def _for(self, op: str, tensors: Tensors, root: int | None, how: str | None) -> Communicator:
        first = first_tensor(tensors)
        check_arguments(self.world_size, root=root, op=how, dtype=first.dtype)
        return self.chosen(op, first.numel() * first.element_size())

    def broadcast(self, tensors: Tensors, root: int = 0) -> None:
        self._for("broadcast", tensors, root, None).broadcast(tensors, root=root)

    def reduce(self, tensors: Tensors, root: int = 0, op: str = "sum") -> None:
        self._for("reduce", tensors, root, op).reduce(tensors, root=root, op=op)

    def allreduce(self, tensors: Tensors, op: str = "sum") -> None:
        self._for("allreduce", tensors, None, op).allreduce(tensors, op=op)

    def describe(self, topic: str | None = None) -> list[str]:
        """What the choices are made on (where the machine has racks: declared or measured),
        then one line per decision so far (``"choice"``): what was chosen for which call, from what."""
        if not wants(topic, "choice"):
            return []
        simulated = any(c.source == "simulated" for _, _, c in self.decisions)
        machine = [f"machine: {self.machine()}"] if simulated and self.model.layout else []
        return machine + [
            f"{op} of {format_size(nbytes)}: {c.label} ({c.source}: {c.detail})" for op, nbytes, c in self.decisions
        ]

    def machine(self) -> str:
        """The model the simulator prices on, in one phrase."""
        layout = f": {self.model.layout}" if self.model.layout else ""
        return f"{self.topology} model{layout}"
