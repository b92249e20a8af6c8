"""What an emulated cluster is made of, as plain data: namespaces, bridges, shaped links.

Each node is a network namespace with one interface, ``eth0``, the end of a veth pair
whose other end sits on a bridge inside a *switch* namespace. Both ends are shaped with a
token bucket (``tc``'s ``htb``): the node's end limits what it sends, the switch's end
what it receives, so every node has one full-duplex port of the chosen rate, the
one-port model of ``lptrain.sim.topology.oneport``. Only ``htb``, ``bfifo`` and the
``u32`` classifier are needed (no ``netem``, ``fq`` or ``sfq``).

Two layouts:

* ``star``: every node on one bridge (one switch, one port per node);
* ``racks``: the nodes split into racks, one bridge each, and every rack joined to rack 0
  by an uplink (a veth pair between the two bridges) shaped at ``uplink`` in each direction.

Racks hold consecutive nodes (``placement="contiguous"``: torchrun's ranks follow the
racks) or every ``racks``-th node (``"interleaved"``: node i in rack i % racks, so that
consecutive ranks sit in different racks and only an algorithm that orders its ranks by
rack keeps each rack's traffic inside it).

How the links are shaped, and why. The emulation must cost the host little CPU, or the
CPU and not the link sets the times; and a flow must get its port's rate as it would on
real cables. Each direction of a port is an ``htb`` shaper at the port's rate (one class,
a token bucket) with two leaves: IP packets under ``ACK_BYTES`` (TCP's pure ACKs) first,
everything else in one FIFO (``bfifo``); ``egress="per-peer"`` changes both, and
``"per-pair"``, the default, the switch's ports too (the last two points). The figures
below are the fidelity check's (``lptrain.cluster.fidelity``: every port sending and
receiving at once) or the benchmark's, 8 nodes at 200 Mbit/s on a 2-core host.

* The bucket (``burst``) holds two GSO packets at least (``BURST_MIN_BYTES``). A TCP
  sender hands the stack super-packets of up to 64 KiB and a veth carries each whole, one
  skb from socket to socket. ``tbf`` (tc's plain token bucket) cuts a packet larger than
  its bucket into MTU-sized ones (``tbf_segment``), each then sent through the bridge
  and the stack alone: shaped by ``tbf`` with a 50 KB bucket (2 ms of 200 Mbit/s) and
  MTU 1500, a 16 MiB broadcast at P = 8 took LP 1.37 n/B instead of 1.06, and softirq 15-16%
  of the CPU over the run instead of 2%. ``htb`` never cuts a packet (one larger than the
  bucket is sent and its tokens borrowed from what follows; the check measured the same
  with a 50 KB bucket as with 128 KiB), so the two packets are a margin: the bucket
  releases one GSO packet while the next is queued, never a fraction of one. After an
  idle spell a port may send one bucket at once: 5 ms of 200 Mbit/s, nothing against a
  message of megabytes.
* MTU 9000 on every veth and bridge (``MTU``): TCP's payload is 99.3% of what the shaper
  counts instead of 95.6%, and what is not sent as a GSO packet (ACKs, small writes) goes
  in six times fewer packets.
* The FIFO holds 50 ms of the rate and at least 16 GSO packets (``QUEUE_SECONDS``,
  ``QUEUE_MIN_PACKETS``), so that several flows arriving at one port at once (a reduce to
  its root, gloo's own collectives) queue rather than drop: a drop can cost a
  retransmission timeout of 200 ms, which no real port adds. A FIFO of 256 KiB (10 ms at
  200 Mbit/s) took LP's overlapped allreduce of 4 MiB over 4 nodes to 3.35 n/B, where these
  FIFOs gave 2.26 to 2.48 in the same hour (2026-12-06, one run).
* TCP's congestion control is ``bbr`` in every namespace (``CONGESTION_CONTROL``) where
  the kernel allows it, or what ``lptrain-cluster --congestion`` names: bbr paces at the
  rate it measures and keeps queues short, where a loss-based one fills the FIFO (50 ms of
  queueing for every other flow on the port) and learns the rate only by dropping. The
  choice moves LP's chain: over 16 nodes at 200 Mbit/s (2026-12-06, 2-core host, two rounds
  of `lptrain-bench --op all -b 4M -e 16M -f 4 --algo lp,ring,be,nccl`, bbr and reno
  alternating) LP's broadcast took 1.15 n/B at 16 MiB under bbr and 1.05 under reno, its
  reduce 1.17 and 1.07 (4 MiB: 1.17 and 1.12, 1.23 and 1.09), while the ring and gloo's own
  allreduce read the same under both and LP's overlapped allreduce lost under reno at 16 MiB
  (2.24 against 2.43 n/B). Every link of a chain is busy at once and each waits for the
  last, so whatever holds one flow back holds all of them; reno kept more in flight (node 5's
  data connection: a window of 65 packets against bbr's 36 to 44, ``ss -ti`` during the
  run; both saw a minimum RTT of 10 us, the shaper passing a packet at once), which is the
  likely difference, not verified further. bbr stays the default: the documents' tables
  are measured under it, and no one choice was faster for every schedule.
* ACKs first. On real cables every packet's serialization makes the minimum RTT
  milliseconds, and BBR's window (twice the rate times that RTT) covers the time a flow's
  ACKs wait behind the other direction's data. Here the bucket lets a packet through at
  once, the minimum RTT is tens of microseconds and the window its floor of a few packets,
  so a flow whose ACKs queued behind data at two or three shaped hops (across the uplinks
  of racks, or to a slow node) was held by its window to 84-95% of its rate. With ACKs
  first every flow carried 99%, as on the star. The ACK class is assured 2% of the rate
  (``ACK_SHARE``; ACKs are about 0.5% of the data they acknowledge) and may use it all.
  The class takes every IP packet under ``ACK_BYTES``, so a stream's small data segments
  (gloo's notice that a receive is posted) go first too. Where one connection carries data
  both ways through a standing queue (LP's overlapped allreduce across racks), such a
  segment overtakes its own stream's queued ones and the sender resends what was only
  queued: up to 40% of a flow's bytes, 10.0 to 10.6 n/B where the simulator says 8.2.
  Taking pure ACKs alone (no flag but ACK) cured that (8.3 to 8.5) but made every notice
  wait behind the data queued in its port, and LP's broadcast and reduce over 13 to 16
  nodes took 1.15 to 1.34 n/B instead of 1.08 to 1.20 (2026-12-06, one run each;
  docs/distributed.md).
* ``egress="per-peer"`` (``lptrain-cluster --egress per-peer``) gives the notice a way past
  other flows' data without passing its own stream's: a node's own port keeps a FIFO per
  destination (an ``htb`` leaf each, picked by ``u32`` on the destination address, served
  in turn), as a real host keeps a queue per flow (``fq_codel``; this kernel has no ``sfq``,
  ``fq_codel`` or ``flow`` classifier, so the queues are ``htb``'s), and every port's ACK
  class takes TCP's pure ACKs alone (``PURE_ACK_MATCH``: IPv4 without options, no flag but
  ACK, under ``ACK_BYTES``). A stream's packets then leave in order at every hop, and a notice
  waits for at most one quantum of another destination's data. The switch's ports and the
  uplinks keep one FIFO, as a real switch's do. Against ``shared`` in the same hour
  (2026-12-07, one run each, 200 Mbit/s ports, n/B): LP's overlapped allreduce over 4 racks
  with uplinks at a quarter took 8.41 and 8.22 at P = 4 (4 and 16 MiB; ``shared`` 9.80 and
  9.63, the simulator 8.55 and 8.20) and 8.65 and 8.21 at P = 8 (11.85 and 10.39; 8.77 and
  8.25), 4.13 with uplinks at half (4.80; 4.11), and 2.24 and 2.10 on a star of 4 (2.56 and
  2.21); LP's broadcast and reduce of 16 MiB over a star of 16 took 1.17 and 1.26 (1.14 and
  1.24); MST, the ring and gloo's own collectives moved by 1% at most. ``shared`` is kept to
  re-run a figure measured with it.
* ``egress="per-pair"`` also gives the switch's port toward a node a FIFO per source node
  (``Shaping.by``: picked by ``u32`` on the source address). Under ``per-peer`` a notice
  from the chain's next node still queues, in the switch's one FIFO toward a node, behind
  the data coming from the node before it, and that data arrives there in GSO packets of up
  to 64 KiB, each let through at once by the sender's bucket: a notice can wait 10 ms at
  50 Mbit/s behind one, where a real port, serializing 9000-byte frames, holds it behind one
  frame. A stream keeps its order (it has one source), and a port shared by several senders
  is shared by turns, as the simulator's fair shares do, instead of by arrival. LP's
  broadcast over a star of 16 (2026-12-07, two rounds, the three shapers by turns, each run
  past the fidelity check, `lptrain-cluster --nodes 16 --link R --egress X -- lptrain-bench
  --op broadcast|reduce -b 4M -e 16M -f 4 --algo lp -n 1 --trials 3 --topology probe`, n/B
  at 4 and 16 MiB against the rate measured at start): at 50 Mbit/s, ``per-pair`` 1.02 and
  1.08, 1.09 and 1.07; ``per-peer`` 1.15 and 1.15, 1.17 and 1.15; ``shared`` 1.07 and 1.04
  (``lptrain-cluster --link-usage``: under ``per-peer`` the switch's ports toward the chain's
  nodes held a queue 4 to 26% of the time and were at their rate 77% of the time at node 1
  falling to 55% at node 15; under ``shared``, 1 to 7% and 76 to 81% all along); at 200
  Mbit/s broadcast 1.14 and 1.11, 1.10 and 1.08 (``per-peer`` 1.17 and 1.12, 1.17 and 1.11),
  reduce 1.14 and 1.13, 1.18 and 1.13 (``per-peer`` 1.18 and 1.16, 1.25 and 1.22). LP's
  overlapped allreduce over 4 racks of 2 with uplinks at a quarter, whose artefact under
  ``shared`` ``per-peer`` cured, read 8.40 and 8.21 against ``per-peer``'s 8.43 and 8.20 in
  the same hour. ``per-pair`` is the default (``DEFAULT_EGRESS``) since 2026-12-07.

``lptrain.cluster.fidelity`` measures at every start that the host carries what was asked.

Nothing here touches the host's network namespace: the bridges live in the switch
namespace, the addresses exist only on the nodes' ``eth0``, and no namespace has a route
beyond its own subnet. Building this module's commands needs no privilege, so the layout
is tested anywhere; ``lptrain.cluster.netns`` runs them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

LAYOUTS = ("star", "racks")
PLACEMENTS = ("contiguous", "interleaved")
SUBNET = "10.213"  # 10.213.0.0/16: node i is 10.213.(i // 250).(i % 250 + 1)
NODE_IF = "eth0"
MTU = 9000  # on every veth end and bridge (see the module's docstring for each choice)
GSO_BYTES = 64 * 1024  # the largest packet a TCP sender hands a veth (gso_max_size)
BURST_MIN_BYTES = 2 * GSO_BYTES  # the bucket: two GSO packets at least ...
BURST_SECONDS = 0.002  # ... or 2 ms of the rate where that is more (fast links, timer granularity)
QUEUE_SECONDS = 0.050  # the FIFO behind the bucket: 50 ms of the rate ...
QUEUE_MIN_PACKETS = 16  # ... and at least this many GSO packets
BYTES_LIMIT = 2**31  # tc counts a bucket and a queue in 32 bits
ACK_BYTES = 128  # IP packets shorter than this (pure ACKs) go before the FIFO's data
# The ACK class's filter (``u32`` matches: value, mask, byte offset in the IP packet).
SHORT_PACKET_MATCH = ("match", "u16", "0", f"{0xFFFF & ~(ACK_BYTES - 1):#x}", "at", "2")  # IP total length
PURE_ACK_MATCH = (
    "match", "u8", "0x45", "0xff", "at", "0",  # IPv4 with no options: TCP's header starts at byte 20
    "match", "u8", "6", "0xff", "at", "9",  # TCP
    *SHORT_PACKET_MATCH,  # no payload to speak of
    "match", "u8", "0x10", "0xff", "at", "33",  # TCP's flags: ACK and nothing else (no PSH, SYN, FIN, RST)
)  # fmt: skip
EGRESS = ("shared", "per-peer", "per-pair")  # how the ports queue what they carry (see the module's docstring)
DEFAULT_EGRESS = "per-pair"  # the faithful one: a host's queue per flow, a switch's port that no GSO lump blocks
ACK_SHARE = 50  # the ACK class is assured 1/50 of the port's rate (and may borrow the rest)
CONGESTION_CONTROL = "bbr"  # in every namespace, where the kernel allows it

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
    placement: str = "contiguous"  # racks: consecutive nodes in a rack, or node i in rack i % racks

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 2 <= self.nodes <= 64:
            raise ClusterSpecError(f"--nodes must be a whole number from 2 to 64, got {self.nodes!r}")
        if self.layout not in LAYOUTS:
            raise ClusterSpecError(f"--layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.layout == "racks" and not 2 <= self.racks <= self.nodes:
            raise ClusterSpecError(f"--racks must be from 2 to the number of nodes ({self.nodes}), got {self.racks}")
        if self.placement not in PLACEMENTS:
            raise ClusterSpecError(f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.placement != "contiguous" and self.layout != "racks":
            raise ClusterSpecError(f"--placement {self.placement} places nodes in racks: it needs --layout racks")
        for node in self.slow:
            if not 0 <= node < self.nodes:
                raise ClusterSpecError(f"--slow names node {node}, but the nodes are 0..{self.nodes - 1}")

    def rack_of(self, node: int) -> int:
        """The node's rack. ``contiguous``: consecutive nodes, as evenly as they divide (rack
        0 the first ones); ``interleaved``: node i in rack i % racks (neighbours apart)."""
        if self.layout != "racks":
            return 0
        if self.placement == "interleaved":
            return node % self.racks
        return node * self.racks // self.nodes

    def uplink_rate(self) -> int:
        """Each rack's uplink to rack 0, each way (racks only; the port rate by default)."""
        return self.uplink_bits or self.link_bits

    def port_bits(self, node: int) -> int:
        return self.slow.get(node, self.link_bits)


