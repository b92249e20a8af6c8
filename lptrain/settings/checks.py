"""What the schema's types cannot say: unknown keys added with ``+``, ranges and choices.

``check_config`` turns Hydra's composed DictConfig into a ``RunConfig`` (the schema's
dataclasses, with this process's devices, the replicas, the batch per replica and the sync
strategy worked out once), or raises ``ConfigError`` with one line naming the key, the bad
value and what is valid. It looks at the configuration only (no data, no model, no device
is touched beyond asking how many GPUs there are), so the command line runs it for every
job of a sweep before Hydra creates a folder, and hands each job its ``RunConfig``.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lptrain.errors import ConfigError
from lptrain.schema import (
    GROUPS,
    AutoOptions,
    DataConfig,
    LpOptions,
    ModelConfig,
    OptimConfig,
    ScheduleOptions,
    SyntheticDataConfig,
    TrainerConfig,
)
from lptrain.train.run_config import RunConfig

# CPU replicas of one process run one after another, each on its own share of the batch,
# and every replica is a copy of the model, its gradient and its optimizer state: past this
# many per usable core, a step is mostly waiting (1000 replicas on 2 cores did not finish
# two steps in 120 s). More replicas than that: use more processes (torchrun) or machines.
CPU_REPLICAS_PER_CORE = 32
# Training-set sizes known without reading the data (in-memory sets and CIFAR-10).
KNOWN_TRAIN_SIZES = {"mnist": 4500, "cifar10": 50000}


def _bad(key: str, value: Any, valid: str) -> ConfigError:
    shown = "null" if value is None else value
    return ConfigError(f"{key}={shown} is not valid; {valid}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def check_known_keys(cfg: DictConfig) -> None:
    """Keys that the schema does not have: ``+trainer.stepz=3`` composes (``+`` adds a key), and is refused here."""
    for key in cfg:
        if key not in GROUPS:
            raise ConfigError(
                f"{key} is not a config group{_suggest(str(key), list(GROUPS))}; the groups: {', '.join(GROUPS)}"
            )
        _check_node(cfg[key], str(key))


def _check_node(node: Any, path: str) -> None:
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return
    names = [f.name for f in fields(schema)]
    for key in node:
        if key not in names:
            raise ConfigError(
                f"{path}.{key} is not an option{_suggest(str(key), names)}; {path}'s options: {', '.join(names)}"
            )
        _check_node(node[key], f"{path}.{key}")


def _range(key: str, value: Any, ok: Callable[[Any], bool], valid: str, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not _number(value) or not ok(value):
        raise _bad(key, value, valid)


def _finite(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``ok``, and finite: ``inf`` passes every comparison a positive value passes, and a learning
    rate, a decay or a factor of inf trains on inf."""
    return lambda v: math.isfinite(v) and ok(v)


