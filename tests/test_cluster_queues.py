"""Which queue of a shaped port each packet goes to, as the kernel's ``u32`` filters decide.

``lptrain-cluster --egress`` chooses how a node's own port queues what it sends: ``shared``
(one FIFO, every packet under 128 bytes first), ``per-peer`` (a FIFO per destination and
TCP's pure ACKs alone first) or ``per-pair`` (per-peer, and the switch's port toward a node
a FIFO per source). The commands are plain data: a small reading of ``u32``'s
matches runs real IP headers through them, so the classification is tested anywhere; one
run on a real cluster, skipped with the reason where namespaces cannot be made, shows that
the kernel takes the commands and holds the classes.
"""

from __future__ import annotations

import ipaddress
import struct
import subprocess
import sys

import pytest
from test_cluster import needs_namespaces

from lptrain.cluster.cli import build_parser
from lptrain.cluster.netns import list_namespaces
from lptrain.cluster.plan import NODE_IF, ClusterSpec, ClusterSpecError, Shaping, build_plan, parse_rate

CLUSTER = [sys.executable, "-m", "lptrain.cluster.cli"]
MBIT = 1_000_000
ACK, PSH, SYN, FIN = 0x10, 0x08, 0x02, 0x01


def _packet(
    dst: str, payload: int = 0, flags: int = ACK, proto: int = 6, options: int = 0, src: str = "10.213.0.1"
) -> bytes:
    """An IPv4 packet from ``src`` to ``dst``: ``options`` words of IP options, a TCP
    header (or, for another protocol, 20 bytes of it) with ``flags``, ``payload`` bytes."""
    ihl = 5 + options
    transport = struct.pack("!HHIIBBHHH", 40000, 29500, 1, 1, 5 << 4, flags, 65535, 0, 0)
    length = ihl * 4 + len(transport) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, length, 0, 0, 64, proto, 0,
                         ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed)  # fmt: skip
    return header + b"\x01\x01\x01\x01" * options + transport + bytes(payload)


def _matches(words: tuple[str, ...]) -> list[tuple[int, int, int, int]]:
    """``u32``'s ``match`` clauses as (width in bytes, value, mask, offset)."""
    clauses, i = [], 0
    while i < len(words):
        assert words[i] == "match", words
        if words[i + 1] == "ip" and words[i + 2] in ("src", "dst"):
            address, prefix = words[i + 3].split("/")
            mask = (0xFFFFFFFF << (32 - int(prefix))) & 0xFFFFFFFF
            clauses.append((4, int(ipaddress.ip_address(address)) & mask, mask, {"src": 12, "dst": 16}[words[i + 2]]))
            i += 4
        else:
            width = {"u8": 1, "u16": 2, "u32": 4}[words[i + 1]]
            assert words[i + 4] == "at", words
            clauses.append((width, int(words[i + 2], 0), int(words[i + 3], 0), int(words[i + 5])))
            i += 6
    return clauses


def _queue(shaping: Shaping, packet: bytes) -> str:
    """The class ``shaping``'s filters send ``packet`` to: the first filter, by priority,
    whose every match holds, else the ``htb`` qdisc's default class."""
    commands = shaping.commands()
    (root,) = [c for c in commands if "root" in c and "qdisc" in c]
    filters = sorted((c for c in commands if "filter" in c), key=lambda c: int(c[c.index("prio") + 1]))
    for f in filters:
        clauses = _matches(tuple(f[f.index("u32") + 1 : f.index("flowid")]))
        if all(int.from_bytes(packet[at : at + w], "big") & mask == value for w, value, mask, at in clauses):
            return f[f.index("flowid") + 1]
    return f"1:{root[root.index('default') + 1]}"


def _plan(egress: str, **kw):
    spec = ClusterSpec(**{"nodes": 4, "link_bits": 200 * MBIT, **kw})
    return build_plan(spec, "lpc1", egress=egress)


