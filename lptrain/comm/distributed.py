"""The multi-process executor: the same schedules over ``torch.distributed``.

One tensor per rank (gloo on the CPU, NCCL on GPUs), launched with ``torchrun``: no
home-made transport. Each rank runs its part of the schedule as a dataflow of segments
(``lptrain.comm.dataflow``): a segment is sent as soon as what it depends on has
arrived, receives are posted ahead into staging buffers kept from call to call, and
each is added the moment it is in while later ones are still in flight. Messages travel
as raw bytes, so every dtype goes over any backend.

Two safety nets, because a distributed job fails in ways a single process cannot:

* a timeout on every message: a peer that died or stalls makes the others stop with
  an error naming the operation, the step and the peer, instead of hanging; and since a
  rank's socket only knows the peer it talked to, every rank keeps a heartbeat in the
  group's store (``lptrain.comm.liveness``), so that each survivor names the rank that
  stopped answering, whichever peer it was waiting for;
* a desync check: before each collective the ranks compare a fingerprint (sequence
  number, operation, shape, dtype, algorithm, root) with one small allreduce of its hash;
  a mismatch fails on every rank and shows every rank's side, instead of producing
  garbage or a hang. ``check_desync=False`` saves even that one message.

``nccl`` here means the backend's own collective (``torch.distributed.all_reduce`` and
friends): gloo's or NCCL's native algorithm, the baseline the schedules are held to.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lptrain.comm import bounded, liveness
from lptrain.comm.checks import HALF_DTYPES, SUPPORTED_DTYPES, backend_dtypes, check_arguments, check_dtype
from lptrain.comm.dataflow import Action, Profile, StagingPool, rank_program, run_batched_steps, run_program
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.program import auto_segment_bytes as program_segment_bytes
from lptrain.comm.program import fast_link, pacing_rate
from lptrain.comm.protocol import Tensors, wants
from lptrain.comm.schedule import Schedule
from lptrain.comm.sizes import parse_size
from lptrain.comm.transport import LinkCost

DEFAULT_SEGMENT = "auto"  # lptrain.comm.program.auto_segment_bytes: the rule and its reasons
DEFAULT_WINDOW = 16  # receives posted ahead
DEFAULT_TIMEOUT_S = 300.0  # seconds a peer may be silent before it is an error


def link_rate(link: LinkCost | None) -> float | None:
    """The measured link's bytes per second (the ring's slowest), or None where none was measured."""
    return None if link is None else 1.0 / link.beta_s_per_byte


def port_rate(link: LinkCost | None) -> float | None:
    """A port's bytes per second as measured (the ring's fastest link where it stood apart from
    the slowest, else the one figure), or None where none was measured."""
    if link is None:
        return None
    return 1.0 / (link.port_beta_s_per_byte or link.beta_s_per_byte)


def auto_segment_bytes(nbytes: int, world_size: int, link: LinkCost | None = None, rule: str = "link") -> int:
    """``segment_size=auto`` on the measured ``link`` under the op's message ``rule``
    (``lptrain.comm.program.auto_segment_bytes``)."""
    return program_segment_bytes(nbytes, world_size, link_rate(link), rule)


def parse_segment_size(segment_size: int | str) -> int | None:
    """The ``segment_size`` option in bytes, or None for ``auto``; refused below 8 bytes."""
    fixed = None if segment_size == "auto" else parse_size(segment_size, "segment_size")
    if fixed is not None and fixed < 8:
        raise CollectiveInputError(f"segment_size must be 'auto' or at least 8 bytes, got {segment_size!r}")
    return fixed


def segment_bytes(
    fixed: int | None, nbytes: int, world_size: int, link: LinkCost | None = None, rule: str = "link"
) -> int:
    """Bytes per message of an ``nbytes`` collective: ``fixed`` (the parsed option), or the
    automatic rule under the op's message ``rule``. The same on every rank, and LP's floor
    across processes."""
    return fixed if fixed is not None else auto_segment_bytes(nbytes, world_size, link, rule)


class CollectiveError(RuntimeError):
    """A distributed collective failed: a peer died, stalled past the timeout, or desynced."""


def one_line(err: BaseException, limit: int = 200) -> str:
    """A backend's error as one short line: gloo's and NCCL's may span several, start with the
    C++ source location and end in advice that the line before says better."""
    text = " ".join(str(err).split())
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ?", "", text)
    text = text.split(" This is typically caused by")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def peer_failure(what: str, err: BaseException) -> CollectiveError:
    """The error to raise when ``what`` (\"rank 0: allreduce #3 (lp) ...\") failed with ``err``:
    one line that names the rank that stopped answering, when the heartbeats tell."""
    silent = liveness.diagnose(reason=what)
    cause = f"{silent} ({one_line(err)})" if silent else f"a peer is probably gone: {one_line(err)}"
    return CollectiveError(f"{what}: {cause}")


def checked_timeout(timeout_s: float) -> datetime.timedelta:
    """``timeout_s`` as the bound of every wait, refused unless positive."""
    if not timeout_s > 0:
        raise CollectiveInputError(f"timeout_s must be positive, got {timeout_s}")
    return datetime.timedelta(seconds=timeout_s)


@contextlib.contextmanager
def named_peer_failure(what: str) -> Iterator[None]:
    """Inside, a backend's error (a peer died or stalled during ``what``, "rank 0: measuring
    ..."), becomes the ``CollectiveError`` that names the peer; bad input passes unchanged."""
    try:
        yield
    except (CollectiveInputError, CollectiveError):
        raise
    except Exception as err:
        raise peer_failure(what, err) from err


class DesyncError(CollectiveError):
    """The ranks did not all call the same collective on the same kind of tensor."""


def wait_timeout(backend: str, timeout: datetime.timedelta) -> datetime.timedelta | None:
    """The timeout to give each message's ``wait``, or None for none.

    On NCCL a ``wait`` with a timeout polls from the host, sleeping 1 ms between looks, so
    every step of a schedule would cost at least a millisecond (an LP allreduce of VGG-16
    over 8 GPUs has some 155 steps). A plain ``wait`` only orders the current stream after
    the message, and a dead or stalled peer is still caught: by the process group's own
    timeout, which its watchdog enforces (``init_process_group(timeout=...)``; the trainer
    passes ``trainer.comm_timeout_s``). Gloo's waits block anyway, so they keep the timeout.
    """
    return None if backend == "nccl" else timeout


class DistributedCommunicator:
    """``broadcast``, ``reduce`` and ``allreduce`` of one tensor per rank of ``group``.

    ``link`` is the transport as measured, when anything was sized for it: ``sized_for_link``
    names what (``"segments"`` with ``segment_size=auto``, LP's blocks with
    ``block_size=auto``), for ``describe``."""

    def __init__(
        self,
        name: str,
        group: dist.ProcessGroup,
        builders: dict[str, Callable[[int, int, int | None, int], Schedule]] | None,
        *,
        accumulate_fp32: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        check_desync: bool = True,
        segment_size: int | str = DEFAULT_SEGMENT,
        window: int = DEFAULT_WINDOW,
        link: LinkCost | None = None,
        sized_for_link: tuple[str, ...] = (),
        issue_order: str | dict[str, str] = "eager",
        message_rule: dict[str, str] | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise CollectiveInputError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group() first "
                "(torchrun sets up the environment for it)"
            )
        self.timeout = checked_timeout(timeout_s)
        self.segment_bytes = parse_segment_size(segment_size)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CollectiveInputError(f"window must be a positive number of receives, got {window!r}")
        self.window = window
        self.name = name
        # Held weakly: torch's registry keeps the group alive until destroy_process_group, and a
        # group object still referenced after that is torn down at interpreter exit, where gloo
        # aborts some of the time ("terminate called without an active exception": 2 runs in 12
        # with 4 processes on this machine, none in 12 once the reference was dropped).
        self._group = weakref.ref(group)
        self._global_ranks = [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))]
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = dist.get_backend(group)
        self.accumulate_fp32, self.check_desync = bool(accumulate_fp32), bool(check_desync)
        self._builders = builders  # None: the backend's own collectives
        self._schedules: dict[tuple, Schedule] = {}
        self._programs: dict[tuple, tuple[Action, ...]] = {}
        self._pool = StagingPool()
        # The copy a reduce runs on where the caller's tensor must stay as it was (a rank other
        # than the root), or the float32 one of a half-precision tensor: kept from call to call,
        # since a fresh one faults all its pages in every call (4096 for 16 MiB), and with more
        # ranks than cores the ranks that make it entered the schedule 2 to 75 ms after the root
        # (BE's reduce over 8 emulated nodes at 200 Mbit/s: 1.82 to 2.13 n/B, the model 1.75).
        self._copies = StagingPool()
        self.profile = Profile()  # where this rank's time went in the schedules' calls
        self.issue_order = issue_order  # how far the executor may overlap steps: one, or the algorithm's per op
        # how each op cuts its messages on a slow link (lptrain.comm.program.MESSAGE_RULES), per op
        self.message_rule = dict(message_rule or {})
        self.link = link  # the measured transport: automatic segments and LP's blocks were sized for it
        self.sized_for_link = tuple(sized_for_link)
        # NCCL runs unbatched point-to-point operations one after the other: each step's
        # messages go as one batch there (run_batched_steps); gloo gets the dataflow
        self.batched_steps = self.backend == "nccl"
        self._seq = 0
        self.desync_checks = 0  # small allreduces of fingerprints so far (one per collective, or per caller's unit)
        if self.world_size > 1:
            liveness.start()  # every process's heartbeat, for naming a peer that stops answering
        self._step_hook: Callable[[str, int], None] | None = None  # tests use it to inject faults

    @property
    def group(self) -> dist.ProcessGroup:
        group = self._group()
        if group is None:
            raise CollectiveError(
                f"{self!r}: its process group was destroyed (torch.distributed.destroy_process_group); "
                "build a new communicator on a live group"
            )
        return group

    def __repr__(self) -> str:
        return f"DistributedCommunicator({self.name!r}, rank {self.rank} of {self.world_size}, {self.backend})"

    # -- public collectives -------------------------------------------------------------
    # ``tensors`` is this rank's one tensor, bare or in a list of one (the protocol's form).
    def broadcast(self, tensors: Tensors, root: int = 0) -> None:
        """Copy rank ``root``'s tensor into every rank's."""
        self._collective("broadcast", self._one("broadcast", tensors), root, "sum")

    def reduce(self, tensors: Tensors, root: int = 0, op: str = "sum") -> None:
        """Sum (or average) into rank ``root``'s tensor; the others are left unchanged."""
        self._collective("reduce", self._one("reduce", tensors), root, op)

    def allreduce(self, tensors: Tensors, op: str = "sum") -> None:
        """Sum (or average) every rank's tensor; all end bitwise identical."""
        self._collective("allreduce", self._one("allreduce", tensors), None, op)

    def describe(self, topic: str | None = None) -> list[str]:
        """How it runs (``"execution"``): what was sized for the transport as measured."""
        if not wants(topic, "execution") or self.link is None or not self.sized_for_link:
            return []
        sized = " and ".join(self.sized_for_link)
        return [f"{self.name} across processes: {sized} sized for this transport as measured, {self.link.describe()}"]

    def prepare(self, op: str, nbytes: int) -> None:
        """Nothing to get ready: schedules and programs are built at the first call of each shape."""

    def schedule(self, op: str, count: int, root: int | None = 0, dtype: torch.dtype = torch.float32) -> Schedule:
        if self._builders is None:
            raise CollectiveInputError(f"{self.name} runs the backend's own collectives: it has no schedule")
        root = None if op == "allreduce" else root
        key = (op, count, root, dtype)
        if key not in self._schedules:
            itemsize = torch.empty((), dtype=dtype).element_size()
            self._schedules[key] = self._builders[op](self.world_size, count, root, itemsize)
        return self._schedules[key]

    # -- machinery ------------------------------------------------------------------------
    @staticmethod
    def _one(op: str, tensors: Tensors) -> torch.Tensor:
        """This rank's tensor, given bare or as the one item of a list."""
        if isinstance(tensors, torch.Tensor):
            return tensors
        if isinstance(tensors, Sequence) and len(tensors) == 1 and isinstance(tensors[0], torch.Tensor):
            return tensors[0]
        got = f"{len(tensors)} items" if isinstance(tensors, Sequence) else type(tensors).__name__
        raise CollectiveInputError(f"{op} takes this rank's tensor (bare or in a list of one), got {got}")

    def _check(self, op: str, tensor: torch.Tensor, root: int | None, how: str) -> None:
        if self._builders is None:  # the backend's own collective; the schedules move raw bytes
            check_dtype(tensor.dtype, backend_dtypes(self.backend), f" by the {self.backend} backend's own {op}")
        else:
            check_dtype(tensor.dtype, SUPPORTED_DTYPES)
        if not tensor.is_contiguous():
            raise CollectiveInputError(f"the tensor is not contiguous (strides {tensor.stride()}); pass t.contiguous()")
        check_arguments(self.world_size, root=root, op=how, dtype=tensor.dtype)

    def _fingerprint(self, op: str, tensor: torch.Tensor, root: int | None, how: str) -> dict[str, Any]:
        return {
            "seq": self._seq,
            "op": op,
            "shape": tuple(tensor.shape),
            "dtype": str(tensor.dtype),
            "algorithm": self.name,
            "root": root,
            "reduce_op": how,
            # ranks must cut messages alike
            "segment": self.segment_elements(tensor.numel(), tensor.element_size(), op),
        }

    def agree(self, fingerprint: dict[str, Any]) -> None:
        """The desync check on a caller's own ``fingerprint`` (``check_agreement``)."""
        if self.world_size > 1:
            self._agree(fingerprint)

    def _agree(self, mine: dict[str, Any]) -> None:
        self.desync_checks += 1
        check_agreement(self.group, mine, self.rank, self.world_size, self.name, self.timeout)

    def _collective(self, op: str, tensor: torch.Tensor, root: int | None, how: str) -> None:
        self._check(op, tensor, root, how)
        fingerprint = self._fingerprint(op, tensor, root, how)
        if self.check_desync and self.world_size > 1:
            self._agree(fingerprint)
        self._seq += 1
        if self.world_size == 1 or tensor.numel() == 0:
            if how == "avg":
                tensor.div_(self.world_size)
            return
        with torch.no_grad():
            flat = tensor.view(-1)
            widen = op != "broadcast" and self.accumulate_fp32 and flat.dtype in HALF_DTYPES
            keeps_input = op == "reduce" and self.rank != root
            work = self._copy(flat, torch.float32) if widen else (self._copy(flat, flat.dtype) if keeps_input else flat)
            if self._builders is None:
                self._native(op, work, root, fingerprint)
            else:
                self._run(self.schedule(op, work.numel(), root, work.dtype), work, fingerprint)
            if op == "broadcast" or op == "allreduce" or self.rank == root:
                if how == "avg":
                    work.div_(self.world_size)
                if work is not flat:
                    flat.copy_(work)

    def _copy(self, flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``flat`` as ``dtype`` in this communicator's kept buffer (``_copies``), valid until the next call."""
        nbytes = flat.numel() * torch.empty((), dtype=dtype).element_size()
        buffer = self._copies.take(flat.device, nbytes)
        self._copies.give(flat.device, buffer)  # one buffer, the largest asked for so far
        return buffer[:nbytes].view(dtype).copy_(flat)

    def _wait(self, work, what: str, fingerprint: dict[str, Any]) -> None:
        timeout = wait_timeout(self.backend, self.timeout)
        try:
            work.wait() if timeout is None else work.wait(timeout)
        except Exception as err:
            raise peer_failure(
                f"rank {self.rank}: {fingerprint['op']} #{fingerprint['seq']} ({self.name}) {what} failed after at "
                f"most {self.timeout.total_seconds():g} s",
                err,
            ) from err

    def _program(self, schedule: Schedule, itemsize: int) -> tuple[Action, ...]:
        key = (id(schedule), itemsize)
        if key not in self._programs:
            segment = self.segment_elements(schedule.count, itemsize, schedule.op)
            self._programs[key] = rank_program(schedule, self.rank, segment)
        return self._programs[key]

    def segment_elements(self, count: int, itemsize: int, op: str) -> int:
        """Elements per message of ``op``: the option, or the automatic rule under the op's
        message rule (the same on every rank)."""
        rule = self.message_rule.get(op, "link")
        return max(1, segment_bytes(self.segment_bytes, count * itemsize, self.world_size, self.link, rule) // itemsize)

    def _run(self, schedule: Schedule, work: torch.Tensor, fingerprint: dict[str, Any]) -> None:
        def wait(handle, what: str) -> None:
            self._wait(handle, what, fingerprint)

        def on_step(step: int) -> None:
            if self._step_hook is not None:
                self._step_hook(fingerprint["op"], step)

        itemsize = work.element_size()
        group, peers = self.group, self._global_ranks
        common = {
            "wait": wait,
            "pool": self._pool,
            "segment_bytes": self.segment_elements(schedule.count, itemsize, schedule.op) * itemsize,
            "num_steps": schedule.num_steps,
            "on_step": on_step,
            "profile": self.profile,
        }
        program = self._program(schedule, itemsize)
        if self.batched_steps:

            def batch(ops):
                return dist.batch_isend_irecv(
                    [dist.P2POp(dist.isend if send else dist.irecv, buf, peers[peer], group) for send, buf, peer in ops]
                )

            run_batched_steps(program, work, batch=batch, **common)
            return
        run_program(
            program,
            work,
            isend=lambda buf, peer: dist.isend(buf, peers[peer], group=group),
            irecv=lambda buf, peer: dist.irecv(buf, peers[peer], group=group),
            window=self.window,
            order=self.issue_order if isinstance(self.issue_order, str) else self.issue_order.get(schedule.op, "eager"),
            drain_bytes_per_s=pacing_rate(link_rate(self.link), port_rate(self.link)),
            stage_ahead=not fast_link(link_rate(self.link)),
            **common,
        )

    def _native(self, op: str, work: torch.Tensor, root: int | None, fingerprint: dict[str, Any]) -> None:
        # the operation itself gives up at the timeout: no gloo thread is left blocked behind a stalled peer
        if op == "allreduce":
            w = bounded.issue_all_reduce(work, self.group, self.timeout)
        elif op == "reduce":
            w = bounded.issue_reduce(work, root, self.group, self.timeout)
        else:
            w = bounded.issue_broadcast(work, root, self.group, self.timeout)
        self._wait(w, f"the backend's {op}", fingerprint)


def check_agreement(
    group: dist.ProcessGroup,
    mine: dict[str, Any],
    rank: int,
    world_size: int,
    name: str,
    timeout: datetime.timedelta,
) -> None:
    """The desync check: one small allreduce of the largest and the smallest hash of every
    rank's ``fingerprint`` (with ``op`` and ``seq`` keys, for the error). They differ only when
    the fingerprints do; then every rank gathers all of them to say how (``DesyncError``). For
    the communicators' own check per collective, and for a caller that checks once per unit
    of its own (the DDP hook: once per training step, whatever algorithm it runs). Each wait
    ends at ``timeout``, the caller's own, not the group's (``lptrain.comm.bounded``)."""
    digest = int.from_bytes(hashlib.blake2b(repr(sorted(mine.items())).encode(), digest_size=7).digest(), "big")
    nccl = dist.get_backend(group) == "nccl"  # NCCL reduces only tensors on the current GPU
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    probe = torch.tensor([digest, -digest], dtype=torch.int64, device=device)
    what = f"rank {rank}: the desync check before {mine['op']} #{mine['seq']} ({name}) failed"
    try:
        bounded.all_reduce(probe, group, timeout, op=dist.ReduceOp.MAX)
    except Exception as err:  # a dead or stalled peer shows up here first
        raise peer_failure(what, err) from err
    if probe.tolist() == [digest, -digest]:
        return
    try:
        everyone = bounded.all_gather_text(repr(mine), group, timeout, device)
    except Exception as err:
        raise peer_failure(f"{what}: the ranks disagree, and gathering their sides", err) from err
    sides = "\n".join(f"  rank {r}: {f}" for r, f in enumerate(everyone))
    raise DesyncError(f"rank {rank}: the ranks called different collectives (#{mine['seq']}):\n{sides}")