@dataclass(frozen=True)
class Shaping:
    """One direction of one link: ``tbf`` on ``device`` in ``namespace``."""

    namespace: str
    device: str
    bits: int
    peers: tuple[str, ...] = ()  # a FIFO per address: a node's own port (per-peer, per-pair), the switch's (per-pair)
    pure_acks: bool = False  # the ACK class takes TCP's pure ACKs only (else every packet under ACK_BYTES)
    by: str = "dst"  # which address of a packet picks its ``peers`` queue: dst at a node's port, src at the switch's

    @property
    def burst_bytes(self) -> int:
        """The token bucket: two GSO packets (``BURST_MIN_BYTES``), or 2 ms of the rate."""
        return min(BYTES_LIMIT // 4, max(BURST_MIN_BYTES, int(self.bits / 8 * BURST_SECONDS)))

    @property
    def limit_bytes(self) -> int:
        """The FIFO behind the bucket: 50 ms of the rate, 16 GSO packets at least."""
        return min(BYTES_LIMIT - 1, max(QUEUE_MIN_PACKETS * GSO_BYTES, int(self.bits / 8 * QUEUE_SECONDS)))

    def commands(self) -> list[list[str]]:
        """The ``tc`` commands that shape this direction: an ``htb`` class at the rate, ACKs
        (class 1:10) before the data's FIFO (class 1:20), and with ``peers`` a FIFO of its own
        for each (class 1:100 on, one per address, in order). On a device with no qdisc yet."""
        tc = ["tc", "-n", self.namespace]
        dev = ["dev", self.device]
        rate, ack = self.bits, max(8000, self.bits // ACK_SHARE)
        share = max(8000, (rate - ack) // (len(self.peers) + 1))  # what each data queue is assured
        bucket = ["burst", str(self.burst_bytes), "cburst", str(self.burst_bytes)]
        leaf = ["ceil", f"{rate}bit", *bucket, "quantum", str(BURST_MIN_BYTES), "prio"]
        commands = [
            [*tc, "qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "20"],
            [*tc, "class", "add", *dev, "parent", "1:", "classid", "1:1", "htb", "rate", f"{rate}bit",
             "ceil", f"{rate}bit", *bucket],
            [*tc, "class", "add", *dev, "parent", "1:1", "classid", "1:10", "htb", "rate", f"{ack}bit", *leaf, "0"],
            [*tc, "class", "add", *dev, "parent", "1:1", "classid", "1:20", "htb", "rate", f"{share}bit", *leaf, "1"],
            [*tc, "qdisc", "add", *dev, "parent", "1:20", "bfifo", "limit", str(self.limit_bytes)],
            [*tc, "filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
             *(PURE_ACK_MATCH if self.pure_acks else SHORT_PACKET_MATCH), "flowid", "1:10"],
        ]  # fmt: skip
        for classid, address in zip(self.peer_classes, self.peers, strict=True):
            commands += [
                [*tc, "class", "add", *dev, "parent", "1:1", "classid", classid, "htb", "rate", f"{share}bit",
                 *leaf, "1"],
                [*tc, "qdisc", "add", *dev, "parent", classid, "bfifo", "limit", str(self.limit_bytes)],
                [*tc, "filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "2", "u32",
                 "match", "ip", self.by, f"{address}/32", "flowid", classid],
            ]  # fmt: skip
        return commands

    @property
    def peer_classes(self) -> tuple[str, ...]:
        """The ``htb`` class of each of ``peers``' queues (``tc`` reads the minor in hex)."""
        return tuple(f"1:{0x100 + i:x}" for i in range(len(self.peers)))

    def clear(self) -> list[str]:
        """The command that removes this direction's shaping (before shaping it anew)."""
        return ["tc", "-n", self.namespace, "qdisc", "del", "dev", self.device, "root"]


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
    congestion: str | None = CONGESTION_CONTROL  # None: each namespace keeps the default it inherits from the host
    egress: str = DEFAULT_EGRESS  # one of EGRESS: how a node's own port queues what it sends

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace the cluster adds (the switch first): exactly what teardown removes."""
        return (self.switch, *(n.namespace for n in self.nodes))

    @property
    def master_address(self) -> str:
        return self.nodes[0].address

    def port_shaping(self, node: int, bits: int) -> tuple[Shaping, Shaping]:
        """Node ``node``'s port at ``bits``: what it sends (shaped in its namespace, a FIFO
        per other node with ``egress="per-peer"`` or ``"per-pair"``) and what it receives (the
        switch's end, a FIFO per other node with ``"per-pair"``)."""
        n = self.nodes[node]
        per_peer = self.egress != "shared"  # per-peer or per-pair, as the uplinks' pure ACKs (build_plan)
        peers = tuple(m.address for m in self.nodes if m.index != node) if per_peer else ()
        sources = peers if self.egress == "per-pair" else ()
        return (
            Shaping(n.namespace, NODE_IF, bits, peers, per_peer),
            Shaping(self.switch, n.port, bits, sources, per_peer, by="src"),
        )

    def describe(self) -> str:
        spec = self.spec
        text = f"{spec.nodes} nodes, {spec.layout}, {format_rate(spec.link_bits)} per node port"
        if spec.layout == "racks":
            text += f", {spec.racks} racks joined by {format_rate(spec.uplink_rate())} uplinks"
            if spec.placement == "interleaved":
                text += f", node i in rack i % {spec.racks}"
        for node, bits in sorted(spec.slow.items()):
            text += f", node {node} at {format_rate(bits)}"
        return text

    def describe_links(self) -> str:
        """How the ports are shaped (one line of cluster.txt): MTU, bucket, queue, TCP."""
        port = Shaping(self.nodes[0].namespace, NODE_IF, self.spec.link_bits)
        tcp = self.congestion or "the host's default congestion control"
        queues = {
            "per-peer": "a FIFO per destination at each node's own port, pure ACKs first",
            "per-pair": "a FIFO per destination at each node's own port and per source at the switch's, pure ACKs "
            "first",
        }.get(self.egress, "ACKs first")
        return (f"MTU {MTU}, htb bucket {port.burst_bytes // 1024} KiB, FIFO {port.limit_bytes // 1024} KiB and "
                f"{queues} per {format_rate(port.bits)} port, TCP {tcp} in every namespace")  # fmt: skip


def node_address(index: int) -> str:
    return f"{SUBNET}.{index // 250}.{index % 250 + 1}"


def _veth(namespace: str, end: str, peer: str, peer_namespace: str | None = None) -> list[str]:
    """A veth pair made in ``namespace`` with MTU ``MTU`` at both ends (the peer moved to
    ``peer_namespace`` where given)."""
    far = ["netns", peer_namespace] if peer_namespace else []
    return ["ip", "-n", namespace, "link", "add", end, "mtu", str(MTU), "type", "veth",
            "peer", "name", peer, "mtu", str(MTU), *far]  # fmt: skip


def build_plan(
    spec: ClusterSpec, prefix: str, congestion: str | None = CONGESTION_CONTROL, egress: str = DEFAULT_EGRESS
) -> ClusterPlan:
    """The namespaces and the ``ip``/``tc`` commands that make ``spec``'s cluster, with TCP's
    congestion control set to ``congestion`` in every namespace (None: left as it is) and
    each node's own port queueing as ``egress`` says."""
    if egress not in EGRESS:
        raise ClusterSpecError(f"--egress must be one of {', '.join(EGRESS)}, got {egress!r}")
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", prefix):
        raise ClusterSpecError(f"a cluster prefix must be a short lowercase name, got {prefix!r}")
    if congestion is not None and not re.fullmatch(r"[a-z0-9_]+", congestion):
        raise ClusterSpecError(f"a congestion control is a kernel module's name, got {congestion!r}")
    switch = f"{prefix}-sw"
    nodes = tuple(Node(i, f"{prefix}-n{i}", node_address(i), spec.rack_of(i), f"p{i}") for i in range(spec.nodes))
    racks = sorted({n.rack for n in nodes})
    commands: list[list[str]] = [["ip", "-n", switch, "link", "set", "lo", "up"]]
    shaping: list[Shaping] = []
    for rack in racks:
        commands.append(["ip", "-n", switch, "link", "add", f"br{rack}", "mtu", str(MTU), "type", "bridge"])
        commands.append(["ip", "-n", switch, "link", "set", f"br{rack}", "up"])
    for rack in racks[1:]:  # each rack's uplink to rack 0
        a, b = f"up{rack}a", f"up{rack}b"
        commands.append(_veth(switch, a, b))
        commands.append(["ip", "-n", switch, "link", "set", a, "master", "br0", "up"])
        commands.append(["ip", "-n", switch, "link", "set", b, "master", f"br{rack}", "up"])
        shaping += [Shaping(switch, end, spec.uplink_rate(), (), egress != "shared") for end in (a, b)]
    for n in nodes:
        commands += [
            ["ip", "-n", n.namespace, "link", "set", "lo", "up"],
            _veth(switch, n.port, NODE_IF, n.namespace),
            ["ip", "-n", switch, "link", "set", n.port, "master", f"br{n.rack}", "up"],
            ["ip", "-n", n.namespace, "addr", "add", f"{n.address}/16", "dev", NODE_IF],
            ["ip", "-n", n.namespace, "link", "set", NODE_IF, "up"],
        ]
        if congestion is not None:  # a per-namespace setting (net.ipv4 is per network namespace)
            sysctl = f"net.ipv4.tcp_congestion_control={congestion}"
            commands.append(["ip", "netns", "exec", n.namespace, "sysctl", "-q", "-w", sysctl])
    plan = ClusterPlan(spec, prefix, switch, nodes, (), (), congestion, egress)
    shaping += [s for n in nodes for s in plan.port_shaping(n.index, spec.port_bits(n.index))]
    commands += [c for s in shaping for c in s.commands()]
    return dataclasses.replace(plan, commands=tuple(tuple(c) for c in commands), shaping=tuple(shaping))
