#!/usr/bin/env python3
"""Write an ImageNet-style folder of real JPEGs made from the embedded MNIST digits.

    python scripts/make_imagefolder.py /tmp/digits                  # 100 train + 20 val per class
    python scripts/make_imagefolder.py /tmp/digits --per-class 400 --val-per-class 50

``root/train/<digit>/*.jpg`` and ``root/val/<digit>/*.jpg``, each image a digit tinted in
a random colour on a random background, resized to a random width and height (48 to 160
pixels by default, so aspect ratios from 0.3 to 3.3) and saved as a JPEG: what
``data=imagefolder`` meets on real data (decoding, mixed sizes and shapes), with no
download. The training images come from the digits lptrain trains on with ``data=mnist``,
the validation images from those it evaluates on. The same arguments give the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def _digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The embedded MNIST digits (uint8 N x 28 x 28, and labels) of lptrain's train and test splits."""
    from lptrain.data import load_data
    from lptrain.schema import MnistDataConfig

    data = load_data(MnistDataConfig())
    return {name: (s.images[:, 0].numpy(), s.labels.numpy()) for name, s in (("train", data.train), ("val", data.test))}


def _render(digit: np.ndarray, rng: np.random.Generator, min_side: int, max_side: int) -> Image.Image:
    """The digit in a random colour on a random darker background, at a random width and height."""
    ink = rng.integers(120, 256, size=3)
    paper = rng.integers(0, 100, size=3)
    alpha = digit.astype(np.float32)[..., None] / 255.0
    rgb = (paper * (1 - alpha) + ink * alpha).round().astype(np.uint8)
    width, height = (int(s) for s in rng.integers(min_side, max_side + 1, size=2))
    return Image.fromarray(rgb, "RGB").resize((width, height), Image.BILINEAR)


def make_imagefolder(
    root: str | Path,
    per_class: int = 100,
    val_per_class: int = 20,
    min_side: int = 48,
    max_side: int = 160,
    quality: int = 90,
    seed: int = 0,
) -> Path:
    """Write ``root/train/<digit>/*.jpg`` (``per_class`` each) and ``root/val/<digit>/*.jpg``
    (``val_per_class`` each); return ``root``. Digits are reused, with new sizes and colours,
    when a class asks for more than the embedded set holds."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    digits = _digits()
    for folder, count in (("train", per_class), ("val", val_per_class)):
        images, labels = digits[folder]
        for label in range(10):
            out = root / folder / str(label)
            out.mkdir(parents=True, exist_ok=True)
            mine = np.flatnonzero(labels == label)
            for k in range(count):
                image = _render(images[mine[k % len(mine)]], rng, min_side, max_side)
                image.save(out / f"{label}_{k:05d}.jpg", quality=quality)
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="output folder (train/ and val/ are made inside it)")
    p.add_argument("--per-class", type=int, default=100, help="training images per class (default 100)")
    p.add_argument("--val-per-class", type=int, default=20, help="validation images per class (default 20)")
    p.add_argument("--min-side", type=int, default=48, help="smallest width or height in pixels (default 48)")
    p.add_argument("--max-side", type=int, default=160, help="largest width or height in pixels (default 160)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not 1 <= args.min_side <= args.max_side:
        p.error(f"--min-side {args.min_side} and --max-side {args.max_side}: need 1 <= min-side <= max-side")
    root = make_imagefolder(
        args.root, args.per_class, args.val_per_class, args.min_side, args.max_side, args.quality, args.seed
    )
    print(f"wrote {10 * args.per_class} training and {10 * args.val_per_class} validation JPEGs under {root}")


if __name__ == "__main__":
    main()
