"""Where no tuning file answers: the schedule the simulator prices cheapest.

Every schedule (for an allreduce, every variant too: LP's two constructions) is priced on
a model of the transport (``lptrain.sim``) at LP's cost-model block, and the cheapest wins.
"""

from __future__ import annotations

from lptrain.auto.tuning import Choice
from lptrain.comm.algorithms import SCHEDULES, WITH_VARIANTS, resolve
from lptrain.comm.sizes import format_size
from lptrain.sim.predict import predict
from lptrain.sim.topology import build_topology

SIMULATED = WITH_VARIANTS


def simulated_choice(op: str, nbytes: int, world_size: int, topology: str) -> Choice:
    """The cheapest schedule by the simulator on ``topology`` (LP at its cost-model block)."""
    topo = build_topology(topology, world_size)
    algos = SIMULATED if op == "allreduce" else SCHEDULES
    times = {a: predict(a, op, topo, max(nbytes, 4)).seconds * 1e6 for a in algos}
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    best = ranked[0][0]
    detail = f"{format_size(nbytes)} {op} on the {topology} model: " + ", ".join(f"{a} {t:.0f} us" for a, t in ranked)
    base, options = resolve(best)
    return Choice(base, options, "simulated", detail)
