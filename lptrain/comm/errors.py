"""Errors raised by the communicators, so callers can tell bad input from a missing backend."""


class CollectiveInputError(ValueError):
    """The tensors or arguments of a collective call are not valid; nothing was touched."""


class BackendUnavailableError(RuntimeError):
    """The requested algorithm or device cannot run on this machine (no CUDA, no NCCL)."""
