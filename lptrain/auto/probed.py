"""``comm.options.topology=probe``: the racks the processes measured at start, as a model.

The probe (``lptrain.comm.topology_probe``) says which ranks share a rack, a port's rate
and the uplink's; the transport's per-message cost comes from the link the communicators
measure anyway (``lptrain.comm.transport.link_of``). Together they are the simulator's
racks (``lptrain.sim.declared.DeclaredRacks``: one rack where the probe found none), so a
measured machine is priced exactly as a declared one, except that its steps are priced
``overlapped`` (``lptrain.sim.simulator``): the ranks measured are processes, whose
executor pays a message's endpoint cost while the link carries the last one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lptrain.comm.distributed import DEFAULT_TIMEOUT_S, checked_timeout, named_peer_failure, port_rate
from lptrain.comm.topology_probe import Racks, probe_racks
from lptrain.comm.transport import LinkCost, link_of
from lptrain.sim.declared import DeclaredRacks
from lptrain.sim.topology import Topology

PROBE = "probe"


def racks_model(racks: Racks, link: LinkCost | None = None) -> Topology:
    """The simulator's racks for what the probe found (the message cost from ``link``)."""
    world = sum(len(g) for g in racks.groups)
    uplink = (racks.uplink_bps or racks.port_bps) / racks.port_bps if racks.port_bps else 1.0
    declared = DeclaredRacks(
        len(racks.groups),
        racks.placement() if len(racks.groups) > 1 else "contiguous",
        uplink,
        port=racks.port_bps or None,
        overhead=link.alpha_s if link else None,
    )
    model = declared.build(world)
    model.layout = f"measured at start: {racks.describe()}"
    model.overlapped = True
    model.link_rate = 1 / link.beta_s_per_byte if link else None
    model.port_rate = port_rate(link)
    return model


def probed_model(group, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> Topology:
    """Every rank together: the probe's racks of ``group`` as the simulator's model. Each wait
    of the probe ends at ``timeout_s``; a peer that dies or stalls meanwhile is a
    ``CollectiveError`` naming it."""
    bound = checked_timeout(timeout_s)
    with named_peer_failure(f"rank {dist.get_rank(group)}: probing the racks at start failed"):
        return racks_model(probe_racks(group, device, timeout=bound), link_of(group, device, bound))
