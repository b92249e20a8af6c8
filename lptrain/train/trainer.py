"""The BSP-SGD trainer: one process, one model replica per device.

Every iteration (``train_step``): take this process's share of the global batch from the
input pipeline (``lptrain.data.loader``), split it across the replicas, run forward and
backward on each, average the sub-gradients with the configured communicator, update,
and keep the parameters identical everywhere. Two ways to synchronise, both exact:

* ``allreduce``: allreduce the gradients, then every replica takes the same step.
* ``reduce``: reduce the gradients to the root, update there, broadcast the parameters
  (the paper's formulation).

Each is a strategy (``lptrain.train.sync``) that the step calls; the trainer takes a
checked ``RunConfig`` (``lptrain.train.run_config``) and reads typed values only.
"""

from __future__ import annotations

import contextlib
import copy
import math
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lptrain.comm.protocol import Communicator
from lptrain.comm.ranges import collective_range, phase_range
from lptrain.communicators import build_communicator
from lptrain.data import (
    Batches,
    StepBatchSampler,
    epochs_to_steps,
    eval_batches,
    load_data,
    prepare,
    resolve_workers,
    train_batches,
)
from lptrain.errors import ConfigError
from lptrain.models import SPECS, build_model, classification_loss
from lptrain.train.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    load_checkpoint,
    remove_stale_temporaries,
    resolve,
    save_checkpoint,
)
from lptrain.train.commtime import comm_times
from lptrain.train.compiled import replica_forwards, to_memory_format
from lptrain.train.launch import any_across, init_from_environment, max_across, same_everywhere, sum_across
from lptrain.train.log import Progress, RunLog, run_hparams
from lptrain.train.numerics import NumericsError, gradient_probe, gradient_verdict, nonfinite_entry, step_failure
from lptrain.train.overlap import OverlappedReduction, default_bucket_mb, gradient_buckets
from lptrain.train.precision import PRECISIONS, LossScaler, autocast, check_precision
from lptrain.train.profiling import StepProfiler, parse_step_range
from lptrain.train.replicas import Replicas
from lptrain.train.run_config import RunConfig
from lptrain.train.schedule import learning_rate
from lptrain.train.seeding import replica_seed, reseeds_per_step, seed_device
from lptrain.train.stepstats import comm_share, interval_mean, mean_std, share_text, timed
from lptrain.train.sync import SYNC_MODES
from lptrain.train.timing import PhaseTimer, Span, StepTimeline

__all__ = ["SYNC_MODES", "ConfigError", "RunConfig", "Summary", "Trainer"]

# After a failed step, how long to let a collective already running on the communication
# thread finish (in one process, moments; across processes it may wait on a peer that is
# gone, and the thread is a daemon: it cannot hold the process at exit).
OVERLAP_ABORT_WAIT_S = 10.0


