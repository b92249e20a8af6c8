"""Machines as directed links with latency and bandwidth, and a route for every pair.

Links are directed, so every cable is full duplex: ``a->b`` and ``b->a`` are two links.
A link that several routes share (a PCIe switch's uplink, a node's network port) is one
link object in all of those routes, which is how the simulator sees contention.

Shipped machines (``TOPOLOGIES``):

* ``private``: a dedicated full-duplex link between every pair (no contention anywhere):
  a multi-port machine, on which a device may send to all its peers at once.
* ``oneport``: one send and one receive port per device and nothing shared beyond: the
  single-port model (several messages leaving one device in a step share its port).
* ``pcie``: the paper's kind of machine: GPUs under PCIe switches (``per_switch`` each),
  the switches under one root complex. Each GPU has a single port: everything it sends
  or receives crosses its own uplink, and traffic between switches shares theirs.
* ``pcie2s``: two sockets, each with its own PCIe switch tree, joined by one slower
  inter-socket link (QPI-era peer traffic through the host bridge): the 8-GPU machines of
  the paper's time, whose exact layout the paper does not give.
* ``nvlink``: an NVLink-style full mesh: every pair of GPUs has its own link.
* ``nodes``: several nodes of GPUs under PCIe switches, joined through one network port
  per node to a network switch.
* ``racks``: one port per device in racks joined by uplinks (``lptrain-cluster --layout racks``):
  a rate for the uplinks and a placement (which rank is in which rack: consecutive ranks,
  interleaved ones, or any list), so that a rank order can be priced against the racks.
* ``host``: CPU "devices" in one process: one memory system does every transfer, one
  after the other (``serial``), as the in-process CPU executor does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes per second
    latency: float  # seconds
    # A token bucket of this many bytes (an emulated port, shaped as lptrain-cluster shapes
    # it: lptrain.cluster.plan), refilled at the link's rate while it carries less, so an
    # idle link passes that much at once (lptrain.sim.dataflow prices it; the step model
    # leaves it out). 0: a real link, which sends no byte faster than its rate.
    burst: float = 0.0


@dataclass
class Topology:
    """``route(src, dst)`` is the tuple of links a message crosses.

    ``overhead`` is the fixed cost of one message at the endpoints (launch, handshake);
    ``gamma`` the seconds per byte of a reduction on the receiving device; ``serial``
    says one engine performs every transfer in turn (the in-process CPU executor);
    ``overlapped`` says the endpoints' cost of a message is paid while the links carry
    the last one (the multi-process executor posts its receives ahead and issues each
    segment as soon as its data is in), so a step costs the larger of the two, not their
    sum (``lptrain.sim.simulator``). A link may be a token bucket (``Link.burst``), as an
    emulator's shaped port is. Routes are computed on demand, so machines of thousands of
    devices stay cheap.
    """

    name: str
    world_size: int
    overhead: float
    gamma: float
    router: Callable[[int, int], tuple[Link, ...]]
    serial: bool = False
    call_overhead: float = 0.0  # once per collective call (argument checks, planning)
    overlapped: bool = False  # a message's endpoint cost overlaps the transfers (across processes)
    # Bytes per second the executor measured at start, which it cuts its segments by; None:
    # the slowest link of a ring over the model (lptrain.sim.dataflow.measured_rate).
    link_rate: float | None = None
    # A port's bytes per second as measured at start, which the executor paces sends at; None:
    # the fastest link of a ring over the model, where it stands apart (lptrain.sim.dataflow.port_rate).
    port_rate: float | None = None
    # Ranks that share a switch behind a thinner link (racks), each group in rank order; None
    # where no group stands out. What a rank order keeps together (lptrain.auto).
    groups: tuple[tuple[int, ...], ...] | None = None
    layout: str = ""  # one phrase for describe: the racks and their uplinks
    # Bytes of a connection the sender's kernel holds for it (TCP's socket buffer, what is in
    # flight): a send is reported done once no more than this of its connection is still on
    # the way, before its last byte lands (lptrain.sim.dataflow). 0: done when delivered.
    send_buffer: float = 0.0
    _cache: dict[tuple[int, int], tuple[Link, ...]] = field(default_factory=dict, repr=False)

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        key = (src, dst)
        if key not in self._cache:
            if not (0 <= src < self.world_size and 0 <= dst < self.world_size) or src == dst:
                raise ValueError(f"topology {self.name} has no route {src} -> {dst} (P = {self.world_size})")
            self._cache[key] = self.router(src, dst)
        return self._cache[key]

    def describe(self) -> str:
        sample = self.route(0, self.world_size - 1) if self.world_size > 1 else ()
        return (
            f"{self.name}: P={self.world_size}, route 0->{self.world_size - 1}: "
            + (" ".join(f"{link.name}({link.bandwidth / 1e9:g} GB/s)" for link in sample) or "none")
            + f"; message overhead {self.overhead * 1e6:g} us, reduction {self.gamma * 1e12:.2f} ps/B"
            + (", serial" if self.serial else "")
            + (f"; {self.layout}" if self.layout else "")
        )


GB = 1e9

# Figures assumed for the shipped machines (typical values, not fitted to any result).
PCIE_BW, PCIE_HOP_LATENCY = 12 * GB, 1e-6  # PCIe Gen3 x16, effective, per direction
NVLINK_BW, NVLINK_LATENCY = 50 * GB, 1e-6  # two NVLink 2 bricks per pair, per direction
NETWORK_BW, NETWORK_LATENCY = 12.5 * GB, 5e-6  # 100 Gb/s per node
GPU_OVERHEAD = 10e-6  # launch and synchronisation per message
GPU_GAMMA = 3 / 900e9  # an add reads two operands and writes one, HBM at ~900 GB/s


class _Links:
    """Creates each named link once, so routes that name it share it."""

    def __init__(self, bandwidth: float, latency: float, burst: float = 0.0) -> None:
        self.bandwidth, self.latency, self.burst = bandwidth, latency, burst
        self._made: dict[str, Link] = {}

    def __call__(
        self, name: str, bandwidth: float | None = None, latency: float | None = None, burst: float | None = None
    ) -> Link:
        if name not in self._made:
            self._made[name] = Link(name, bandwidth or self.bandwidth, self.latency if latency is None else latency,
                                    self.burst if burst is None else burst)  # fmt: skip
        return self._made[name]


def private(
    p: int,
    bandwidth: float = PCIE_BW,
    latency: float = PCIE_HOP_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
    name: str = "private",
) -> Topology:
    link = _Links(bandwidth, latency)
    return Topology(name, p, overhead, gamma, lambda a, b: (link(f"{a}->{b}"),))


def oneport(
    p: int,
    bandwidth: float = PCIE_BW,
    latency: float = PCIE_HOP_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
    burst_bytes: float = 0.0,
) -> Topology:
    """One send port and one receive port per device, nothing shared beyond them.

    The single-port alpha-beta model: a device may send one message and receive one at
    the same time at full bandwidth; several messages leaving (or entering) one device in
    a step share its port. ``private`` is multi-port instead (a link per pair: a device
    may send to all its peers at once at full bandwidth each). ``burst_bytes``: each port
    a token bucket of that size (an emulated port: ``Link.burst``).
    """
    link = _Links(bandwidth, latency, burst_bytes)

    def route(a: int, b: int) -> tuple[Link, ...]:
        return (link(f"{a}.out"), link(f"{b}.in", latency=0.0))

    return Topology("oneport", p, overhead, gamma, route)


def nvlink(
    p: int,
    bandwidth: float = NVLINK_BW,
    latency: float = NVLINK_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
) -> Topology:
    return private(p, bandwidth, latency, overhead, gamma, name="nvlink")


def _pcie_route(link: _Links, a: int, b: int, per_switch: int, prefix: str = "") -> tuple[Link, ...]:
    """GPU a to GPU b inside one PCIe tree (a and b are positions within the tree)."""
    sa, sb = a // per_switch, b // per_switch
    if sa == sb:
        return (link(f"{prefix}gpu{a}->sw{sa}"), link(f"{prefix}sw{sb}->gpu{b}"))
    return (
        link(f"{prefix}gpu{a}->sw{sa}"),
        link(f"{prefix}sw{sa}->root"),
        link(f"{prefix}root->sw{sb}"),
        link(f"{prefix}sw{sb}->gpu{b}"),
    )


def pcie(
    p: int,
    per_switch: int = 4,
    bandwidth: float = PCIE_BW,
    latency: float = PCIE_HOP_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
) -> Topology:
    link = _Links(bandwidth, latency)
    return Topology("pcie", p, overhead, gamma, lambda a, b: _pcie_route(link, a, b, per_switch))


INTER_SOCKET_BW, INTER_SOCKET_LATENCY = 8 * GB, 1.5e-6  # QPI-era host bridge for peer traffic (a typical value)


def pcie2s(
    p: int,
    per_switch: int = 2,
    bandwidth: float = PCIE_BW,
    socket_bandwidth: float = INTER_SOCKET_BW,
    socket_latency: float = INTER_SOCKET_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
) -> Topology:
    """Two sockets, each a PCIe tree of switches (the first half of the ranks under socket 0),
    joined by one slower inter-socket link per direction: the 8-GPU machines of 2016."""
    link = _Links(bandwidth, PCIE_HOP_LATENCY)
    half = max(1, (p + 1) // 2)

    def route(a: int, b: int) -> tuple[Link, ...]:
        sa, sb = a // half, b // half
        if sa == sb:
            return _pcie_route(link, a % half, b % half, per_switch, f"s{sa}.")
        ia, ib = a % half, b % half
        return (
            link(f"s{sa}.gpu{ia}->sw{ia // per_switch}"),
            link(f"s{sa}.sw{ia // per_switch}->root"),
            link(f"s{sa}->s{sb}", socket_bandwidth, socket_latency),
            link(f"s{sb}.root->sw{ib // per_switch}"),
            link(f"s{sb}.sw{ib // per_switch}->gpu{ib}"),
        )

    return Topology("pcie2s", p, overhead, gamma, route)


def nodes(
    p: int,
    per_node: int = 8,
    per_switch: int = 4,
    bandwidth: float = PCIE_BW,
    network_bandwidth: float = NETWORK_BW,
    network_latency: float = NETWORK_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
) -> Topology:
    """Nodes of ``per_node`` GPUs (ranks numbered node by node) behind one network port each."""
    link = _Links(bandwidth, PCIE_HOP_LATENCY)

    def route(a: int, b: int) -> tuple[Link, ...]:
        na, nb = a // per_node, b // per_node
        ia, ib = a % per_node, b % per_node
        if na == nb:
            return _pcie_route(link, ia, ib, per_switch, f"n{na}.")
        sa, sb = ia // per_switch, ib // per_switch
        return (
            link(f"n{na}.gpu{ia}->sw{sa}"),
            link(f"n{na}.sw{sa}->root"),
            link(f"n{na}->net", network_bandwidth, network_latency),
            link(f"net->n{nb}", network_bandwidth, network_latency),
            link(f"n{nb}.root->sw{sb}"),
            link(f"n{nb}.sw{sb}->gpu{ib}"),
        )

    return Topology("nodes", p, overhead, gamma, route)


PLACEMENTS = ("contiguous", "interleaved")


def rack_placement(p: int, racks: int, placement: str | Sequence[int] = "contiguous") -> tuple[int, ...]:
    """The rack of every rank: ``contiguous`` (consecutive ranks, as evenly as they divide,
    rack 0 the first: lptrain-cluster's default), ``interleaved`` (rank ``r`` in rack
    ``r % racks``), or a list naming each rank's rack."""
    if placement == "contiguous":
        return tuple(a * racks // p for a in range(p))
    if placement == "interleaved":
        return tuple(a % racks for a in range(p))
    if isinstance(placement, str):
        raise ValueError(f"unknown placement {placement!r}; use {' or '.join(PLACEMENTS)}, or a rack per rank")
    rack_of = tuple(int(r) for r in placement)
    if len(rack_of) != p or sorted(set(rack_of)) != list(range(max(rack_of, default=-1) + 1)):
        raise ValueError(
            f"a placement names the rack of each of the {p} ranks, racks numbered from 0 with none empty; "
            f"got {list(placement)}"
        )
    return rack_of


def racks(
    p: int,
    racks: int = 2,
    bandwidth: float = NETWORK_BW,
    uplink_bandwidth: float | None = None,
    latency: float = NETWORK_LATENCY,
    overhead: float = GPU_OVERHEAD,
    gamma: float = GPU_GAMMA,
    placement: str | Sequence[int] = "contiguous",
    burst_bytes: float = 0.0,
    uplink_burst_bytes: float = 0.0,
) -> Topology:
    """One port per device (``oneport``), the devices in racks, every rack joined to rack 0 by
    an uplink of ``uplink_bandwidth`` each way (default: a port's): the layout of
    ``lptrain-cluster --layout racks`` (traffic between two racks other than 0 crosses both
    of their uplinks). ``placement`` says which rank is in which rack (``rack_placement``;
    with a list, ``racks`` follows from it). ``burst_bytes`` and ``uplink_burst_bytes``: each
    port and each uplink a token bucket of that size (an emulated one: ``Link.burst``)."""
    rack_of = rack_placement(p, racks, placement)
    count = max(rack_of, default=0) + 1
    uplink = uplink_bandwidth or bandwidth
    link = _Links(bandwidth, latency, burst_bytes)

    def route(a: int, b: int) -> tuple[Link, ...]:
        ra, rb = rack_of[a], rack_of[b]
        hops: list[Link] = [link(f"{a}.out")]
        if ra != rb:
            if ra != 0:
                hops.append(link(f"rack{ra}->rack0", uplink, 0.0, uplink_burst_bytes))
            if rb != 0:
                hops.append(link(f"rack0->rack{rb}", uplink, 0.0, uplink_burst_bytes))
        hops.append(link(f"{b}.in", latency=0.0))
        return tuple(hops)

    groups = tuple(tuple(a for a in range(p) if rack_of[a] == r) for r in range(count))
    layout = f"{count} racks " + " ".join("[" + " ".join(map(str, g)) + "]" for g in groups)
    layout += f", uplinks {uplink / bandwidth:.3g} of a port"
    return Topology("racks", p, overhead, gamma, route, groups=groups if count > 1 else None, layout=layout)


def host(
    p: int, bandwidth: float = 13 * GB, overhead: float = 10e-6, gamma: float = 1 / 40e9, call_overhead: float = 20e-6
) -> Topology:
    """The in-process CPU executor: every transfer is a memory copy, one after the other.

    The defaults are rough; ``lptrain.sim.calibrate`` fits all four figures to this machine.
    """
    memory = Link("memory", bandwidth, 0.0)
    return Topology("host", p, overhead, gamma, lambda a, b: (memory,), serial=True, call_overhead=call_overhead)


TOPOLOGIES = {
    "private": private,
    "oneport": oneport,
    "pcie": pcie,
    "pcie2s": pcie2s,
    "nvlink": nvlink,
    "nodes": nodes,
    "racks": racks,
    "host": host,
}


def build_topology(name: str, world_size: int, **params) -> Topology:
    """A shipped machine by name; ``params`` override its figures (bandwidth=..., per_switch=...)."""
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; valid topologies: {', '.join(TOPOLOGIES)}")
    if world_size < 1:
        raise ValueError(f"a topology needs at least one device, got P={world_size}")
    return TOPOLOGIES[name](world_size, **params)
