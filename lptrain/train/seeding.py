"""Where each replica's random draws (dropout) come from.

Every replica must draw different dropout masks (it sees different data, and equal
masks would correlate the sub-gradients), and a resumed run must draw what the
uninterrupted run drew. One process on the CPU has one generator, which the replicas use
in turn: different masks, and its state, saved in the checkpoint, resumes them. Every
GPU has its own generator, and so has every process: seeded alike they would give each
replica the same masks, and their states would have to be saved from every process and
restored onto the same number of GPUs. There, each replica's generator is instead
re-seeded before its forward pass from (seed, step, replica), a pure function: different
masks for every replica, the same ones after a resume with any number of GPUs, and no
generator state in the checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch


def reseeds_per_step(devices: Sequence[torch.device], processes: int) -> bool:
    """Whether replicas draw from generators re-seeded every step (see the module's text)."""
    return processes > 1 or any(d.type == "cuda" for d in devices)


def replica_seed(seed: int, step: int, replica: int) -> int:
    """A 63-bit seed for ``replica`` (its index among all processes' replicas) at ``step``:
    unrelated for neighbouring steps and replicas, the same on every machine."""
    digest = hashlib.blake2b(f"{seed}/{step}/{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def seed_device(device: torch.device, seed: int) -> None:
    """Seed the generator that ``device``'s random ops draw from, and only that one
    (``torch.manual_seed`` would seed every GPU as well)."""
    if device.type == "cuda":
        torch.cuda.init()  # the per-GPU generators exist once CUDA is initialised
        index = torch.cuda.current_device() if device.index is None else device.index
        torch.cuda.default_generators[index].manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)
