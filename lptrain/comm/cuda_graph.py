"""Replaying a plan as a CUDA graph, where that measures faster than launching it.

The in-process executor issues every block of a plan from Python: a stream wait or two,
a copy or an add, an event. For small messages those launches, not the GPU, are the
cost. A CUDA graph records the whole plan once (its streams, events and kernels) and
replays it with one launch. The graph is bound to the memory it was captured on, so it
is kept per (plan, tensors), as the CPU executor keeps its bound views, and it is used
only where it pays: ``cuda_graph=auto`` times both ways once per (plan, tensors) and
keeps the faster, saying which in ``decisions``. The inputs are saved and restored
around the trials, so the call's own result is computed once, from the caller's data.

Only for replicas that share one GPU: a graph belongs to one device, and capturing the
peer copies between GPUs in one graph is a question for a machine that has several.

That GPU need not be the current one (``cuda:1`` while the process's current device is
``cuda:0``). ``torch.cuda.graph`` captures on one stream per process, made on whatever
device was current at its first use, and binds the graph to the current device. So the
capture gets a capture stream of the replicas' GPU, and the capture and every replay run
with that GPU current; a capture that still records nothing (PyTorch only warns "The
CUDA Graph is empty") counts as a failed capture, and the plan runs eagerly, instead of
replaying nothing from then on.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.streams import stream_for

CUDA_GRAPH_MODES = ("auto", "on", "off")
TRIALS = 5


def check_cuda_graph(mode: object) -> str:
    if mode not in CUDA_GRAPH_MODES:
        raise CollectiveInputError(f"cuda_graph={mode!r} is not valid; valid choices: {', '.join(CUDA_GRAPH_MODES)}")
    return str(mode)


def prefer_graph(mode: str, eager_s: float | None, replay_s: float | None) -> bool:
    """``on`` always, ``off`` never, ``auto`` where the replay measured faster."""
    if mode != "auto":
        return mode == "on"
    return eager_s is not None and replay_s is not None and replay_s < eager_s


class GraphReplay:
    """The graphs of one communicator's plans, most recent last (at most ``KEEP``).

    Whether a plan is faster replayed is measured once per plan; a graph is captured once
    per (plan, tensors), since it is bound to their memory.
    """

    # A trainer calls one plan per gradient bucket every step (VGG-16 in 25 MiB buckets:
    # 21), so the graphs kept must outnumber the buckets, or every call would capture
    # again (and a capture synchronises the device). The plans allocate nothing while
    # captured, so a kept graph holds little memory beyond the caller's own tensors.
    KEEP = 64

    def __init__(self, mode: str, devices: Sequence[torch.device]) -> None:
        self.mode = check_cuda_graph(mode)
        self.one_gpu = len(set(devices)) == 1 and devices[0].type == "cuda"
        self.device = devices[0] if self.one_gpu else None  # the GPU captured on and replayed on
        self._graphs: OrderedDict[tuple, torch.cuda.CUDAGraph] = OrderedDict()
        self._replay: dict[object, bool] = {}  # plan -> replayed (True) or launched (False)
        self.decisions: dict[str, str] = {}  # what each plan runs as, and why

    def run(self, plan: object, label: str, tensors: Sequence[torch.Tensor], eager: Callable[[], None]) -> None:
        """Run ``eager`` (the plan on ``tensors``, the memory it writes), or its replay
        where that was chosen for ``plan``."""
        if self.mode == "off" or not self.one_gpu or self._replay.get(plan) is False:
            eager()
            return
        key = (plan, *(t.data_ptr() for t in tensors))
        graph = self._graphs.get(key)
        if graph is None:
            if plan not in self._replay:
                graph = self._decide(plan, label, tensors, eager)
            else:  # measured faster before: capture for this memory, nothing to time
                graph = self._capture(label, eager)
                if graph is None:
                    self._replay[plan] = False
            if graph is None:
                eager()
                return
            self._graphs[key] = graph
            if len(self._graphs) > self.KEEP:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        with torch.cuda.device(self.device):  # launched on the current stream of the graph's own GPU
            graph.replay()

    def _capture(self, label: str, eager: Callable[[], None]):
        graph = torch.cuda.CUDAGraph()
        try:
            # The replicas' GPU current and a capture stream on it: the graph is bound to
            # the current device, and the plan's link streams join the capture stream
            # only on their own GPU.
            # thread_local: the trainer's backward may be launching work from another
            # thread while a bucket's plan is captured on the communication thread.
            with (
                torch.cuda.device(self.device),
                warnings.catch_warnings(record=True) as caught,
                torch.cuda.graph(
                    graph, stream=stream_for(("capture",), self.device), capture_error_mode="thread_local"
                ),
            ):
                warnings.simplefilter("always")
                eager()  # recorded, not run
        except RuntimeError as err:  # said, not hidden: the decision names the reason
            torch.cuda.synchronize(self.device)
            self.decisions[label] = f"eager (the capture failed: {str(err).splitlines()[0]})"
            return None
        empty = [w for w in caught if "graph is empty" in str(w.message).lower()]
        for w in caught:
            if w not in empty:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if empty:
            torch.cuda.synchronize(self.device)
            self.decisions[label] = "eager (the capture recorded nothing)"
            return None
        return graph

    def _decide(self, plan: object, label: str, tensors: Sequence[torch.Tensor], eager: Callable[[], None]):
        saved = [t.clone() for t in tensors]

        def restore() -> None:
            for t, s in zip(tensors, saved):
                t.copy_(s)

        device = self.device
        eager()  # warm-up outside the capture: staging buffers, compiled kernels, streams
        restore()
        graph = self._capture(label, eager)
        if graph is None:
            self._replay[plan] = False
            return None
        eager_s = replay_s = None
        if self.mode == "auto":

            def replay() -> None:
                with torch.cuda.device(device):
                    graph.replay()

            eager_s = _time(eager, restore, device)
            replay_s = _time(replay, restore, device)
            restore()
        use = prefer_graph(self.mode, eager_s, replay_s)
        how = "asked for" if self.mode == "on" else f"measured {replay_s * 1e6:.0f} us vs {eager_s * 1e6:.0f} us eager"
        self.decisions[label] = f"{'graph' if use else 'eager'} ({how})"
        self._replay[plan] = use
        return graph if use else None


def _time(fn: Callable[[], None], restore: Callable[[], None], device: torch.device) -> float:
    """Median seconds per call, host launch and GPU work together (the restore excluded)."""
    times = []
    for _ in range(TRIALS):
        restore()
        torch.cuda.synchronize(device)
        began = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2]