def _choice(key: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        hint = _suggest(str(value), choices)
        raise ConfigError(f"{key}={value} is not valid{hint}; valid choices: {', '.join(choices)}")


def check_optim(o: OptimConfig) -> None:
    from lptrain.train.schedule import SCHEDULES

    _range("optim.lr", o.lr, _finite(lambda v: v > 0), "use a positive learning rate such as 0.01")
    _range("optim.momentum", o.momentum, lambda v: 0 <= v < 1, "use a value in [0, 1), such as 0.9")
    _range("optim.weight_decay", o.weight_decay, _finite(lambda v: v >= 0), "use 0 or a positive value such as 0.0005")
    _choice("optim.schedule", o.schedule, SCHEDULES)
    _range("optim.warmup_steps", o.warmup_steps, lambda v: v >= 0, "use 0 (no warm-up) or a number of steps")
    _range("optim.step_size", o.step_size, lambda v: v >= 1, "use a positive number of steps")
    _range("optim.gamma", o.gamma, _finite(lambda v: v > 0), "use a positive factor such as 0.1")
    _range("optim.min_lr", o.min_lr, _finite(lambda v: v >= 0), "use 0 or a positive learning rate")
    _range(
        "optim.clip_grad_norm",
        o.clip_grad_norm,
        _finite(lambda v: v > 0),
        "use a positive norm, or null for no clipping",
        True,
    )


FLOAT_TYPES = ("fp32", "bf16", "fp16")


def check_modes(t: TrainerConfig) -> None:
    """The trainer's choices of sync mode and precision."""
    from lptrain.train.sync import SYNC_MODES

    _choice("trainer.sync", t.sync, SYNC_MODES)
    _choice("trainer.precision", t.precision, FLOAT_TYPES)


def check_trainer(t: TrainerConfig, replicas: int) -> None:
    """The trainer's values, for ``replicas`` replicas in all processes."""
    _range("trainer.steps", t.steps, lambda v: v >= 1, "use a positive number of steps")
    _range("trainer.epochs", t.epochs, lambda v: v > 0, "use a positive number of epochs, or null", True)
    if t.global_batch is not None:
        _range("trainer.global_batch", t.global_batch, lambda v: v >= 1, "use a positive number of images")
        if t.global_batch % replicas:
            near = replicas * max(1, round(t.global_batch / replicas))
            raise _bad(
                "trainer.global_batch",
                t.global_batch,
                f"it must split across the {replicas} replicas: use a multiple of {replicas} such as {near}, "
                "or set trainer.batch_per_device",
            )
    else:
        _range("trainer.batch_per_device", t.batch_per_device, lambda v: v >= 1, "use a positive number of images")
    if t.stop_at is not None and t.epochs is None:
        _range("trainer.stop_at", t.stop_at, lambda v: 1 <= v <= t.steps, f"use a step from 1 to {t.steps}, or null")
    _range(
        "trainer.bucket_mb",
        t.bucket_mb,
        lambda v: v > 0,
        "use a positive size in MiB, or null (25 on GPUs, one bucket on CPUs)",
        True,
    )
    _range("trainer.eval_every", t.eval_every, lambda v: v >= 0, "use a number of steps, or 0 for no evaluation")
    _range("trainer.eval_batch", t.eval_batch, lambda v: v >= 1, "use a positive number of images")
    _range("trainer.log_every", t.log_every, lambda v: v >= 1, "use a positive number of steps")
    _range("trainer.checkpoint_every", t.checkpoint_every, lambda v: v >= 0, "use a number of steps, or 0 for none")
    _range("trainer.comm_timeout_s", t.comm_timeout_s, lambda v: v > 0, "use a positive number of seconds")
    check_profile(t)


def check_compute(t: TrainerConfig, devices: Sequence[Any]) -> None:
    """How the replicas compute: torch.compile where it can compile for these devices,
    cuDNN's benchmark mode where there is cuDNN."""
    types = {d.type for d in devices}
    if t.compile:
        from lptrain.train.compiled import compile_problem

        for device_type in sorted(types):
            problem = compile_problem(device_type)
            if problem:
                raise _bad("trainer.compile", "true", f"{problem}; or trainer.compile=false")
    if t.cudnn_benchmark and "cuda" not in types:
        raise _bad(
            "trainer.cudnn_benchmark",
            "true",
            f"it sets cuDNN's benchmark mode, and these devices ({', '.join(sorted(types))}) have no cuDNN: "
            "leave it false on CPUs",
        )


def check_cpu_replicas(given: Any, devices: Sequence[Any]) -> None:
    """At most ``CPU_REPLICAS_PER_CORE`` CPU replicas per core this process may use."""
    from lptrain.data.loader import available_cpus

    cores = available_cpus()
    most = CPU_REPLICAS_PER_CORE * cores
    on_cpu = sum(1 for d in devices if d.type == "cpu")
    if on_cpu > most:
        raise _bad(
            "trainer.devices",
            given,
            f"{on_cpu} CPU replicas run one after another on {cores} cores here; use at most {most} "
            f"({CPU_REPLICAS_PER_CORE} per core), or more processes with torchrun",
        )


def check_profile(t: TrainerConfig) -> None:
    from lptrain.train.profiling import parse_step_range

    steps = parse_step_range(t.profile)
    if steps is not None and t.epochs is None and steps[1] > t.steps:
        raise _bad("trainer.profile", t.profile, f"the run has {t.steps} steps: use steps from 1 to {t.steps}")


def check_comm(c, replicas: int) -> None:
    """``comm``: the name, the dtype, and each option its options class has."""
    from lptrain.communicators import NAMES

    _choice("comm.name", c.name, NAMES)
    _choice("comm.grad_dtype", c.grad_dtype, FLOAT_TYPES)
    options = c.options
    if isinstance(options, ScheduleOptions):
        _check_schedule_options(options, replicas)
    if isinstance(options, LpOptions):
        _check_lp_options(options, replicas)
    if isinstance(options, AutoOptions):
        _check_auto_options(options, replicas)


def _check_schedule_options(options: ScheduleOptions, replicas: int) -> None:
    from lptrain.comm.algorithms.order import check_order
    from lptrain.comm.cuda_graph import CUDA_GRAPH_MODES
    from lptrain.comm.peer_kernel import REDUCE_KERNELS

    _choice("comm.options.reduce_kernel", options.reduce_kernel, REDUCE_KERNELS)
    _choice("comm.options.cuda_graph", options.cuda_graph, CUDA_GRAPH_MODES)
    if options.order is not None:
        try:
            check_order(list(options.order), replicas)
        except ValueError:
            raise _bad(
                "comm.options.order",
                list(options.order),
                f"use a permutation of the {replicas} ranks 0..{replicas - 1}, or null",
            ) from None


def _check_lp_options(options: LpOptions, replicas: int) -> None:
    from lptrain.comm.algorithms import lp
    from lptrain.comm.errors import CollectiveInputError
    from lptrain.comm.sizes import parse_size

    if options.block_size != "auto":
        try:
            if parse_size(options.block_size, "block_size") < 1:
                raise CollectiveInputError("")
        except CollectiveInputError:
            raise _bad(
                "comm.options.block_size", options.block_size, "use a size in bytes (65536, 64K, 4M) or auto"
            ) from None
    _choice("comm.options.allreduce", options.allreduce, lp.ALLREDUCE_MODES)


def _check_auto_options(options: AutoOptions, replicas: int) -> None:
    from lptrain.auto.probed import PROBE
    from lptrain.comm.errors import CollectiveInputError
    from lptrain.sim.declared import check_topology

    if options.topology not in (None, PROBE):
        try:
            check_topology(options.topology, replicas)
        except ValueError as err:
            raise _bad("comm.options.topology", options.topology, f"{err}; or {PROBE} (measured at start)") from None
    if options.tuning is not None:
        from lptrain.auto.tuning import TuningTable

        try:
            TuningTable.load(options.tuning)
        except CollectiveInputError as err:
            raise ConfigError(f"comm.options.tuning={options.tuning} is not valid: {err}") from None


def check_model(m: ModelConfig) -> None:
    from lptrain.models import INITS, NAMES, check_image_size

    _choice("model.name", m.name, NAMES)
    _choice("model.init", m.init, INITS)
    try:
        check_image_size(m.name, m.image_size)
    except ValueError as err:
        raise ConfigError(f"model.image_size={m.image_size} is not valid; {err}") from None


def check_data(d: DataConfig, global_batch: int) -> None:
    from lptrain.data.datasets import NAMES

    _choice("data.name", d.name, NAMES)
    _range("data.workers", d.workers, lambda v: v >= 0, "use 0, a number of worker processes, or null (auto)", True)
    if isinstance(d, SyntheticDataConfig):
        counts = {"channels": d.channels, "num_classes": d.num_classes}
        counts |= {"train_samples": d.train_samples, "test_samples": d.test_samples}
        for key, value in counts.items():
            _range(f"data.{key}", value, lambda v: v >= 1, "use a positive number")
    if d.name == "imagefolder" and not d.root:
        raise ConfigError("data.root=null is not valid; data=imagefolder needs data.root=/path/to/images")
    size = d.train_samples if isinstance(d, SyntheticDataConfig) else KNOWN_TRAIN_SIZES.get(d.name)
    if size is not None and global_batch > size:
        raise ConfigError(
            f"the global batch ({global_batch} images) is larger than data={d.name}'s training set ({size} images); "
            "lower trainer.batch_per_device or trainer.global_batch"
        )


def check_batch_memory(t: TrainerConfig, m: ModelConfig, d: DataConfig, local_batch: int) -> None:
    """A batch larger than all of this machine's memory, refused before anything allocates it
    (the input alone, as float32 images: what the network then needs comes on top)."""
    from lptrain.models import SPECS
    from lptrain.train.memory import check_fits

    key = "trainer.global_batch" if t.global_batch is not None else "trainer.batch_per_device"
    value = t.global_batch if t.global_batch is not None else t.batch_per_device
    channels = d.channels if isinstance(d, SyntheticDataConfig) else SPECS[m.name].in_channels
    shape = (channels, m.image_size, m.image_size)
    try:
        check_fits(
            local_batch * math.prod(shape) * 4,
            f"this process's batch of {local_batch} images of {'x'.join(map(str, shape))} (float32)",
            f"lower {key}",
        )
    except ValueError as err:
        raise ConfigError(f"{key}={value} is not valid; {err}") from None


def check_resume(path: str | None) -> None:
    """A resume file that is not there, or not even a zip archive (what torch.save writes)."""
    if not path:
        return
    import zipfile

    from lptrain.train.checkpoint import CheckpointError, resolve

    try:
        p = resolve(path)
    except CheckpointError as err:
        raise ConfigError(f"trainer.resume={path} is not valid; {err}") from None
    if not zipfile.is_zipfile(p):
        raise ConfigError(
            f"trainer.resume={path} is not valid; {p} is not a checkpoint (corrupt, truncated or another kind of file)"
        )


def typed_groups(cfg: DictConfig) -> dict[str, Any]:
    """The composed groups as the schema's dataclasses (interpolations such as
    ``data.image_size: ${model.image_size}`` resolved); a value that cannot be read is one line."""
    try:
        return {str(name): OmegaConf.to_object(cfg[name]) for name in GROUPS}
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "the configuration"
        raise ConfigError(f"{key} cannot be read: {' '.join(str(err).split())}") from None


def check_config(cfg: DictConfig) -> RunConfig:
    """Every check that needs only the configuration; the checked configuration, typed, with
    its derived values computed here once. Raises ``ConfigError``."""
    from lptrain.comm.devices import parse_devices
    from lptrain.train.devices import resolve_devices
    from lptrain.train.sync import SYNC_STRATEGIES

    check_known_keys(cfg)
    groups = typed_groups(cfg)
    processes = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
    t: TrainerConfig = groups["trainer"]
    check_modes(t)  # before the devices, as a reader goes down the group
    devices = tuple(parse_devices(resolve_devices(t.devices, t.device_type)))  # the one place they are resolved
    check_cpu_replicas(t.devices, devices)
    check_compute(t, devices)
    replicas = len(devices) * processes
    check_trainer(t, replicas)
    per_device = t.global_batch // replicas if t.global_batch is not None else t.batch_per_device
    check_optim(groups["optim"])
    check_comm(groups["comm"], replicas)
    check_model(groups["model"])
    check_data(groups["data"], per_device * replicas)
    check_batch_memory(t, groups["model"], groups["data"], per_device * len(devices))
    check_resume(t.resume)
    return RunConfig(
        **groups, devices=devices, processes=processes, per_device_batch=per_device, sync=SYNC_STRATEGIES[t.sync]
    )