@dataclass
class Summary:
    steps: int
    final_loss: float
    final_train_accuracy: float
    eval_accuracy: float | None
    eval_loss: float | None
    mean_compute_ms: float
    mean_comm_ms: float
    std_compute_ms: float  # spread over the timed steps (population standard deviation)
    std_comm_ms: float
    mean_comm_exposed_ms: float  # the part of the communication the step waited for (all of it without overlap)
    mean_comm_handoff_ms: float  # the step waited for the communication thread while no collective ran
    timed_steps: int  # steps in the means: all but the first of each session (its one-off set-up)
    mean_data_ms: float  # time blocked waiting for the input pipeline
    comm_fraction: float
    comm_GBps: float
    images_per_s: float  # global batch x steps run / train_s: wall clock, data wait included
    wall_s: float
    train_s: float  # wall clock of the training steps: wall_s less evaluation
    replicas_identical: bool
    devices: str  # "4 x cpu", "cuda:0,cuda:1", "2 processes x 4 x cpu"
    run_dir: str
    checkpoint: str | None
    interrupted_by: int = 0  # the signal that stopped the run early (SIGINT 2, SIGTERM 15), 0 when it ran out
    compile_s: float | None = None  # trainer.compile: the first step's wall clock, which compiled (not in the means)

    def render(self, config: RunConfig, num_params: int) -> str:
        acc = f"{100 * self.eval_accuracy:.2f}%" if self.eval_accuracy is not None else "n/a"
        lines = [
            "",
            f"=== lptrain summary: {config.model.name} ({num_params / 1e6:.2f}M parameters) on {config.data.name} ===",
            f"  communicator    {config.comm.name} ({config.sync.name}) over {self.devices}",
            f"  steps           {self.steps} in {self.wall_s:.1f} s, {self.images_per_s:.0f} images/s"
            f" (wall clock of {self.train_s - (self.compile_s or 0.0):.1f} s of training, evaluation"
            f"{' and the compiling step' if self.compile_s is not None else ''} excluded)",
            f"  final loss      {self.final_loss:.4f} (train accuracy {100 * self.final_train_accuracy:.1f}%)",
            f"  eval accuracy   {acc}",
            f"  data wait       {self.mean_data_ms:.1f} ms per iteration",
            f"  compute         {self.mean_compute_ms:.1f} ms per iteration (sd {self.std_compute_ms:.1f},"
            f" {self.timed_steps} timed steps)",
            f"  communication   {self.mean_comm_ms:.1f} ms per iteration (sd {self.std_comm_ms:.1f};"
            f" {share_text(self.comm_fraction)} of the step), {self.comm_GBps:.2f} GB/s",
            f"  exposed comm    {self.mean_comm_exposed_ms:.1f} ms per iteration (what the step waited for)",
            f"  hand-off        {self.mean_comm_handoff_ms:.1f} ms per iteration"
            " (the step waited, no collective running: the communication thread's wake-up and result)",
            f"  replicas        {'identical' if self.replicas_identical else 'DIVERGED'}",
            f"  logs            {self.run_dir}  (tensorboard --logdir {self.run_dir})",
        ]
        if self.checkpoint:
            lines.append(f"  checkpoint      {self.checkpoint}  (resume with trainer.resume={self.checkpoint})")
        if self.compile_s is not None:
            lines.append(f"  {compile_line(self.compile_s, 15)}")
        if self.interrupted_by:
            lines.append(f"  interrupted     after step {self.steps} (signal {self.interrupted_by})")
        return "\n".join(lines)


def compile_line(seconds: float, width: int = 0) -> str:
    """How long trainer.compile's first step took, said apart from the step times."""
    return f"{'compile':<{width}} {seconds:.1f} s (first step), not in the step times"


def describe_devices(devices, nprocs: int = 1) -> str:
    """``4 x cpu``, ``cuda:0,cuda:1``, with ``2 processes x`` in front under torchrun."""
    names = [str(d) for d in devices]
    text = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ",".join(names)
    return f"{nprocs} processes x {text}" if nprocs > 1 else text


def _announce(progress: Progress, log: RunLog, tag: str, prefix: str, lines: list[str]) -> None:
    """What the communicators decided: a line each on the console, one text in TensorBoard."""
    for line in lines:
        progress.message(prefix + line)
    if lines:
        log.text(tag, "\n\n".join(lines))


