"""The paper's networks as torchvision builds them, and the initialisation their recipes use."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lptrain.models import build_model


def test_kaiming_init_is_torchvisions_vgg_scheme_on_the_real_network():
    torch.manual_seed(0)
    default = build_model("alexnet", 10, 64)
    torch.manual_seed(0)
    model = build_model("alexnet", 10, 64, init="kaiming")
    assert type(model) is type(default)  # the same torchvision AlexNet, only re-drawn
    assert [p.shape for p in model.parameters()] == [p.shape for p in default.parameters()]
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d):
            fan_out = layer.out_channels * layer.kernel_size[0] * layer.kernel_size[1]
            assert layer.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.1)
        elif isinstance(layer, nn.Linear):
            assert layer.weight.std().item() == pytest.approx(0.01, rel=0.1)
        else:
            continue
        assert torch.count_nonzero(layer.bias) == 0


def test_kaiming_init_keeps_alexnets_signal_alive_where_the_default_shrinks_it():
    # Why the recipe uses it: the default's activations fade layer by layer.
    x = torch.randn(8, 3, 64, 64)
    stds = {}
    for init in ("default", "kaiming"):
        torch.manual_seed(0)
        model = build_model("alexnet", 10, 64, init=init)
        stds[init] = model.features(x).std().item() / model.features[0](x).std().item()
    assert stds["default"] < 0.2 < stds["kaiming"]


def test_an_unknown_init_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown model.init 'orthogonal'; valid choices: default, kaiming"):
        build_model("small", 10, 28, init="orthogonal")


def test_kaiming_in_draws_vggs_convolutions_by_fan_in_and_keeps_its_signal_through_thirteen():
    """Why the VGG-16 recipe uses it: through thirteen convolutions at 32 px torchvision's
    fan-out scheme shrinks the activations about fivefold; fan-in keeps them."""
    x = torch.randn(4, 3, 32, 32)
    last = {}
    for init in ("kaiming", "kaiming_in"):
        torch.manual_seed(0)
        model = build_model("vgg16", 10, 32, init=init)
        for layer in model.modules():
            if isinstance(layer, nn.Conv2d) and init == "kaiming_in":
                fan_in = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
                assert layer.weight.std().item() == pytest.approx((2 / fan_in) ** 0.5, rel=0.1)
            elif isinstance(layer, nn.Linear):
                assert layer.weight.std().item() == pytest.approx(0.01, rel=0.1)
        with torch.no_grad():
            last[init] = (model.features(x).std() / model.features[1](model.features[0](x)).std()).item()
    assert last["kaiming"] < 0.4 < last["kaiming_in"]
