"""lptrain.comm: collective algorithms for large messages, as schedules, and their executors.

>>> from lptrain.comm import build_communicator
>>> comm = build_communicator("lp", ["cpu"] * 4, block_size="1M")
>>> comm.allreduce(tensors)        # tensors[i] on devices[i], summed in place
"""

from lptrain.comm.communicator import Communicator, ScheduleCommunicator
from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError
from lptrain.comm.registry import NAMES, available, build_communicator, options_of
from lptrain.comm.schedule import Kind, Schedule, Transfer

__all__ = [
    "NAMES",
    "BackendUnavailableError",
    "CollectiveInputError",
    "Communicator",
    "Kind",
    "Schedule",
    "ScheduleCommunicator",
    "Transfer",
    "available",
    "build_communicator",
    "options_of",
]
