"""Models: the paper's torchvision networks and a small CNN for quick runs.

Each model comes with the input it needs (channels and image size), so the data
pipeline can resize whatever it loads to fit: AlexNet, GoogLeNet and VGG-16 take three
channels; the small CNN takes MNIST-sized grey images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    in_channels: int
    min_image_size: int
    has_batch_norm: bool


SPECS = {
    "small": ModelSpec("small", 1, 28, False),
    "alexnet": ModelSpec("alexnet", 3, 63, False),
    "googlenet": ModelSpec("googlenet", 3, 32, True),
    "vgg16": ModelSpec("vgg16", 3, 32, False),
}
NAMES = tuple(SPECS)


class SmallCNN(nn.Module):
    """A LeNet-style network without batch norm or dropout, so BSP-SGD on P replicas
    is exactly SGD on one device with the P-times larger batch."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * side * side, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(name: str, num_classes: int, image_size: int) -> nn.Module:
    """A freshly initialised model (no pretrained weights: nothing is downloaded)."""
    if name not in SPECS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(NAMES)}")
    spec = SPECS[name]
    if image_size < spec.min_image_size:
        raise ValueError(f"model {name} needs images of at least {spec.min_image_size} pixels, got {image_size}")
    import torchvision.models as tvm

    if name == "small":
        return SmallCNN(num_classes, spec.in_channels, image_size)
    if name == "alexnet":
        return tvm.alexnet(weights=None, num_classes=num_classes)
    if name == "googlenet":
        return tvm.googlenet(weights=None, num_classes=num_classes, aux_logits=True, init_weights=True)
    return tvm.vgg16(weights=None, num_classes=num_classes)


def classification_loss(output, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy and the main logits; GoogLeNet's auxiliary heads count 0.3 each."""
    if isinstance(output, tuple) and hasattr(output, "logits"):  # GoogLeNetOutputs in training mode
        logits = output.logits
        loss = nn.functional.cross_entropy(logits, target)
        for aux in (output.aux_logits1, output.aux_logits2):
            if aux is not None:
                loss = loss + 0.3 * nn.functional.cross_entropy(aux, target)
        return loss, logits
    return nn.functional.cross_entropy(output, target), output


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