def test_the_shared_port_takes_every_short_packet_first_and_the_rest_in_one_fifo():
    """As the documents' figures were measured: a short data segment (gloo's notice) goes
    first too, and may overtake its own stream's queued segments."""
    for shaping in _plan("shared", layout="racks", racks=2).shaping:
        assert shaping.peers == () and not shaping.pure_acks
        assert _queue(shaping, _packet("10.213.0.2")) == "1:10"
        assert _queue(shaping, _packet("10.213.0.2", payload=40, flags=PSH | ACK)) == "1:10"
        assert _queue(shaping, _packet("10.213.0.2", payload=1448, flags=PSH | ACK)) == "1:20"
        assert _queue(shaping, _packet("10.213.0.3", payload=65000)) == "1:20"


def test_per_peer_gives_each_node_a_fifo_per_destination_and_only_pure_acks_go_first():
    plan = _plan("per-peer")
    addresses = [n.address for n in plan.nodes]
    for node in plan.nodes:
        own, switch_end = plan.port_shaping(node.index, plan.spec.link_bits)
        assert own in plan.shaping and switch_end in plan.shaping
        assert (own.namespace, own.device) == (node.namespace, NODE_IF)
        others = [a for a in addresses if a != node.address]
        assert list(own.peers) == others and own.pure_acks
        queues = {a: _queue(own, _packet(a, payload=65000)) for a in others}
        assert len(set(queues.values())) == len(others)  # a FIFO of its own for each destination
        assert not {"1:10", "1:20"} & set(queues.values())
        for address, queue in queues.items():
            assert _queue(own, _packet(address)) == "1:10"  # a pure ACK: first
            for flags in (PSH | ACK, ACK | FIN, SYN, SYN | ACK):  # a notice, a close, a connect: its stream's queue
                assert _queue(own, _packet(address, payload=40 if flags & PSH else 0, flags=flags)) == queue
            assert _queue(own, _packet(address, payload=1448, flags=ACK)) == queue  # data with no PSH
            assert _queue(own, _packet(address, options=1)) == queue  # IP options: not read as TCP
            assert _queue(own, _packet(address, proto=17)) == queue  # UDP whose byte 33 reads 0x10
        assert _queue(own, _packet("10.213.0.99", payload=1000)) == "1:20"  # no node: the default FIFO
        assert switch_end.peers == () and switch_end.pure_acks  # a switch's port: one FIFO, as on real ones
        assert _queue(switch_end, _packet(node.address)) == "1:10"
        assert _queue(switch_end, _packet(node.address, payload=40, flags=PSH | ACK)) == "1:20"


def test_per_pair_also_gives_the_switchs_port_toward_a_node_a_fifo_per_source():
    """A notice from one node no longer waits behind another node's data at the port they
    share, and every stream keeps its order: all of a source's packets but pure ACKs take
    its one queue."""
    plan, peer = _plan("per-pair", layout="racks", racks=2), _plan("per-peer", layout="racks", racks=2)
    addresses = [n.address for n in plan.nodes]
    for node in plan.nodes:
        own, switch_end = plan.port_shaping(node.index, plan.spec.link_bits)
        assert own == peer.port_shaping(node.index, plan.spec.link_bits)[0]  # the node's own port as per-peer's
        others = [a for a in addresses if a != node.address]
        assert list(switch_end.peers) == others and switch_end.pure_acks and switch_end.by == "src"
        queues = {a: _queue(switch_end, _packet(node.address, payload=65000, src=a)) for a in others}
        assert len(set(queues.values())) == len(others) and not {"1:10", "1:20"} & set(queues.values())
        for source, queue in queues.items():
            assert _queue(switch_end, _packet(node.address, src=source)) == "1:10"  # a pure ACK: first
            assert _queue(switch_end, _packet(node.address, payload=40, flags=PSH | ACK, src=source)) == queue
    uplinks = [s for s in plan.shaping if s.device.startswith("up")]
    assert uplinks and all(s.pure_acks and s.peers == () for s in uplinks)  # a switch's uplink: one FIFO


