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
INITS = ("default", "kaiming", "kaiming_in")


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


def check_image_size(name: str, image_size: int) -> None:
    """Below its minimum a network's feature maps shrink to nothing (a shape error deep in
    the forward pass): say so up front, in terms of the config key."""
    need = SPECS[name].min_image_size
    if image_size < need:
        raise ValueError(f"model.image_size={image_size} is below what model {name} needs: at least {need} pixels")


def build_model(name: str, num_classes: int, image_size: int, init: str = "default") -> nn.Module:
    """A freshly initialised model (no pretrained weights: nothing is downloaded).

    ``init="default"`` keeps the network's own initialisation; ``"kaiming"`` re-draws every
    convolution and linear layer as torchvision does for VGG (see ``kaiming_init``): what
    the users of deep ReLU stacks without batch norm do, not a different network.
    """
    if name not in SPECS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(NAMES)}")
    if init not in INITS:
        raise ValueError(f"unknown model.init {init!r}; valid choices: {', '.join(INITS)}")
    spec = SPECS[name]
    check_image_size(name, image_size)
    import torchvision.models as tvm

    if name == "small":
        model = SmallCNN(num_classes, spec.in_channels, image_size)
    elif name == "alexnet":
        model = tvm.alexnet(weights=None, num_classes=num_classes)
    elif name == "googlenet":
        model = tvm.googlenet(weights=None, num_classes=num_classes, aux_logits=True, init_weights=True)
    else:
        model = tvm.vgg16(weights=None, num_classes=num_classes)
    if init in ("kaiming", "kaiming_in"):
        kaiming_init(model, mode="fan_out" if init == "kaiming" else "fan_in")
    return model


def kaiming_init(model: nn.Module, mode: str = "fan_out") -> None:
    """The initialisation torchvision gives its VGG, applied to any network: He-normal
    convolutions (fan-out, ReLU gain), linear layers drawn from N(0, 0.01), zero biases.

    ``mode="fan_in"`` (``model.init=kaiming_in``) draws the convolutions as He et al. (2015)
    did, the scheme with which they trained 22- and 30-layer VGG-style stacks without batch
    norm from scratch: it keeps each layer's output variance, where fan-out keeps the
    gradient's. Through VGG-16's thirteen convolutions on the digits at 32 px the
    activations then stay near std 1 (0.5 after the last) instead of shrinking to 0.04,
    and the logits start at a usable scale.

    PyTorch's default (uniform, fan-in, gain 1/sqrt(3)) shrinks the signal layer by layer
    (in AlexNet on the digits: std 0.35 after the first convolution, 0.017 after the
    fifth), so the gradients start tiny and the loss sits at log(classes) for hundreds of
    steps. Fan-in He-normal everywhere fixes the convolutions but, through
    AlexNet's three max-pools, leaves the classifier's activations large (std 2 to 6), so
    the logit layer's curvature is large too: in two runs on the digits (lr 0.01, warm-ups
    of 10 and 30 steps) the loss rose from 2.3 to 5.7 and 3.4 during the warm-up. This scheme keeps the classifier's
    inputs small (std about 0.2) while every layer still gets useful gradients.
    """
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, nn.Conv2d):
                nn.init.kaiming_normal_(layer.weight, mode=mode, nonlinearity="relu")
            elif isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, 0.0, 0.01)
            else:
                continue
            if layer.bias is not None:
                layer.bias.zero_()


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
