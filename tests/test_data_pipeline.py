"""The input pipeline: batches as a pure function of (seed, step) whatever the number of
workers, exact resumption on an image folder, aspect ratios, clean shutdown, bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from lptrain.data import DataError, StepBatchSampler, batch_indices, load_data, resolve_workers, train_batches
from lptrain.data.loader import default_workers, eval_batches
from lptrain.data.sampling import sample_seed
from lptrain.data.transforms import PaddedRandomCrop, RandomResizedCrop, ResizeCentreCrop
from lptrain.settings.locations import compose_config
from lptrain.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0"]


def config(*overrides: str):
    return compose_config(list(overrides))


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lptrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _make_imagefolder():
    spec = importlib.util.spec_from_file_location("make_imagefolder", ROOT / "scripts" / "make_imagefolder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_imagefolder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """120 training and 30 validation JPEGs of mixed sizes and aspect ratios."""
    return _make_imagefolder()(tmp_path_factory.mktemp("digits"), per_class=12, val_per_class=3)


def _first_images(root: Path, dest: Path, per_class: int = 2, classes: int = 2) -> Path:
    """A smaller copy of ``root``: ``classes`` classes of ``per_class`` images in train and val."""
    for split in ("train", "val"):
        for c in range(classes):
            (dest / split / str(c)).mkdir(parents=True)
            for f in sorted((root / split / str(c)).iterdir())[:per_class]:
                shutil.copy(f, dest / split / str(c) / f.name)
    return dest


# -- a step's batch is a pure function of (seed, step) ------------------------------------------------


def _batches(data, workers: int, start: int, stop: int, rank: int = 0, local: int | None = None):
    sampler = StepBatchSampler(len(data.train), 16, seed=3, start=start, stop=stop, rank=rank, local_batch=local)
    with train_batches(data.train, sampler, workers, pin_memory=False) as batches:
        return list(batches)


def test_batches_are_the_same_with_any_number_of_workers_and_when_resumed(folder):
    data = load_data(config("data=imagefolder", f"data.root={folder}", "model.image_size=32").data)
    reference = _batches(data, 0, 0, 10)  # 10 steps of 16 from 120 images: two epochs
    assert len(reference) == 10 and reference[0][0].shape == (16, 3, 32, 32) and reference[0][0].dtype == torch.uint8
    for workers in (1, 2):
        got = _batches(data, workers, 0, 10)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(reference, got)), workers
    resumed = _batches(data, 2, 6, 10)  # a run resumed at step 6
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(reference[6:], resumed))
    # Two processes of 8: the halves of the same global batch, crops included.
    halves = [_batches(data, 1, 0, 10, rank=r, local=8) for r in (0, 1)]
    for step, (whole, a, b) in enumerate(zip(reference, *halves)):
        assert torch.equal(whole[0], torch.cat([a[0], b[0]])), step
    # The labels are the sampler's, and the augmentation is not a no-op.
    labels = torch.as_tensor(data.train.labels)
    assert torch.equal(reference[0][1], labels[batch_indices(len(data.train), 16, 0, 3)])
    plain = load_data(
        config("data=imagefolder", f"data.root={folder}", "model.image_size=32", "data.augment=false").data
    )
    assert not torch.equal(_batches(plain, 0, 0, 1)[0][0], reference[0][0])


def test_the_sampler_matches_batch_indices_and_seeds_differ():
    sampler = StepBatchSampler(100, 20, seed=5, start=0, stop=12, rank=1, local_batch=10)
    for step, keys in enumerate(sampler):
        expected = batch_indices(100, 20, step, 5)[10:20].tolist()
        assert [k.index for k in keys] == expected
        assert [k.seed for k in keys] == [sample_seed(5, step, 10 + i) for i in range(10)]
    seeds = {sample_seed(0, s, p) for s in range(50) for p in range(64)}
    assert len(seeds) == 50 * 64


def test_transforms_draw_only_from_the_generator_given():
    image = Image.new("RGB", (90, 50))
    image.paste((255, 0, 0), (0, 0, 30, 50))
    image.paste((0, 255, 0), (30, 0, 60, 50))
    for transform in (RandomResizedCrop(24), PaddedRandomCrop(24, 3)):
        torch.manual_seed(0)
        a = transform(image, torch.Generator().manual_seed(7))
        torch.manual_seed(1)  # the global generator has no say
        b = transform(image, torch.Generator().manual_seed(7))
        assert torch.equal(a, b) and a.shape == (3, 24, 24)
        outputs = {transform(image, torch.Generator().manual_seed(s)).numpy().tobytes() for s in range(8)}
        assert len(outputs) > 1, "the seed changes nothing"


def test_the_eval_transform_keeps_the_aspect_ratio():
    """A 3:1 image of three colour bands: the centre crop is the middle band only; a
    stretch to a square would show all three."""
    image = Image.new("RGB", (300, 100))
    for k, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        image.paste(colour, (100 * k, 0, 100 * (k + 1), 100))
    out = ResizeCentreCrop(32, resize=1.0)(image).float()
    assert out.shape == (3, 32, 32)
    assert out[1].min() > 200 and out[0].max() < 50 and out[2].max() < 50
    out = ResizeCentreCrop(32)(image)  # ImageNet's 256/224: still the middle band
    assert out[1].float().min() > 200


def test_evaluation_reads_the_folder_through_the_eval_transform(folder):
    data = load_data(config("data=imagefolder", f"data.root={folder}", "model.image_size=40").data)
    with eval_batches(data.test, 8, workers=2, pin_memory=False) as batches:
        got = list(batches)
    assert [len(labels) for _, labels in got] == [8, 8, 8, 6]
    assert all(images.shape[1:] == (3, 40, 40) for images, _ in got)
    first = data.test.images[0]  # a file, not stretched: the same as the transform of it alone
    assert torch.equal(got[0][0][0], ResizeCentreCrop(40, 1.142857)(first))


def test_default_workers():
    assert default_workers(cpus=1, processes=1) == 0
    assert default_workers(cpus=2, processes=1) == 0  # a worker would take a core from training
    assert default_workers(cpus=3, processes=1) == 1
    assert default_workers(cpus=16, processes=1) == 4
    assert default_workers(cpus=16, processes=4) == 2
    assert default_workers(cpus=16, processes=8) == 0
    assert resolve_workers(None) == resolve_workers("auto") == default_workers()
    assert resolve_workers(3) == 3


# -- the trainer on an image folder ----------------------------------------------------------------


def _losses(path: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in map(json.loads, (path / "metrics.jsonl").read_text().splitlines())}


def test_a_resumed_imagefolder_run_with_workers_gives_the_same_later_losses(folder, tmp_path):
    common = [
        *QUIET,
        "trainer.log_every=1",
        "data=imagefolder",
        f"data.root={folder}",
        "data.workers=2",
        "trainer.devices=cpu*2",
        "trainer.batch_per_device=8",
        "trainer.steps=10",  # 16 of 120 images a step: the second epoch starts at step 7
    ]
    full = Trainer(config(*common, "trainer.checkpoint_every=4", "trainer.keep_checkpoints=true"), tmp_path / "full")
    summary = full.fit()
    middle = tmp_path / "full" / "checkpoints" / "step_00000004.pt"
    again = Trainer(config(*common, "trainer.checkpoint_every=0", f"trainer.resume={middle}"), tmp_path / "again")
    again.fit()
    reference, later = _losses(tmp_path / "full"), _losses(tmp_path / "again")
    assert sorted(later) == list(range(5, 11))
    assert all(later[s] == reference[s] for s in later), (later, reference)
    assert torch.equal(again.replicas.params[0], full.replicas.params[0])
    assert summary.mean_data_ms >= 0 and summary.images_per_s > 0 and summary.train_s <= summary.wall_s
    line = json.loads((tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["data_ms"] >= 0


def test_ctrl_c_stops_a_run_with_workers_once_and_cleanly(folder, tmp_path):
    """Ctrl-C at a terminal reaches the whole process group, DataLoader workers included:
    one 'stopping' message, a checkpoint, exit 0, no traceback, no process left behind."""
    args = [
        "data=imagefolder",
        f"data.root={folder}",
        "data.workers=2",
        "trainer.steps=100000",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=0",
        "trainer.tensorboard=false",
        "trainer.progress=false",
        "trainer.devices=cpu*1",
        "trainer.batch_per_device=16",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lptrain", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not checkpoint.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert out.count("stopping after this step") == 1, out
    assert "resume with trainer.resume=" in out
    assert "Traceback" not in err and "Traceback" not in out, err
    for _ in range(100):  # the workers are gone too: nothing is left in the group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("worker processes outlived the run")


# -- bad input: one line each, exit code 2, no traceback -----------------------------------------------


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("lptrain: error:")]
    assert len(errors) == 1, result.stderr
    assert all(f in errors[0] for f in fragments), errors[0]
    return errors[0]


def test_a_negative_worker_count_fails_clearly(tmp_path):
    result = cli("data.workers=-1", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    _one_line_error(result, "data.workers=-1 is not valid", "0", "null (auto)")
    assert not (tmp_path / "r").exists()


def test_an_empty_class_folder_is_named(folder, tmp_path):
    root = _first_images(folder, tmp_path / "data")
    (root / "train" / "7").mkdir()
    result = cli("data=imagefolder", f"data.root={root}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    _one_line_error(result, f"class folder {root / 'train' / '7'} holds no images")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_image_is_named_in_one_line(folder, tmp_path, workers):
    root = _first_images(folder, tmp_path / "data")
    bad = root / "train" / "1" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    result = cli(
        "data=imagefolder",
        f"data.root={root}",
        f"data.workers={workers}",
        "trainer.devices=cpu*1",
        "trainer.batch_per_device=5",  # the whole training set: the broken file is in step 0
        "trainer.steps=2",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    _one_line_error(result, f"cannot decode image {bad}")


def test_the_decode_error_is_raised_in_the_training_process(folder, tmp_path):
    root = _first_images(folder, tmp_path / "data")
    truncated = root / "train" / "0" / "truncated.jpg"
    whole = next((root / "train" / "0").iterdir()).read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    data = load_data(config("data=imagefolder", f"data.root={root}").data)
    sampler = StepBatchSampler(len(data.train), len(data.train), seed=0, start=0, stop=1)
    batches = train_batches(data.train, sampler, 1, pin_memory=False)
    with pytest.raises(DataError, match=f"cannot decode image {truncated}: image file is truncated"):
        next(batches)
    batches.close()


def test_a_too_small_image_size_is_caught_before_the_data(tmp_path):
    result = cli(
        "model.image_size=20",
        "data=imagefolder",
        "data.root=/nonexistent/images",  # not reached: the size is checked first
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    _one_line_error(result, "model.image_size=20 is below what model small needs: at least 28 pixels")