def test_every_per_peer_queue_is_a_bounded_fifo_and_the_rates_add_up_to_the_port():
    plan = _plan("per-peer", nodes=16, layout="racks", racks=4)
    for shaping in plan.shaping:
        commands = shaping.commands()
        leaves = [c for c in commands if "class" in c and c[c.index("parent") + 1] == "1:1"]
        assert [c[c.index("classid") + 1] for c in leaves] == ["1:10", "1:20", *shaping.peer_classes]
        assert len(set(shaping.peer_classes)) == len(shaping.peers)
        fifos = {c[c.index("parent") + 1]: c for c in commands if "bfifo" in c}
        assert sorted(fifos) == sorted(["1:20", *shaping.peer_classes])
        assert {int(c[c.index("limit") + 1]) for c in fifos.values()} == {shaping.limit_bytes}
        assured = sum(int(c[c.index("rate") + 1].removesuffix("bit")) for c in leaves)
        assert shaping.bits - len(leaves) <= assured <= shaping.bits  # what is assured fits the port
        for c in leaves:  # and every queue may use the whole port when the others are idle
            assert c[c.index("ceil") + 1] == f"{shaping.bits}bit"
    uplinks = [s for s in plan.shaping if s.device.startswith("up")]
    assert len(uplinks) == 6 and all(s.pure_acks and s.peers == () for s in uplinks)


def test_the_plan_says_how_its_ports_queue_and_refuses_an_unknown_egress():
    """per-pair is the default of the plan and of the command line; per-peer and shared stay
    to re-run a figure measured with them."""
    default = build_plan(ClusterSpec(nodes=3, link_bits=parse_rate("200mbit")), "lpc1")
    assert default.egress == "per-pair" and all(s.peers for s in default.shaping)
    assert build_parser().parse_args(["--", "true"]).egress == "per-pair"
    assert build_parser().parse_args(["--egress", "per-peer", "--", "true"]).egress == "per-peer"
    assert "a FIFO per destination at each node's own port, pure ACKs first" in _plan("per-peer").describe_links()
    assert "and ACKs first per 200mbit port" in _plan("shared").describe_links()
    assert (
        "per destination at each node's own port and per source at the switch's" in _plan("per-pair").describe_links()
    )
    assert build_parser().parse_args(["--egress", "per-pair", "--", "true"]).egress == "per-pair"
    with pytest.raises(ClusterSpecError, match="--egress must be one of shared, per-peer, per-pair, got 'fair'"):
        _plan("fair")


@needs_namespaces
def test_the_kernel_takes_the_per_peer_queues_of_a_real_cluster(tmp_path):
    """Node 0 lists its own port's classes from inside the cluster: one per other node."""
    proc = subprocess.run([*CLUSTER, "--nodes", "3", "--egress", "per-peer", "--fidelity-window", "0.3", "--logs",
                           str(tmp_path), "--", "tc", "class", "show", "dev", NODE_IF],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "a FIFO per destination at each node's own port" in proc.stderr.splitlines()[0], proc.stderr
    shown = (tmp_path / "node0.log").read_text() if (tmp_path / "node0.log").exists() else proc.stdout + proc.stderr
    for classid in ("1:10", "1:20", "1:100", "1:101"):
        assert f"class htb {classid} " in shown, shown
    assert "class htb 1:102 " not in shown, shown
    assert not [n for n in list_namespaces() if n.startswith(f"lpc{proc.pid}-")]


@needs_namespaces
def test_the_kernel_takes_the_per_source_queues_of_the_switchs_ports(tmp_path):
    """``tc`` takes the switch's per-source filters, and the fidelity check passes with them."""
    proc = subprocess.run([*CLUSTER, "--nodes", "3", "--egress", "per-pair", "--fidelity-window", "0.3", "--logs",
                           str(tmp_path), "--", "true"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "and per source at the switch's" in proc.stderr.splitlines()[0], proc.stderr
    assert "faithful" in (tmp_path / "cluster.txt").read_text()
    assert not [n for n in list_namespaces() if n.startswith(f"lpc{proc.pid}-")]
