"""What an emulated cluster is made of, as plain data: namespaces, bridges, shaped links.

Each node is a network namespace with one interface, ``eth0``, the end of a veth pair
whose other end sits on a bridge inside a *switch* namespace. Both ends are shaped with
``tc``'s token bucket filter (``tbf``): the node's end limits what it sends, the switch's
end what it receives, so every node has one full-duplex port of the chosen rate, the
one-port model of ``lptrain.sim.topology.oneport``. ``netem`` is not needed.

Two layouts:

* ``star``: every node on one bridge (one switch, one port per node);
* ``racks``: the nodes split into racks, one bridge each, and every rack joined to rack 0
  by an uplink (a veth pair between the two bridges) shaped at ``uplink`` in each direction.

Nothing here touches the host's network namespace: the bridges live in the switch
namespace, the addresses exist only on the nodes' ``eth0``, and no namespace has a route
beyond its own subnet. Building this module's commands needs no privilege, so the layout
is tested anywhere; ``lptrain.cluster.netns`` runs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LAYOUTS = ("star", "racks")
SUBNET = "10.213"  # 10.213.0.0/16: node i is 10.213.(i // 250).(i % 250 + 1)
NODE_IF = "eth0"
MIN_BURST_BYTES = 32 * 1024
BURST_SECONDS = 0.002  # the token bucket holds 2 ms of the rate (32 KiB at least)
QUEUE_LATENCY = "50ms"  # the longest a packet may wait in a shaped queue before it is dropped

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$", re.IGNORECASE)


class ClusterSpecError(ValueError):
    """An emulated cluster was described wrongly (a node count, a rate, a layout)."""


def parse_rate(text: str, what: str = "--link") -> int:
    """Bits per second from ``tc``'s notation (``200mbit``, ``1gbit``, ``500kbit``)."""
    match = _RATE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _RATE_UNITS:
        raise ClusterSpecError(
            f"{what} must be a rate such as 200mbit, 1gbit or 500kbit (units: {', '.join(_RATE_UNITS)}), got {text!r}"
        )
    bits = int(float(match.group(1)) * _RATE_UNITS[unit])
    if bits < 8000:
        raise ClusterSpecError(f"{what} must be at least 8kbit, got {text!r}")
    return bits


def format_rate(bits: int) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale:
            value = bits / scale
            return f"{value:g}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True)
