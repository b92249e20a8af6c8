"""lptrain.auto: ``comm=auto``, the algorithm this machine measured (or the simulator
priced) fastest, per operation and message size.

Choosing stands above measuring: this package imports the collectives (``lptrain.comm``)
and the simulator (``lptrain.sim``); neither imports it. ``lptrain.communicators`` builds
an ``AutoCommunicator`` for ``build_communicator("auto", ...)``.
"""

from lptrain.auto.communicator import AutoCommunicator
from lptrain.auto.simulated import simulated_choice
from lptrain.auto.tuning import Choice, TuningTable

__all__ = ["AutoCommunicator", "Choice", "TuningTable", "simulated_choice"]
