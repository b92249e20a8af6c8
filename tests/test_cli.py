"""The command line a user can trust: the schema, no run overwritten, device specs, exit codes, help."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lptrain.comm.devices import device_list
from lptrain.errors import ConfigError
from lptrain.train.devices import resolve_devices

FAST = ["trainer.progress=false", "trainer.eval_every=0", "trainer.checkpoint_every=0"]


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lptrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and a digest of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# -- bad input: one line naming the key, exit code 2, nothing created ------------------------------------

BAD_INPUT = [
    (["+trainer.stepz=3"], "trainer.stepz is not an option (did you mean steps?)"),
    (["optim.schedule=cosin"], "optim.schedule=cosin is not valid (did you mean cosine?); valid choices: constant"),
    (["trainer.batch_per_device=2000"], "the global batch (8000 images) is larger than data=mnist's training set"),
    (["optim.lr=-0.1"], "optim.lr=-0.1 is not valid; use a positive learning rate"),
    (["trainer.steps=0"], "trainer.steps=0 is not valid; use a positive number of steps"),
    (["trainer.batch_per_device=0"], "trainer.batch_per_device=0 is not valid"),
    (["trainer.steps=abc"], "trainer.steps=abc is not valid: expected an integer"),
    (["comm=tree"], "comm=tree is not valid; valid choices: auto, be, lp, mst, nccl, ring"),
    (["comm=mst", "comm.options.block_size=1M"], "comm.options.block_size is not an option"),
    (["comm=ring", "comm.options.reduce_kernel=fast"], "comm.options.reduce_kernel=fast is not valid; valid choices"),
    (["comm.options.reduce_kernel=peer"], "reduce_kernel=peer needs CUDA devices; on the CPU use auto or staged"),
    (["comm.options.cuda_graph=yes"], "comm.options.cuda_graph=yes is not valid; valid choices: auto, on, off"),
    (["trainer.devices=cpu:4"], "trainer.devices=cpu:4 is not valid: a CPU device has no index"),
    (["trainer.devices=gpu"], "trainer.devices=gpu is not valid"),
    (["trainer.profile=0"], "trainer.profile=0 is not valid; use a step N or a range A-B of steps counted from 1"),
    (["+colour=red"], "colour is not a config group; the groups: comm, model, data, optim, trainer"),
    (["-m", "comm=lp,ring", "optim.momentum=1.5"], "optim.momentum=1.5 is not valid; use a value in [0, 1)"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, overrides, message):
    run_dir, sweep_dir = tmp_path / "run", tmp_path / "sweep"
    result = cli(*overrides, f"hydra.run.dir={run_dir}", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: "), result.stderr
    assert message in lines[0]
    assert not run_dir.exists() and not sweep_dir.exists()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_an_empty_image_folder_is_one_line_and_leaves_no_run(tmp_path):
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "images" / "val").mkdir()
    run_dir = tmp_path / "run"
    result = cli("data=imagefolder", f"data.root={tmp_path / 'images'}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"lptrain: error: image folder {tmp_path / 'images' / 'train'} holds no class folders; "
        "it needs one sub-folder of images per class"
    ]
    assert not run_dir.exists()


def test_a_corrupt_resume_file_is_refused_without_torch_advice(tmp_path):
    garbage = tmp_path / "last.pt"
    garbage.write_bytes(os.urandom(4096))
    run_dir = tmp_path / "run"
    result = cli(f"trainer.resume={garbage}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"trainer.resume={garbage} is not valid" in result.stderr and "weights_only" not in result.stderr
    assert not run_dir.exists()


# -- nothing overwritten ---------------------------------------------------------------------------------


def test_a_second_run_into_a_run_folder_leaves_the_first_byte_identical(tmp_path):
    run_dir = tmp_path / "run"
    first = cli(
        "trainer.steps=3",
        "trainer.log_every=1",
        "trainer.checkpoint_every=3",
        f"hydra.run.dir={run_dir}",
        "trainer.progress=false",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    before = snapshot(run_dir)
    assert {"metrics.jsonl", "steps.jsonl", "checkpoints/last.pt", "config.yaml"} <= set(before)
    assert any(name.startswith("tb/events") for name in before)
    second = cli("trainer.steps=5", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert second.returncode == 2
    assert f"{run_dir} already holds a run" in second.stderr and f"trainer.resume={run_dir}" in second.stderr
    assert snapshot(run_dir) == before
    # Continuing it there is what trainer.resume is for: the steps go on from 3, not from 1 again.
    third = cli(
        "trainer.steps=5",
        "trainer.log_every=1",
        f"trainer.resume={run_dir}",
        f"hydra.run.dir={run_dir}",
        "trainer.progress=false",
        "trainer.checkpoint_every=5",
        cwd=tmp_path,
    )
    assert third.returncode == 0, third.stderr
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if "loss" in m] == [1, 2, 3, 4, 5]
    assert [json.loads(line)["step"] for line in (run_dir / "steps.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert cli("trainer.steps=2", *FAST[:2], f"hydra.run.dir={run_dir}", cwd=tmp_path).returncode == 0
    before = snapshot(run_dir)
    again = cli("trainer.steps=2", f"trainer.resume={run_dir}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already finished step 2 of 2: nothing to do" in again.stdout
    assert "nan" not in again.stdout
    assert snapshot(run_dir) == before


# -- interruption: exit code 130 after the checkpoint --------------------------------------------------------


def test_ctrl_c_saves_and_exits_130(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lptrain",
            "trainer.steps=100000",
            "trainer.log_every=1",
            *FAST,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while not (run_dir / "steps.jsonl").exists() or not (run_dir / "steps.jsonl").read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted after step" in out and (run_dir / "checkpoints" / "last.pt").exists()


# -- device specs as PyTorch users write them ------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, device_type, expected",
    [
        (4, "cpu", ["cpu"] * 4),
        ("3", "cpu", ["cpu"] * 3),
        ("cpu*2", "auto", ["cpu"] * 2),
        ("cpu", "auto", ["cpu"]),
        (["cpu", "cpu"], "auto", ["cpu"] * 2),
        ("cpu,cpu,cpu", "auto", ["cpu"] * 3),
    ],
)
def test_device_specs(spec, device_type, expected):
    assert resolve_devices(spec, device_type) == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answers")
def test_auto_without_a_gpu_is_four_cpu_replicas_and_cuda_specs_say_cuda_is_missing():
    assert resolve_devices("auto", "auto") == ["cpu"] * 4
    assert resolve_devices(2, "auto") == ["cpu"] * 2
    for spec, kind in (("cuda:0", "auto"), ("cuda", "auto"), (2, "cuda"), ("cuda*2", "auto")):
        with pytest.raises(Exception, match="needs CUDA"):
            resolve_devices(spec, kind)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_cuda_0_is_gpu_0():
    assert resolve_devices("cuda:0", "auto") == ["cuda:0"]
    assert resolve_devices(1, "cuda") == ["cuda:0"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("cpu:4", r"trainer.devices=cpu:4 is not valid: a CPU device has no index \(for 4 CPU replicas: cpu\*4\)"),
        (0, "trainer.devices=0 is not valid: a count is a positive N"),
        ("tpu:0", "trainer.devices=tpu:0 is not valid: a device is cpu, cuda or cuda:N"),
    ],
)
def test_bad_device_specs_speak_the_command_line(spec, message):
    with pytest.raises(ConfigError, match=message) as caught:
        resolve_devices(spec, "cpu")
    assert "['cpu']" not in str(caught.value)  # no Python syntax on a command line


def test_the_bench_speaks_its_own_syntax(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lptrain.bench", "--devices", "cpu:2", "-b", "1K", "-e", "1K"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "--devices=cpu:2 is not valid" in result.stderr and "--devices 4 --device-type cpu" in result.stderr
    assert device_list("2", "cpu") == ["cpu", "cpu"]


# -- help and console ------------------------------------------------------------------------------------


def test_help_lists_every_group_and_option_quickly(tmp_path):
    began = time.perf_counter()
    result = cli("--help", cwd=tmp_path)
    took = time.perf_counter() - began
    assert result.returncode == 0
    out = result.stdout
    assert "powered by Hydra" not in out
    for line in ("comm=auto|be|lp|mst|nccl|ring", "trainer.devices", "comm.options.block_size", "optim.lr", "+recipe="):
        assert line in out
    assert not (tmp_path / "outputs").exists()
    print(f"lptrain --help took {took:.2f} s")  # a figure to look at, not a test of speed


# -- --cfg: the printed configuration is the one that would run, checked the same way --------------------

CFG_BAD = [
    (["comm=foo", "--cfg", "job"], "comm=foo is not valid; valid choices: auto, be, lp, mst, nccl, ring"),
    (["optim.lr=-0.1", "--cfg", "job"], "optim.lr=-0.1 is not valid; use a positive learning rate"),
    (["-c", "job", "+trainer.stepz=3"], "trainer.stepz is not an option"),
    (["-m", "comm=lp,mst", "--cfg", "hydra"], "-m with --cfg prints each job's configuration: use --cfg job"),
    (["-m", "comm=lp,foo", "--cfg", "job"], "comm=foo is not valid"),
]


@pytest.mark.parametrize("args, message", CFG_BAD, ids=[" ".join(a) for a, _ in CFG_BAD])
def test_cfg_checks_the_overrides_and_says_what_is_wrong_in_one_line(tmp_path, args, message):
    result = cli(*args, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: "), result.stderr
    assert message in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_cfg_job_prints_the_checked_configuration_and_creates_nothing(tmp_path):
    result = cli("+recipe=alexnet", "comm=mst", "--cfg", "job", cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "name: mst" in result.stdout and "name: alexnet" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_with_cfg_job_prints_every_job_checked_and_creates_nothing(tmp_path):
    result = cli("-m", "comm=lp,mst", "trainer.steps=3,4", "--cfg", "job", cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    heads = [line for line in result.stdout.splitlines() if line.startswith("# job ")]
    assert heads == [
        "# job 0: comm=lp trainer.steps=3",
        "# job 1: comm=lp trainer.steps=4",
        "# job 2: comm=mst trainer.steps=3",
        "# job 3: comm=mst trainer.steps=4",
    ]
    assert result.stdout.count("name: mst") == 2 and "steps: 4" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_help_into_a_pager_that_quits_early_is_not_a_traceback(tmp_path):
    result = subprocess.run(
        f"{sys.executable} -m lptrain --help | head -1", shell=True, cwd=tmp_path, capture_output=True, text=True
    )
    assert result.stdout.startswith("usage: lptrain") and "Traceback" not in result.stderr, result.stderr
