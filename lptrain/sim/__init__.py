"""The simulator: the very same schedules, priced on a model of links.

``topology`` describes machines as directed links (latency, bandwidth) and routes;
``simulator`` prices a schedule step by step, sharing each link's bandwidth among the
transfers that cross it; ``calibrate`` fits the model's constants to runs measured on
this machine; ``costmodel`` holds the paper's closed forms for comparison.
"""

from lptrain.sim.simulator import simulate
from lptrain.sim.topology import TOPOLOGIES, Topology, build_topology

__all__ = ["TOPOLOGIES", "Topology", "build_topology", "simulate"]
