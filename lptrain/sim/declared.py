"""A machine as a configuration names it: a shipped model, or racks declared in one word.

``comm.options.topology`` (and ``lptrain.ddp.state(algo="auto", topology=...)``) takes the
name of a shipped model (``pcie``, ``host`` ...) or racks written so that a Hydra override
needs no quotes::

    racks:2@1/2               2 racks of consecutive ranks, uplinks at half a port
    racks:2@1/4:interleaved   rank r in rack r mod 2, uplinks at a quarter of a port
    racks:0-1-0-1@0.5         each rank's rack, one per rank

The uplink is a fraction of a port, not a rate: that ratio, not the rate, decides between a
chain and a ring (``lptrain.sim.rates``). The probe across processes
(``lptrain.comm.topology_probe``) describes what it measured in the same terms, so a
measured machine and a declared one are priced alike. Plain data, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lptrain.sim.rates import parse_fraction
from lptrain.sim.topology import NETWORK_BW, PLACEMENTS, TOPOLOGIES, Topology, build_topology, rack_placement

SYNTAX = "racks:R@U, racks:R@U:interleaved or racks:0-0-1-1@U (R racks, uplinks at U of a port such as 1/2)"
_RACKS = re.compile(r"^racks:([0-9]+(?:-[0-9]+)*)@([0-9./]+)(?::([a-z]+))?$")


@dataclass(frozen=True)
class DeclaredRacks:
    """Racks joined by uplinks: how many (or each rank's rack), the uplink as a fraction of
    a port, the port's rate in bytes per second and the cost of a message in seconds (None:
    the racks model's own)."""

    racks: int
    placement: str | tuple[int, ...]
    uplink: float
    port: float | None = None
    overhead: float | None = None

    def build(self, world_size: int) -> Topology:
        """The simulator's racks for ``world_size`` ranks; a placement that does not fit them
        is refused in one line."""
        if isinstance(self.placement, str) and not 1 <= self.racks <= world_size:
            raise ValueError(f"{self.text()}: {self.racks} racks for {world_size} ranks; use 1 to {world_size}")
        rack_placement(world_size, self.racks, self.placement)  # refuses a bad list
        port = self.port or NETWORK_BW
        figures = {} if self.overhead is None else {"overhead": self.overhead}
        return build_topology(
            "racks",
            world_size,
            racks=self.racks,
            bandwidth=port,
            uplink_bandwidth=self.uplink * port,
            placement=self.placement,
            **figures,
        )

    def text(self) -> str:
        """The declaration that gives these racks (``racks:2@0.5``)."""
        where = "-".join(map(str, self.placement)) if isinstance(self.placement, tuple) else str(self.racks)
        suffix = ":interleaved" if self.placement == "interleaved" else ""
        return f"racks:{where}@{self.uplink:.3g}{suffix}"


def parse_topology(text: str) -> str | DeclaredRacks:
    """A shipped model's name, or the racks ``text`` declares; anything else refused in one line."""
    if text in TOPOLOGIES:
        return text
    match = _RACKS.match(str(text))
    if not match:
        raise ValueError(f"topology {text!r} is neither a model ({', '.join(TOPOLOGIES)}) nor racks as {SYNTAX}")
    where, uplink_text, placement = match.groups()
    uplink = parse_fraction(uplink_text, f"the uplink of {text!r}")
    if "-" in where:
        if placement:
            raise ValueError(f"topology {text!r}: a rack per rank already places them; drop :{placement}")
        rack_of = tuple(int(r) for r in where.split("-"))
        return DeclaredRacks(max(rack_of) + 1, rack_of, uplink)
    placement = placement or "contiguous"
    if placement not in PLACEMENTS:
        raise ValueError(f"topology {text!r}: unknown placement {placement!r}; use {' or '.join(PLACEMENTS)}")
    if int(where) < 1:
        raise ValueError(f"topology {text!r}: racks:R needs at least one rack")
    return DeclaredRacks(int(where), placement, uplink)


def topology_of(declared: str | DeclaredRacks, world_size: int) -> Topology:
    """The simulator's machine for ``declared`` (a name, a declaration or parsed racks)."""
    parsed = parse_topology(declared) if isinstance(declared, str) else declared
    if isinstance(parsed, DeclaredRacks):
        return parsed.build(world_size)
    return build_topology(parsed, world_size)


def check_topology(text: str, world_size: int) -> None:
    """Refuse, in one line, a topology that is not valid for ``world_size`` ranks."""
    parsed = parse_topology(text)
    if isinstance(parsed, DeclaredRacks):
        if isinstance(parsed.placement, tuple) and len(parsed.placement) != world_size:
            raise ValueError(f"topology {text!r} places {len(parsed.placement)} ranks, not the {world_size} there are")
        parsed.build(world_size)