class ClusterSpec:
    """What the user asked for. ``slow`` maps a node to its own port rate (a straggler)."""

    nodes: int
    link_bits: int
    layout: str = "star"
    racks: int = 2
    uplink_bits: int | None = None  # racks: each rack's uplink to rack 0 (default: the node link rate)
    slow: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 2 <= self.nodes <= 64:
            raise ClusterSpecError(f"--nodes must be a whole number from 2 to 64, got {self.nodes!r}")
        if self.layout not in LAYOUTS:
            raise ClusterSpecError(f"--layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.layout == "racks" and not 2 <= self.racks <= self.nodes:
            raise ClusterSpecError(f"--racks must be from 2 to the number of nodes ({self.nodes}), got {self.racks}")
        for node in self.slow:
            if not 0 <= node < self.nodes:
                raise ClusterSpecError(f"--slow names node {node}, but the nodes are 0..{self.nodes - 1}")

    def rack_of(self, node: int) -> int:
        """Racks hold consecutive nodes, as evenly as they divide (rack 0 the first ones)."""
        if self.layout != "racks":
            return 0
        return node * self.racks // self.nodes

    def port_bits(self, node: int) -> int:
        return self.slow.get(node, self.link_bits)


@dataclass(frozen=True)
class Shaping:
    """One direction of one link: ``tbf`` on ``device`` in ``namespace``."""

    namespace: str
    device: str
    bits: int

    def command(self) -> list[str]:
        burst = max(MIN_BURST_BYTES, int(self.bits / 8 * BURST_SECONDS))
        return [
            "tc", "-n", self.namespace, "qdisc", "replace", "dev", self.device, "root", "tbf",
            "rate", f"{self.bits}bit", "burst", str(burst), "latency", QUEUE_LATENCY,
        ]  # fmt: skip


@dataclass(frozen=True)
class Node:
    index: int
    namespace: str
    address: str  # without the prefix length
    rack: int
    port: str  # the switch namespace's end of the node's veth pair


@dataclass(frozen=True)
class ClusterPlan:
    """Every namespace, device and command of one emulated cluster, named after ``prefix``."""

    spec: ClusterSpec
    prefix: str
    switch: str
    nodes: tuple[Node, ...]
    commands: tuple[tuple[str, ...], ...]  # in order, after the namespaces are added
    shaping: tuple[Shaping, ...]

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace the cluster adds (the switch first): exactly what teardown removes."""
        return (self.switch, *(n.namespace for n in self.nodes))

    @property
    def master_address(self) -> str:
        return self.nodes[0].address

    def describe(self) -> str:
        spec = self.spec
        text = f"{spec.nodes} nodes, {spec.layout}, {format_rate(spec.link_bits)} per node port"
        if spec.layout == "racks":
            text += f", {spec.racks} racks joined by {format_rate(spec.uplink_bits or spec.link_bits)} uplinks"
        for node, bits in sorted(spec.slow.items()):
            text += f", node {node} at {format_rate(bits)}"
        return text


def node_address(index: int) -> str:
    return f"{SUBNET}.{index // 250}.{index % 250 + 1}"


def build_plan(spec: ClusterSpec, prefix: str) -> ClusterPlan:
    """The namespaces and the ``ip``/``tc`` commands that make ``spec``'s cluster."""
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", prefix):
        raise ClusterSpecError(f"a cluster prefix must be a short lowercase name, got {prefix!r}")
    switch = f"{prefix}-sw"
    nodes = tuple(Node(i, f"{prefix}-n{i}", node_address(i), spec.rack_of(i), f"p{i}") for i in range(spec.nodes))
    racks = sorted({n.rack for n in nodes})
    commands: list[list[str]] = [["ip", "-n", switch, "link", "set", "lo", "up"]]
    shaping: list[Shaping] = []
    for rack in racks:
        commands.append(["ip", "-n", switch, "link", "add", f"br{rack}", "type", "bridge"])
        commands.append(["ip", "-n", switch, "link", "set", f"br{rack}", "up"])
    for rack in racks[1:]:  # each rack's uplink to rack 0
        a, b = f"up{rack}a", f"up{rack}b"
        commands.append(["ip", "-n", switch, "link", "add", a, "type", "veth", "peer", "name", b])
        commands.append(["ip", "-n", switch, "link", "set", a, "master", "br0", "up"])
        commands.append(["ip", "-n", switch, "link", "set", b, "master", f"br{rack}", "up"])
        uplink = spec.uplink_bits or spec.link_bits
        shaping += [Shaping(switch, a, uplink), Shaping(switch, b, uplink)]
    for n in nodes:
        commands += [
            ["ip", "-n", n.namespace, "link", "set", "lo", "up"],
            ["ip", "-n", switch, "link", "add", n.port, "type", "veth", "peer", "name", NODE_IF, "netns", n.namespace],
            ["ip", "-n", switch, "link", "set", n.port, "master", f"br{n.rack}", "up"],
            ["ip", "-n", n.namespace, "addr", "add", f"{n.address}/16", "dev", NODE_IF],
            ["ip", "-n", n.namespace, "link", "set", NODE_IF, "up"],
        ]
        bits = spec.port_bits(n.index)
        shaping += [Shaping(n.namespace, NODE_IF, bits), Shaping(switch, n.port, bits)]
    commands += [s.command() for s in shaping]
    return ClusterPlan(spec, prefix, switch, nodes, tuple(tuple(c) for c in commands), tuple(shaping))
