"""How each replica runs its forward and backward: eagerly or compiled, and in which memory format.

``trainer.compile`` wraps every replica's module in ``torch.compile`` (TorchInductor). The
wrapper is used for the training step only: the replicas' modules stay the plain ones, so
their parameters, the flat buffers behind them, the gradient hooks of the overlap (on the
parameters, not the modules: they fire after the compiled backward as after an eager one)
and everything a checkpoint holds are the same objects with the same names (no
``_orig_mod.`` prefix anywhere). Evaluation runs the plain module eagerly: it runs rarely,
in another mode and on a last batch of another size, each of which would compile again.

The replicas are copies of one class, so Dynamo compiles the forward once and serves the
other replicas from the same cache entry, or compiles once more per replica where its
guards tell them apart; the cache is made large enough for every replica either way, so
that none falls back to eager after the limit.

A compiled replica computes its backward as one graph: its gradients arrive together at
its end, so with ``trainer.overlap`` a bucket's collective starts once every replica's
backward has ended rather than part way through it (DDP's compiled optimizer splits the
graph at buckets for that; this trainer does not).

``channels_last`` puts the images in NHWC order before the forward (the weights are laid
out so by ``lptrain.train.replicas``), the order cuDNN's and oneDNN's fastest convolutions
take.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence

import torch
from torch import nn

# Dynamo's cache entries per compiled function: at least this many, and one per replica.
MIN_CACHE_ENTRIES = 8


def compile_problem(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot compile for ``device_type`` here (None: it can): Inductor
    turns the graphs into C++ on the CPU and into Triton kernels on CUDA."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return f"torch.compile does not support this Python ({torch.__version__})"
    if device_type == "cpu":
        names = cpp_compilers()
        if not any(shutil.which(c) for c in names):
            return (
                f"Inductor compiles CPU replicas with a C++ compiler and none was found"
                f" (looked for {', '.join(names)}; set CXX, or install g++)"
            )
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Inductor compiles CUDA replicas with Triton, which is not usable here (install triton)"
    return None


def cpp_compilers() -> list[str]:
    """The C++ compilers Inductor looks for on the CPU, in its order (``CXX`` when set, else g++)."""
    from torch._inductor import config

    return [c for c in config.cpp.cxx if c]


def replica_forwards(models: Sequence[nn.Module], compile: bool) -> list[Callable]:  # noqa: A002 - the option's name
    """What each replica's training step calls: its module, or the module compiled."""
    if not compile:
        return list(models)
    import torch._dynamo

    limit = max(MIN_CACHE_ENTRIES, 2 * len(models))
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
    return [torch.compile(m) for m in models]


def to_memory_format(images: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``images`` (N, C, H, W) in channels_last (NHWC) order when asked, else as they are."""
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images
