"""What a measured figure depends on besides the code, saved beside it and printed in the
document: the CPU, its cores and memory, the kernel, Python and torch."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine() -> dict:
    """This machine as a record: cpu, cores, memory_gib, os, python, torch, threads (torch's
    intra-op threads) and cuda (whether torch sees a GPU)."""
    import torch

    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        cpuinfo, meminfo = Path("/proc/cpuinfo").read_text(), Path("/proc/meminfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
        mem = [int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")]
        memory_gib = round(mem[0] / 2**20, 1) if mem else None
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def describe(m: dict | str) -> str:
    """A :func:`machine` record as one sentence of a document (a string is kept as it is:
    older records saved the sentence itself)."""
    if isinstance(m, str):
        return m
    memory = f", {m['memory_gib']} GiB memory" if m.get("memory_gib") else ""
    return (
        f"{m['cpu']}, {m['cores']} cores{memory}, {m['os']}, Python {m['python']}, torch {m['torch']} "
        f"({m['threads']} intra-op threads by default){', CUDA' if m.get('cuda') else ', no GPU'}"
    )


def briefly() -> str:
    """This machine in a few words, the GPU named: CPU, threads, GPU, torch."""
    import torch

    m = machine()
    gpu = torch.cuda.get_device_name(0) if m["cuda"] else "no GPU"
    return f"{m['cpu']}, {m['threads']} threads, {gpu}, torch {m['torch']}"
