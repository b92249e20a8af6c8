"""What happens to an image between its file and the model.

Per sample, on the CPU (in a DataLoader worker): decode, then a training transform (random
resized crop or padded random crop, and a horizontal flip) or the evaluation transform
(resize the shorter side, centre crop), ending as a uint8 ``C x S x S`` tensor with ``S`` =
``model.image_size``. Images keep their aspect ratio: they are cropped, never stretched.

Every random choice is drawn from the ``torch.Generator`` the caller passes, seeded per
sample from (seed, step, position) by ``sampling.sample_seed``, never from global or
per-worker random state: the crops of a step are the same whichever worker makes them and
however many workers there are, so resuming is exact. (torchvision's ``RandomResizedCrop``
draws its parameters from the global generator, so the parameters are drawn here and only
the pixel work is left to ``torchvision.transforms.v2.functional``.)

Per batch, on the training device: ``prepare`` converts to float, fits the channels to the
model, resizes (only the in-memory sets need it) and normalises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch.nn import functional as F

from lptrain.schema import Cifar10DataConfig, ImageFolderDataConfig

# The evaluation resize of the ImageNet convention: shorter side to 256 for a 224 crop.
IMAGENET_RESIZE = 256 / 224


class Transform(Protocol):
    def __call__(self, image: Image.Image, g: torch.Generator) -> torch.Tensor:
        """A uint8 ``C x size x size`` tensor made from ``image`` with randomness from ``g``."""
        ...


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=g, dtype=torch.float64))


def _randint(g: torch.Generator, high: int) -> int:
    """An integer in ``[0, high)``."""
    return int(torch.randint(high, (), generator=g))


def _flip(image: Image.Image, g: torch.Generator, enabled: bool) -> Image.Image:
    return TF.horizontal_flip(image) if enabled and _uniform(g, 0.0, 1.0) < 0.5 else image


def _square(image: Image.Image, size: int, resize: float = 1.0) -> Image.Image:
    """Shorter side to ``round(size * resize)`` (aspect ratio kept), then the centre square of ``size``."""
    image = TF.resize(image, [max(size, round(size * resize))])
    return TF.center_crop(image, [size, size])


class RandomResizedCrop:
    """Inception-style crop: a random area fraction in ``scale`` and aspect ratio in ``ratio``,
    resized to ``size``; then a horizontal flip with probability 1/2 (``flip``)."""

    def __init__(
        self,
        size: int,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: bool = True,
    ) -> None:
        self.size, self.scale, self.flip = size, (float(scale[0]), float(scale[1])), flip
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def params(self, width: int, height: int, g: torch.Generator) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop: torchvision's algorithm, our generator."""
        area = width * height
        for _ in range(10):
            target = area * _uniform(g, *self.scale)
            aspect = math.exp(_uniform(g, *self.log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                return _randint(g, height - h + 1), _randint(g, width - w + 1), h, w
        # Ten misses (a very long or tall image): the centre crop of the nearest valid aspect.
        lo, hi = math.exp(self.log_ratio[0]), math.exp(self.log_ratio[1])
        w, h = width, height
        if width / height < lo:
            h = round(w / lo)
        elif width / height > hi:
            w = round(h * hi)
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: Image.Image, g: torch.Generator) -> torch.Tensor:
        top, left, h, w = self.params(*image.size, g)
        image = TF.resized_crop(image, top, left, h, w, [self.size, self.size])
        return TF.pil_to_tensor(_flip(image, g, self.flip))


class PaddedRandomCrop:
    """CIFAR-style: the image at ``size`` (shorter side, centre square), zero-padded by
    ``pad`` pixels on every side, a random ``size`` square of that, and a flip (``flip``)."""

    def __init__(self, size: int, pad: int, flip: bool = True) -> None:
        self.size, self.pad, self.flip = size, pad, flip

    def __call__(self, image: Image.Image, g: torch.Generator) -> torch.Tensor:
        if image.size != (self.size, self.size):
            image = _square(image, self.size)
        if self.pad:
            image = TF.pad(image, [self.pad])
            image = TF.crop(image, _randint(g, 2 * self.pad + 1), _randint(g, 2 * self.pad + 1), self.size, self.size)
        return TF.pil_to_tensor(_flip(image, g, self.flip))


class ResizeCentreCrop:
    """Evaluation (and training without augmentation): shorter side to ``size * resize``,
    aspect ratio kept, then the centre ``size`` square. No randomness."""

    def __init__(self, size: int, resize: float = IMAGENET_RESIZE) -> None:
        self.size, self.resize = size, resize

    def __call__(self, image: Image.Image, g: torch.Generator | None = None) -> torch.Tensor:
        return TF.pil_to_tensor(_square(image, self.size, self.resize))


def build_transforms(cfg: Cifar10DataConfig | ImageFolderDataConfig) -> tuple[Transform, Transform]:
    """The (training, evaluation) transforms of a data set of image files as its config asks."""
    size = cfg.image_size
    evaluation = ResizeCentreCrop(size, cfg.eval_resize)
    if not cfg.augment:
        return evaluation, evaluation
    if isinstance(cfg, Cifar10DataConfig):
        pad = round(cfg.pad * size / 32)  # 4 pixels at CIFAR's 32, in proportion elsewhere
        return PaddedRandomCrop(size, pad, cfg.flip), evaluation
    return RandomResizedCrop(size, tuple(cfg.crop_scale), flip=cfg.flip), evaluation


def prepare(images: torch.Tensor, channels: int, image_size: int, mean, std) -> torch.Tensor:
    """Fit a batch to a model, on the device it runs on: uint8 to float in [0, 1], grey to
    colour (or back), resize (the in-memory sets come at their own size), normalise."""
    if not images.is_floating_point():
        images = images.float().div_(255)
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