class Trainer:
    """Train as ``config`` says, writing into ``run_dir``.

    ``config`` is a checked configuration (``lptrain.settings.locations.compose_config``, or
    the command line's preflight, made it with ``check_config``), so a value out of range
    never reaches here, and the devices, batches and sync strategy come worked out. What only
    the devices, the data or the checkpoint can tell is checked here, as ``ConfigError``.
    """

    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        self.config, self.run_dir = config, Path(run_dir)
        t = config.trainer
        self.devices, self.sync = list(config.devices), config.sync
        self.rank, self.nprocs = init_from_environment(self.devices, t.comm_timeout_s)
        self.global_batch, self.local_batch = config.global_batch, config.local_batch  # images per step
        self.comm = self._communicator(config, t.comm_timeout_s, t.check_desync)
        # check_config has vetted the model's name and image size (before any data is read)
        self.spec, self.image_size = SPECS[config.model.name], config.model.image_size
        self.workers = resolve_workers(config.data.workers)
        self.pin_memory = any(d.type == "cuda" for d in self.devices)  # for non-blocking copies to the GPUs
        self.data = load_data(config.data)
        self.steps = epochs_to_steps(t.epochs, len(self.data.train), self.global_batch) if t.epochs else t.steps
        # stop_at ends this run early without changing the run: the learning-rate schedule
        # and the data order still span trainer.steps, so a resume continues it exactly.
        self.stop_at = self.steps if t.stop_at is None else t.stop_at
        if not 1 <= self.stop_at <= self.steps:
            raise ConfigError(f"trainer.stop_at={t.stop_at} is not valid; use a step from 1 to {self.steps} or null")
        torch.manual_seed(t.seed)  # the model's initialisation: the same in every process
        self.reseed = reseeds_per_step(self.devices, self.nprocs)
        model = build_model(config.model.name, self.data.num_classes, self.image_size, init=config.model.init)
        self.replicas = Replicas(model, self.devices, channels_last=t.channels_last)
        self.forwards = replica_forwards(self.replicas.models, t.compile)  # the modules, or compiled
        if self.devices[0].type == "cuda":
            torch.backends.cudnn.benchmark = t.cudnn_benchmark
        self.compile_s: float | None = None  # the first step's wall clock, when it compiled
        o = config.optim
        self.optimizers = [
            torch.optim.SGD(
                m.parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=o.nesterov
            )
            for m in self.sync.updated(self.replicas.models)  # the replicas that take the update
        ]
        self.precision = t.precision
        problem = check_precision(self.devices[0].type, self.precision)
        if problem:
            raise ConfigError(f"trainer.precision={self.precision} is not valid: {problem}; use fp32 or bf16")
        self.scaler = LossScaler(self.precision == "fp16")
        self.grad_dtype = PRECISIONS[config.comm.grad_dtype]
        self.bucket_mb = default_bucket_mb(t.bucket_mb, self.devices[0].type)
        self.buckets = self._buckets(self.bucket_mb)
        # Overlap: each bucket's collective starts on a communication thread as soon as
        # every replica has produced its gradients, while backward continues.
        self.overlap = (
            OverlappedReduction(self.replicas.models, self.devices, self.buckets, self._reduce_bucket)
            if t.overlap
            else None
        )
        self.start_step = 0
        if t.resume:
            self._restore(load_checkpoint(t.resume), resolve(t.resume))
        # A stop: the signal handler alone sets _stop_signal (this process's first SIGINT or
        # SIGTERM), and never clears it; _stop_requested is what every process agreed after
        # the last step, and _stop_by the signal they agreed on (the largest any received).
        # A signal that lands while the agreement runs is thus carried into the next one.
        self._stop_signal = 0
        self._stop_requested, self._stop_by = False, 0
        self._abort_requested = False  # a second Ctrl-C or SIGTERM: stop at once, without saving
        self._saved_step: int | None = None  # the step of the last checkpoint this session wrote
        self._grad_probe: torch.Tensor | None = None  # the numerics guard's test of this step's gradient

    # -- set-up helpers -------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        """Rank 0 logs, evaluates and checkpoints; the other processes only train."""
        return self.rank == 0

    def _communicator(self, config: RunConfig, timeout_s: float, check_desync: bool) -> Communicator:
        """This process's devices; under torchrun (where even one process joins its group) the
        processes too: the algorithm inside over the devices, across over torch.distributed."""
        name, options = config.comm.name, asdict(config.comm.options)
        if not dist.is_initialized():
            return build_communicator(name, self.devices, **options)
        across = {"timeout_s": timeout_s, "check_desync": check_desync}
        return build_communicator(name, self.devices, process_group=dist.group.WORLD, **across, **options)

    def _auto_choices(self) -> list[str]:
        """comm=auto: choose now for the trainer's own messages (each gradient bucket, and in
        reduce mode each bucket of weights broadcast back), so the first lines can say what
        runs and why."""
        param_itemsize = self.replicas.params[0].element_size()
        for start, stop in self.buckets:
            for op, nbytes in self.sync.messages(stop - start, self.grad_dtype.itemsize, param_itemsize):
                self.comm.prepare(op, nbytes)
        return self.comm.describe("choice")

    def _kernel_choices(self) -> list[str]:
        """How the messages run: on GPUs, how each pair of them adds the other's blocks
        (``reduce_kernel``) and which plans replay as CUDA graphs; under torchrun, what was
        sized for the transport as measured."""
        return self.comm.describe("execution")

    def _buckets(self, bucket_mb) -> list[tuple[int, int]]:
        """Whole parameters, from the last to the first (the order backward produces them),
        at least ``bucket_mb`` each; the same buckets with and without overlap."""
        sizes = [q.numel() for q in self.replicas.models[0].parameters() if q.requires_grad]
        elems = max(1, int(float(bucket_mb) * 2**20) // self.grad_dtype.itemsize) if bucket_mb else None
        return gradient_buckets(sizes, elems)

    def describe_buckets(self) -> str:
        """One line for the run's first lines: how the gradient is cut, and where that came from."""
        if self.bucket_mb is None:
            return "gradient in one bucket (trainer.bucket_mb unset): its collective starts when backward has ended"
        given = "" if self.config.trainer.bucket_mb is not None else ", the default on GPUs as in DDP"
        largest = max(b - a for a, b in self.buckets) * self.grad_dtype.itemsize / 2**20
        when = "each started while backward still runs" if self.overlap is not None else "after backward (overlap off)"
        return (
            f"gradient in {len(self.buckets)} bucket(s) of at least {self.bucket_mb:g} MiB"
            f" (trainer.bucket_mb={self.bucket_mb:g}{given}), the largest {largest:.1f} MiB, {when}"
        )

    def _reduce_bucket(self, k: int) -> None:
        """Average bucket ``k`` of the gradients as the sync strategy says (allreduce, or reduce
        to the root); in ``comm.grad_dtype`` when that is narrower (summed in float32, cast back)."""
        a, b = self.buckets[k]
        grads = [g[a:b] for g in self.replicas.grads]
        sent = grads if self.grad_dtype == grads[0].dtype else [g.to(self.grad_dtype) for g in grads]
        with collective_range(self.sync.reduction, self.comm.name, (b - a) * sent[0].element_size(), k):
            self.sync.reduce_gradients(self.comm, sent)
        if sent is not grads:
            for g, s in zip(self.sync.updated(grads), self.sync.updated(sent)):
                g.copy_(s)

    # -- one iteration ---------------------------------------------------------------------
    def train_step(
        self, step: int, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], timer: PhaseTimer
    ) -> dict[str, float]:
        """One iteration on the next batch of ``batches`` (this process's share of ``step``'s)."""
        began = time.perf_counter()
        with phase_range("data"):
            images, labels = next(batches)  # 1. the batch, and how long the input pipeline kept us waiting
        data_ms = (time.perf_counter() - began) * 1e3
        self._set_learning_rate(step)
        p, reps = self.replicas.world_size, self.replicas
        shards = list(zip(images.chunk(p), labels.chunk(p)))

        timer.start("comm_buffers")
        for dtype in reps.buffers[0]:  # batch-norm statistics follow the root
            self.comm.broadcast([b[dtype] for b in reps.buffers], root=0)
        timer.stop("comm_buffers")
        timer.start("compute")  # 2. forward and backward on every replica's slice, and
        results, spans = self._forward_backward_reduce(step, shards, timer)  # 3. average the sub-gradients
        timer.start("update")  # 4. update where the sync strategy says (every replica, or the root) ...
        grad_norm = self._update()
        timer.stop("update")
        timer.start("comm_params")  # ... and, when only the root stepped, broadcast the weights from it
        self.sync.broadcast_parameters(self.comm, reps.params, self.buckets)
        timer.stop("comm_params")
        return self._step_values(step, results, timer.timeline(spans), data_ms, began, grad_norm)

    def _set_learning_rate(self, step: int) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = self.lr(step)

    def _forward_backward_reduce(self, step: int, shards, timer: PhaseTimer) -> tuple[list, list[Span]]:
        """Forward and backward on every replica (timed as ``compute``), then the gradients'
        collectives (the wait ``comm``): with overlap each bucket's started as soon as its
        gradients were ready, and here only what is left is waited for. The replicas' (loss,
        correct) and, with overlap, each bucket's span on the communication thread."""
        self.replicas.zero_grad()
        if self.overlap is not None:
            self.overlap.begin()
        try:
            results = self.replicas.run(lambda r, _: self._forward_backward(r, self.forwards[r], *shards[r], step))
            timer.stop("compute")
            timer.start("comm")
            spans: list[Span] = []
            if self.overlap is not None:
                self.overlap.backward_done()
                spans = self.overlap.wait()
            else:
                for k in range(len(self.buckets)):
                    self._reduce_bucket(k)
        except BaseException:  # an error in forward or backward, a second Ctrl-C: no thread left waiting
            if self.overlap is not None:
                self.overlap.abort(timeout_s=OVERLAP_ABORT_WAIT_S)
            raise
        timer.stop("comm")
        return results, spans

    def _update(self) -> float | None:
        """Step the optimizers of the replicas holding the average (unless fp16 overflowed);
        the gradient's norm when it is clipped."""
        overflow = self._unscale_gradients()
        # the numerics guard's test of the averaged gradient, read with the loss (fp16: the scaler's own)
        self._grad_probe = None if self.scaler.enabled else gradient_probe(self.replicas.grads[0])
        grad_norm = None
        if not overflow:
            grad_norm = self._clip_gradients()
            for opt in self.optimizers:
                opt.step()
        self.scaler.update(overflow)
        return grad_norm

    def _step_values(self, step, results, timeline: StepTimeline, data_ms, began, grad_norm) -> dict[str, float]:
        """What a step logs: the loss and accuracy over every process, and the phases' times."""
        p = self.replicas.world_size
        losses = [float(r[0]) for r in results]
        loss = sum(losses) / p
        correct = sum(int(r[1]) for r in results)
        bad_grads = gradient_verdict(self._grad_probe, self.sync.overflow_counts(self.rank))
        if self.nprocs > 1:  # the gradient's verdict rides in the loss's sum: every process stops together
            loss, correct, bad_grads = sum_across(
                [loss, correct, bad_grads], self.devices[0], f"the loss sum of step {step + 1}"
            )
            loss /= self.nprocs
        diverged = step_failure(step + 1, losses, self.rank * p, loss, bad_grads)
        if diverged:
            raise NumericsError(f"{diverged}: the run stopped (lower optim.lr?); {self._last_good()}")
        comm = comm_times(timeline, overlapped=self.overlap is not None)  # one clock, one definition each
        wall_ms = (time.perf_counter() - began) * 1e3  # the whole iteration, data wait included
        values = {
            "loss": loss,
            "accuracy": correct / self.global_batch,
            "data_ms": data_ms,
            "compute_ms": timeline.ms("compute"),
            "comm_ms": comm.comm_ms,
            "comm_exposed_ms": comm.exposed_ms,
            "comm_handoff_ms": comm.handoff_ms,
            "step_ms": sum(timeline.durations().values()),  # compute + exposed communication + hand-off + update
            "comm_bytes": float(self.bytes_per_step),
            "comm_GBps": self.bytes_per_step / max(comm.comm_ms, 1e-9) / 1e6,
            "images_per_s": self.global_batch / max(wall_ms, 1e-9) * 1e3,
            "wall_ms": wall_ms,
            "lr": self.lr(step),
        }
        if grad_norm is not None:
            values["grad_norm"] = grad_norm
        if self.scaler.enabled:
            values["loss_scale"] = self.scaler.scale
        return values

    def _unscale_gradients(self) -> bool:
        """fp16: whether the averaged gradient overflowed (decided on the root's, shared by
        every process); if not, the gradient divided by the loss scale where steps are taken."""
        if not self.scaler.enabled:
            return False
        overflow = self.scaler.found_overflow(self.replicas.grads[0])
        if self.nprocs > 1:  # in reduce mode only rank 0 holds the sum: its answer counts
            counts = self.sync.overflow_counts(self.rank)
            overflow = any_across(overflow and counts, self.devices[0], "the fp16 overflow check")
        if not overflow:
            self.scaler.unscale(self.sync.updated(self.replicas.grads))
        return overflow

    def _clip_gradients(self) -> float | None:
        """With ``optim.clip_grad_norm`` set: the averaged gradient's norm, the gradient scaled
        down to the limit when above it. Without: nothing (the norm costs a pass over the
        gradient and, on a GPU, a wait for it).

        The norm is computed once, on the root's buffer (in allreduce mode every replica
        holds bitwise the same gradient; in reduce mode only the root's update is kept, the
        broadcast overwrites the rest), and the same factor is applied wherever an optimizer
        steps, so the replicas stay identical.
        """
        limit = self.config.optim.clip_grad_norm
        if limit is None:
            return None
        grads = self.replicas.grads
        norm = float(torch.linalg.vector_norm(grads[0]))
        if norm > limit:
            scale = limit / (norm + 1e-6)
            for g in self.sync.updated(grads):
                g.mul_(scale)
        return norm

    def _forward_backward(self, rank: int, model, images: torch.Tensor, labels: torch.Tensor, step: int):
        device = self.devices[rank]
        if self.reseed:  # this replica's dropout masks: a function of (seed, step, replica)
            seed_device(device, replica_seed(self.config.trainer.seed, step, self.rank * len(self.devices) + rank))
        x = prepare(
            images.to(device, non_blocking=True), self.spec.in_channels, self.image_size, self.data.mean, self.data.std
        )
        x = to_memory_format(x, self.config.trainer.channels_last)
        y = labels.to(device, non_blocking=True)
        with autocast(device, self.precision):
            loss, logits = classification_loss(model(x), y)
        self.scaler.scale_loss(loss).backward()
        return loss.detach().float(), (logits.argmax(1) == y).sum()

    @property
    def bytes_per_step(self) -> int:
        """The gradient in ``comm.grad_dtype``, and in reduce mode the float32 weights broadcast back."""
        param_itemsize = self.replicas.params[0].element_size()
        return self.sync.bytes_per_step(self.replicas.numel, self.grad_dtype.itemsize, param_itemsize)

    def lr(self, step: int) -> float:
        o = self.config.optim
        return learning_rate(step, self.steps, o.lr, o.schedule, o.warmup_steps, o.step_size, o.gamma, o.min_lr)

    @torch.no_grad()
    def evaluate(self, max_batches: int | None = None) -> tuple[float, float]:
        """Loss and accuracy of the root replica on the evaluation split."""
        model, device = self.replicas.models[0], self.devices[0]
        model.eval()
        batch = self.config.trainer.eval_batch
        total_loss, correct, seen = 0.0, 0, 0
        with eval_batches(self.data.test, batch, self.workers, self.pin_memory, max_batches) as batches:
            for images, labels in batches:
                x = images.to(device, non_blocking=True)
                x = prepare(x, self.spec.in_channels, self.image_size, self.data.mean, self.data.std)
                x = to_memory_format(x, self.config.trainer.channels_last)
                y = labels.to(device, non_blocking=True)
                logits = model(x)
                total_loss += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(1) == y).sum())
                seen += len(y)
        model.train()
        return total_loss / max(seen, 1), correct / max(seen, 1)

    # -- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / "last.pt"

    def save(self, next_step: int) -> Path:
        reps = self.replicas
        bad = nonfinite_entry({"parameters": reps.params[0], "buffers": reps.buffers[0]})  # the same on every process
        if bad is not None:
            raise NumericsError(
                f"the {bad.split('.')[0]} after step {next_step} are not finite: not saved; {self._last_good()}"
            )
        if not self.is_main:  # rank 0 writes it; every rank knows which step it holds
            self._saved_step = next_step
            return self.checkpoint_path
        state = {
            "step": next_step,
            "params": reps.state_params().cpu(),  # the plain module's order, whatever the memory format
            "buffers": {str(k).removeprefix("torch."): v.cpu() for k, v in reps.buffers[0].items()},
            "optimizer": self.optimizers[0].state_dict(),
            "loss_scale": self.scaler.state_dict(),
            # One process on the CPU: its one generator. Elsewhere the generators are
            # re-seeded every step (lptrain.train.seeding): no GPU's state is needed.
            "rng_cpu": torch.get_rng_state(),
            "config": self.config.groups(),
        }
        try:
            save_checkpoint(self.checkpoint_path, state)
        except CheckpointWriteError as err:
            if self._abort_requested:  # the second Ctrl-C, which torch's writer
                raise KeyboardInterrupt from None  # may report as its own error: stop now, unsaved
            raise CheckpointWriteError(f"{err}; {self._last_good()}") from err
        self._saved_step = next_step
        if self.config.trainer.keep_checkpoints:
            kept = self.checkpoint_path.with_name(f"step_{next_step:08d}.pt")
            shutil.copyfile(self.checkpoint_path, kept)
        return self.checkpoint_path

    def _last_good(self) -> str:
        """Where the run can continue from after a failed save, as the user would type it."""
        if self._saved_step is not None and self.checkpoint_path.is_file():
            path = self.checkpoint_path
            return f"the last good checkpoint is {path} (step {self._saved_step}): resume with trainer.resume={path}"
        if self.config.trainer.resume:
            return f"nothing newer was saved: resume with trainer.resume={self.config.trainer.resume} again"
        return "no checkpoint of this run was saved"

    def _restore(self, state: dict[str, Any], path: Path) -> None:
        reps = self.replicas
        params = state.get("params")
        if not isinstance(params, torch.Tensor) or params.numel() != reps.numel:
            got = params.numel() if isinstance(params, torch.Tensor) else "no"
            saved = state.get("config", {}).get("model", {}) if isinstance(state.get("config"), dict) else {}
            of = f" (model {saved['name']})" if isinstance(saved, dict) and "name" in saved else ""
            raise CheckpointError(
                f"checkpoint {path} holds {got} parameters{of}, this model ({self.config.model.name}) has "
                f"{reps.numel}: it is a checkpoint of another model or data set; resume it with the options it was "
                "saved with"
            )
        reps.load_params(params)
        with torch.no_grad():
            for bufs in reps.buffers:
                for dtype, flat in bufs.items():
                    flat.copy_(state["buffers"][str(dtype).removeprefix("torch.")])
        for opt in self.optimizers:
            # A copy each: on the same device load_state_dict keeps the tensors it is
            # given, and replicas sharing one momentum buffer would update it P times.
            opt.load_state_dict(copy.deepcopy(state["optimizer"]))
        if "loss_scale" in state:
            self.scaler.load_state_dict(state["loss_scale"])
        torch.set_rng_state(state["rng_cpu"])  # an older checkpoint's "rng_cuda" is not needed (see save)
        self.start_step = int(state["step"])

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> Summary:
        t = self.config.trainer
        log = RunLog(self.run_dir, t.tensorboard, purge_step=self.start_step or None, enabled=self.is_main)
        log.hparams(run_hparams(self.config.groups()))
        progress = Progress(
            self.stop_at, t.log_every, t.progress and self.is_main, messages=self.is_main, initial=self.start_step
        )
        timer = PhaseTimer(self.devices)
        if self.is_main:
            remove_stale_temporaries(self.checkpoint_path)  # what a save killed mid-write left here
        if self.start_step:
            progress.message(f"resumed at step {self.start_step} from {t.resume}")
        if t.compile:
            progress.message("compile: torch.compile on every replica; the first step compiles, timed apart")
        _announce(progress, log, "comm/auto", "comm auto: ", self._auto_choices())
        kernels = self._kernel_choices()
        _announce(progress, log, "comm/reduce_kernel", "comm: ", kernels)
        history: list[dict[str, float]] = []
        interval: list[dict[str, float]] = []
        eval_loss = eval_acc = None
        saved_at = None
        eval_s = 0.0
        t0 = time.perf_counter()
        batches = self.train_batches(self.start_step, self.stop_at)
        profiled = parse_step_range(t.profile)
        profiler = StepProfiler(profiled, self.run_dir, self.rank, self.devices[0].type == "cuda") if profiled else None
        previous = self._install_signal_handlers(progress)
        try:
            for step in range(self.start_step, self.stop_at):
                began = time.perf_counter()
                last = self._profiled_step(profiler, progress, step, batches, timer)
                if t.compile and not history:
                    self.compile_s = time.perf_counter() - began
                    progress.message(compile_line(self.compile_s))
                if not history:  # what the first step decided (cuda_graph=auto times each plan then)
                    later = [line for line in self._kernel_choices() if line not in kernels]
                    _announce(progress, log, "comm/cuda_graph", "comm: ", later)
                last["warmup"] = not history  # the session's first step: one-off costs, left out of the means
                history.append(last)
                interval.append(last)
                done = step + 1
                log.step(done, last, last["warmup"])
                self._stop_requested = self._stop_agreed(done)  # every process stops at the same step
                logged = None
                if done % t.log_every == 0 or done == self.stop_at or self._stop_requested:
                    logged = interval_mean(interval)
                    interval = []
                if self.is_main and t.eval_every and (done % t.eval_every == 0 or done == self.stop_at):
                    began = time.perf_counter()
                    eval_loss, eval_acc = self.evaluate()
                    eval_s += time.perf_counter() - began
                    log.scalars(done, {"eval_loss": eval_loss, "eval_accuracy": eval_acc})
                    progress.message(f"eval at step {done}: loss {eval_loss:.4f}, accuracy {100 * eval_acc:.2f}%")
                if logged is not None:
                    log.scalars(done, logged)
                progress.update(step, last, logged)
                if (t.checkpoint_every and done % t.checkpoint_every == 0) or self._stop_requested:
                    self.save(done)
                    saved_at = done
                if self._stop_requested:
                    path = self.checkpoint_path
                    progress.message(f"interrupted after step {done}: saved {path}; resume with trainer.resume={path}")
                    break
            reached = self.start_step + len(history)
            if t.checkpoint_every and saved_at != reached:
                self.save(reached)
                saved_at = reached
            checkpoint = self.checkpoint_path if saved_at is not None else None
        finally:
            if profiler is not None:
                profiler.close()  # the run ended inside the range: what was recorded
            batches.close()  # the worker processes end here, also on an error or a second Ctrl-C
            self._restore_signal_handlers(previous)
            progress.close()
            log.close()
        wall = time.perf_counter() - t0
        return self._summarise(history, eval_loss, eval_acc, wall, wall - eval_s, checkpoint)

    def _profiled_step(self, profiler: StepProfiler | None, progress: Progress, step: int, batches, timer):
        """``train_step``, inside ``trainer.profile``'s profiler when the step is in its range."""
        if profiler is None:
            return self.train_step(step, batches, timer)
        profiler.before(step + 1)
        last = self.train_step(step, batches, timer)
        profiler.after(step + 1)
        if profiler.written is not None and step + 1 == profiler.last:
            progress.message(f"profile of steps {profiler.first}-{profiler.last}: {profiler.written}")
        return last

    def train_batches(self, start: int, stop: int) -> Batches:
        """This process's batches of steps ``start..stop-1``; the workers start prefetching now."""
        sampler = StepBatchSampler(
            len(self.data.train), self.global_batch, self.config.trainer.seed, start, stop, self.rank, self.local_batch
        )
        return train_batches(self.data.train, sampler, self.workers, self.pin_memory)

    def _summarise(self, history, eval_loss, eval_acc, wall, train_s, checkpoint) -> Summary:
        rows = timed(history)  # the first step includes one-off set-up costs
        comm, comm_sd = mean_std(rows, "comm_ms")
        compute, compute_sd = mean_std(rows, "compute_ms")
        last = history[-1] if history else {"loss": math.nan, "accuracy": math.nan}
        return Summary(
            steps=self.start_step + len(history),
            final_loss=last["loss"],
            final_train_accuracy=last["accuracy"],
            eval_accuracy=eval_acc,
            eval_loss=eval_loss,
            mean_compute_ms=compute,
            mean_comm_ms=comm,
            std_compute_ms=compute_sd,
            std_comm_ms=comm_sd,
            mean_comm_exposed_ms=mean_std(rows, "comm_exposed_ms")[0],
            mean_comm_handoff_ms=mean_std(rows, "comm_handoff_ms")[0],
            timed_steps=len(rows),
            mean_data_ms=mean_std(rows, "data_ms")[0],
            comm_fraction=comm_share(rows),
            comm_GBps=self.bytes_per_step / comm / 1e6 if comm else math.nan,
            images_per_s=self._images_per_s(len(history), train_s),
            wall_s=wall,
            train_s=train_s,
            replicas_identical=self.replicas.identical()
            and (self.nprocs == 1 or same_everywhere(self.replicas.params[0])),
            devices=describe_devices(self.devices, self.nprocs),
            run_dir=str(self.run_dir),
            checkpoint=str(checkpoint) if checkpoint else None,
            interrupted_by=self._stop_by if self._stop_requested else 0,
            compile_s=self.compile_s,
        )

    def _images_per_s(self, steps: int, train_s: float) -> float:
        """Images per second of wall clock over ``steps`` steps; the step that compiled left out."""
        if self.compile_s is not None:
            steps, train_s = steps - 1, train_s - self.compile_s
        return self.global_batch * steps / train_s if steps > 0 and train_s > 0 else math.nan

    def _stop_agreed(self, done: int) -> bool:
        """Whether every process stops after step ``done``: whether any was signalled."""
        if self.nprocs > 1:
            what = f"the stop check after step {done}"
            self._stop_by = int(max_across([float(self._stop_signal)], self.devices[0], what)[0])
        else:
            self._stop_by = self._stop_signal
        return bool(self._stop_by)

    def _install_signal_handlers(self, progress: Progress):
        """First Ctrl-C (or SIGTERM) this process receives: finish the step, checkpoint, stop.
        Its second: stop now. A stop agreed because another process was signalled does not
        make this process's own first signal (sent to every worker by torchrun) its second."""

        def request_stop(signum, frame):
            if self._stop_signal:
                self._abort_requested = True  # a save it lands in must not read as a disk failure
                raise KeyboardInterrupt
            self._stop_signal = int(signum)
            # A console without a reader (its launcher killed) must not end the step half-way:
            # the stop saves first, and the closed pipe ends the process at its next line.
            with contextlib.suppress(BrokenPipeError):
                progress.message("stopping after this step (press Ctrl-C again to abort without saving)")

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                previous[sig] = signal.signal(sig, request_stop)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
