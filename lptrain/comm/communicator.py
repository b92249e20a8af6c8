"""The in-process communicators: one process, one tensor per device.

``DeviceCommunicator`` owns a fixed list of devices and runs in-place collectives on one
tensor per device, as the protocol (``lptrain.comm.protocol``) says. It does what every
in-process algorithm shares: it checks the input completely before touching anything
(the checks common to every executor are ``lptrain.comm.checks``'), accumulates
half-precision reductions in float32 (by default), and applies ``op="avg"``; subclasses
only move sums. ``ScheduleCommunicator`` runs an algorithm's schedules (lp, mst, be,
ring) with the in-process executor; ``lptrain.comm.nccl`` calls NCCL itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lptrain.comm.checks import HALF_DTYPES, SUPPORTED_DTYPES, check_arguments, check_dtype
from lptrain.comm.cuda_graph import GraphReplay, check_cuda_graph
from lptrain.comm.devices import parse_devices
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.executor import CudaLinks, bind_cpu, run_cuda
from lptrain.comm.peer_kernel import choose_kernel
from lptrain.comm.plan import Plan, compile_plan
from lptrain.comm.protocol import wants
from lptrain.comm.schedule import Schedule
from lptrain.comm.transport import LinkCost


class DeviceCommunicator(ABC):
    """In-place broadcast, reduce and allreduce over ``tensors[i]`` on ``devices[i]``."""

    name: str = "?"
    dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES  # what the transport can move
    link: LinkCost | None = None  # one process: no transport between processes

    def __init__(self, devices: Sequence[str | torch.device], *, accumulate_fp32: bool = True) -> None:
        self.devices = parse_devices(devices)
        self.world_size = len(self.devices)
        self.accumulate_fp32 = bool(accumulate_fp32)
        self._scratch: dict[tuple, torch.Tensor] = {}
        self._disjoint: dict[tuple, None] = {}  # (bytes, addresses...) of arguments found not to overlap

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, devices={[str(d) for d in self.devices]})"

    # -- public collectives ---------------------------------------------------------
    def broadcast(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        """Copy ``tensors[root]`` into every other tensor."""
        flat = self._check(tensors, root=root)
        if self.world_size > 1 and flat[0].numel():
            with torch.no_grad():
                self._run("broadcast", flat, root, inputs_are_scratch=False)

    def reduce(self, tensors: Sequence[torch.Tensor], root: int = 0, op: str = "sum") -> None:
        """Sum (or average) every tensor into ``tensors[root]``; the others are left unchanged."""
        flat = self._check(tensors, root=root, op=op)
        with torch.no_grad():
            self._reduction("reduce", flat, root, op)

    def allreduce(self, tensors: Sequence[torch.Tensor], op: str = "sum") -> None:
        """Sum (or average) the tensors; every tensor ends bitwise identical."""
        flat = self._check(tensors, op=op)
        with torch.no_grad():
            self._reduction("allreduce", flat, None, op)

    def describe(self, topic: str | None = None) -> list[str]:
        """What this communicator decided (nothing, unless a subclass says otherwise)."""
        wants(topic, "execution")
        return []

    def prepare(self, op: str, nbytes: int) -> None:
        """Nothing to get ready: schedules and plans are built at the first call of each shape."""
        return None

    # -- what subclasses provide ------------------------------------------------------
    @abstractmethod
    def _run(self, op: str, flat: list[torch.Tensor], root: int | None, inputs_are_scratch: bool) -> None:
        """Sum (reduce, allreduce) or copy (broadcast) in place on flat tensors.

        ``inputs_are_scratch`` says the non-root tensors of a reduce may be overwritten
        (they are float32 copies made here), so no work buffer is needed.
        """

    # -- shared machinery ---------------------------------------------------------------
    def _reduction(self, op: str, flat: list[torch.Tensor], root: int | None, how: str) -> None:
        outputs = range(self.world_size) if root is None else [root]
        widen = self.accumulate_fp32 and flat[0].dtype in HALF_DTYPES
        if flat[0].numel() == 0:
            return
        if widen:
            work = [self._buffer(("fp32", r), t.numel(), torch.float32).copy_(t) for r, t in enumerate(flat)]
            if self.world_size > 1:
                self._run(op, work, root, inputs_are_scratch=True)
            for r in outputs:
                if how == "avg":
                    work[r].div_(self.world_size)
                flat[r].copy_(work[r])
            return
        if self.world_size > 1:
            self._run(op, flat, root, inputs_are_scratch=False)
        if how == "avg":
            for r in outputs:
                flat[r].div_(self.world_size)

    def _buffer(self, key: tuple, n: int, dtype: torch.dtype) -> torch.Tensor:
        """A scratch tensor of ``n`` elements on device ``key[1]``, reused across calls.

        Reuse matters: a fresh large allocation costs a page fault per page on the CPU,
        more than the reduction itself. (On CUDA, scratch is only touched on streams
        ordered after the current stream, so reuse from call to call is safe.)
        """
        rank = key[1]
        buf = self._scratch.get((key, dtype))
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=self.devices[rank])
            self._scratch[(key, dtype)] = buf
        return buf[:n]

    def _check(
        self, tensors: Sequence[torch.Tensor], root: int | None = None, op: str | None = None
    ) -> list[torch.Tensor]:
        """Validate everything before anything is touched; return flat views."""
        p = self.world_size
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
            raise CollectiveInputError(f"expected a list of {p} tensors (one per device), got {type(tensors).__name__}")
        if len(tensors) != p:
            raise CollectiveInputError(
                f"expected {p} tensors, one per device {[str(d) for d in self.devices]}, got {len(tensors)}"
            )
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise CollectiveInputError(f"tensors[{i}] is a {type(t).__name__}, not a torch.Tensor")
        first = tensors[0]
        check_dtype(first.dtype, self.dtypes, f" by {self.name}" if self.dtypes is not SUPPORTED_DTYPES else "")
        for i, t in enumerate(tensors):
            if t.shape != first.shape:
                raise CollectiveInputError(
                    f"tensors[{i}] has shape {tuple(t.shape)} but tensors[0] has {tuple(first.shape)}"
                )
            if t.dtype != first.dtype:
                raise CollectiveInputError(f"tensors[{i}] has dtype {t.dtype} but tensors[0] has {first.dtype}")
            if t.device != self.devices[i]:
                raise CollectiveInputError(
                    f"tensors[{i}] is on {t.device} but this communicator's device {i} is {self.devices[i]}"
                )
            if not t.is_contiguous():
                raise CollectiveInputError(
                    f"tensors[{i}] is not contiguous (strides {t.stride()}); pass t.contiguous()"
                )
        spans = (first.numel() * first.element_size(), *(t.data_ptr() for t in tensors))
        if spans not in self._disjoint:  # the same memory as a recent call: already checked
            self._check_no_aliasing(tensors)
            self._disjoint[spans] = None
            if len(self._disjoint) > 8:
                del self._disjoint[next(iter(self._disjoint))]
        check_arguments(p, root=root, op=op, dtype=first.dtype)
        return [t if t.dim() == 1 else t.view(-1) for t in tensors]

    @staticmethod
    def _check_no_aliasing(tensors: Sequence[torch.Tensor]) -> None:
        """Two arguments sharing memory would be summed into each other: refuse them."""
        spans = sorted(
            (t.device.type, t.device.index or 0, t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), i)
            for i, t in enumerate(tensors)
            if t.numel()
        )
        for a, b in zip(spans, spans[1:]):
            if a[:2] == b[:2] and b[2] < a[3]:
                i, j = sorted((a[4], b[4]))
                raise CollectiveInputError(
                    f"tensors[{i}] and tensors[{j}] share memory; each device needs its own tensor"
                )


class ScheduleCommunicator(DeviceCommunicator):
    """Runs an algorithm's schedules with the in-process executor.

    ``builders`` maps each op to a function ``(world_size, count, root, itemsize) ->
    Schedule``; schedules and their compiled plans are cached per message shape, so a
    training loop pays for building them once.
    """

    def __init__(
        self,
        name: str,
        devices: Sequence[str | torch.device],
        builders: dict[str, Callable[[int, int, int | None, int], Schedule]],
        *,
        accumulate_fp32: bool = True,
        options: dict[str, Any] | None = None,
        reduce_kernel: str = "auto",
        cuda_graph: str = "auto",
    ) -> None:
        super().__init__(devices, accumulate_fp32=accumulate_fp32)
        self.name = name
        on_cuda = self.devices[0].type == "cuda"
        if not on_cuda:  # refuses peer clearly; the CPU's add reads the other tensor in place anyway
            choose_kernel(reduce_kernel, cuda=False, have_cupy=False, peer_access=False)
        self.options = {**(options or {}), "reduce_kernel": reduce_kernel, "cuda_graph": check_cuda_graph(cuda_graph)}
        self._builders = builders
        self._plans: dict[tuple, Plan] = {}
        self._bound: OrderedDict[tuple, list] = OrderedDict()  # plans bound to tensors, most recent last
        self._links = CudaLinks(self.devices, reduce_kernel) if on_cuda else None
        self._graphs = GraphReplay(cuda_graph, self.devices) if on_cuda else None

    def describe(self, topic: str | None = None) -> list[str]:
        """How it runs (``"execution"``), on CUDA: the reduction path of every pair of GPUs
        (measured now where ``reduce_kernel=auto`` needs it) and the cuda_graph decisions
        so far, one line each; nothing on the CPU."""
        if not wants(topic, "execution") or self._links is None:
            return []
        gpus = list(dict.fromkeys(self.devices))
        for src in gpus:
            for dst in gpus:
                self._links.kernel(src, dst)
        graphs = [f"cuda_graph {plan}: {how}" for plan, how in self._graphs.decisions.items()]
        return self._links.describe() + graphs

    def schedule(self, op: str, count: int, root: int | None = 0, dtype: torch.dtype = torch.float32) -> Schedule:
        """The schedule this communicator runs for ``op`` on ``count`` elements of ``dtype``."""
        if op not in self._builders:
            raise CollectiveInputError(f"unknown op {op!r}; valid ops: {', '.join(self._builders)}")
        root = None if op == "allreduce" else root
        itemsize = torch.empty((), dtype=dtype).element_size()
        return self._builders[op](self.world_size, count, root, itemsize)

    def plan(self, op: str, count: int, root: int | None, dtype: torch.dtype, inputs_are_scratch: bool) -> Plan:
        key = (op, count, root, dtype, inputs_are_scratch)
        if key not in self._plans:
            schedule = self.schedule(op, count, root, dtype)
            preserve = (
                frozenset() if inputs_are_scratch or op != "reduce" else frozenset(range(self.world_size)) - {root}
            )
            self._plans[key] = compile_plan(schedule, preserve)
        return self._plans[key]

    def _run(self, op: str, flat: list[torch.Tensor], root: int | None, inputs_are_scratch: bool) -> None:
        n, dtype = flat[0].numel(), flat[0].dtype
        plan = self.plan(op, n, root, dtype, inputs_are_scratch)
        work = list(flat)
        for r in plan.work_ranks:  # the ranks whose inputs a reduce must keep
            work[r] = self._buffer(("work", r), n, dtype)
        if self._links is None:
            for call in self._bind(plan, flat, work):
                call()
        else:
            label = f"{op} of {n} x {str(dtype).removeprefix('torch.')}"
            written = [*flat, *(work[r] for r in plan.work_ranks)]
            self._graphs.run(id(plan), label, written, lambda: run_cuda(plan, flat, work, self._links))

    BOUND_PLANS = 8  # how many (plan, tensors) bindings to keep

    def _bind(self, plan: Plan, flat: list[torch.Tensor], work: list[torch.Tensor]) -> list:
        """The plan's calls on views of these tensors, kept for the next call on the same memory.

        The key is the plan and the tensors' addresses. It cannot name other memory than
        the views do: the views keep their storage alive, so no new tensor can be given
        those addresses while the binding is kept; a new tensor at a kept address is a view
        of that same storage. Only the last few bindings are kept, so a communicator does
        not hold on to the buffers of tensors its caller has dropped for long.
        """
        key = (id(plan), *(t.data_ptr() for t in flat), *(w.data_ptr() for w in work))
        calls = self._bound.get(key)
        if calls is None:
            calls = bind_cpu(plan, flat, work)
            self._bound[key] = calls
            if len(self._bound) > self.BOUND_PLANS:
                self._bound.popitem(last=False)
        else:
            self._bound.move_to_end(key)
        return calls
