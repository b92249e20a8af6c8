"""lptrain.comm: collective algorithms for large messages, as schedules, and their executors.

Every communicator follows one protocol (``Communicator``, ``lptrain.comm.protocol``).
They are built by ``lptrain.communicators.build_communicator``, which stands above this
package (it also builds ``auto``, which stands above the simulator):

>>> from lptrain.communicators import build_communicator
>>> comm = build_communicator("lp", ["cpu"] * 4, block_size="1M")
>>> comm.allreduce(tensors)        # tensors[i] on devices[i], summed in place
"""

from lptrain.comm.communicator import DeviceCommunicator, ScheduleCommunicator
from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError
from lptrain.comm.protocol import Communicator
from lptrain.comm.schedule import Kind, Schedule, Transfer

__all__ = [
    "BackendUnavailableError",
    "CollectiveInputError",
    "Communicator",
    "DeviceCommunicator",
    "Kind",
    "Schedule",
    "ScheduleCommunicator",
    "Transfer",
]
