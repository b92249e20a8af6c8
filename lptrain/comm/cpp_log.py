"""PyTorch's C++ warnings, silenced for a moment where lptrain reports the same failure itself.

PyTorch's store client (the TCPStore every process group is built on) writes a warning to
stderr for each call that finds the store's host gone, with the whole C++ stack of its
exception: some twenty lines per call, from every survivor, while the same error reaches
the caller as an exception that lptrain reports in one line naming the host
(``lptrain.comm.liveness``). c10 reads its minimum log level (``FLAGS_caffe2_log_level``,
set once from ``TORCH_CPP_LOG_LEVEL`` when torch is imported) at every line, so raising it
to errors around those calls, and back, silences exactly them; a warning another thread
writes in the same milliseconds is lost with them. Where libc10 does not export the flag,
nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

import torch

ERROR = 2  # c10's levels: 0 info, 1 warning, 2 error, 3 fatal

_lock = threading.Lock()
_quiet_depth = 0
_saved_level = 0


def _c10_log_level() -> ctypes.c_int | None:
    """c10's minimum level of a C++ log line (``FLAGS_caffe2_log_level``: 0 info, 1 warning,
    2 error), read at every line; None where the library does not export it."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return None


_LEVEL = _c10_log_level()


@contextlib.contextmanager
def quiet_cpp_warnings() -> Iterator[None]:
    """C++ warnings off while inside (errors still shown): PyTorch's store client writes one,
    with the C++ stack of its exception, for every call that finds the store's host gone,
    although the same error reaches the caller, which reports it in one line."""
    global _quiet_depth, _saved_level
    if _LEVEL is None:
        yield
        return
    with _lock:
        if _quiet_depth == 0:
            _saved_level = _LEVEL.value
            _LEVEL.value = max(_saved_level, ERROR)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                _LEVEL.value = _saved_level
