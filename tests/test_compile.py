"""trainer.compile, trainer.channels_last and trainer.cudnn_benchmark.

The compiled trainer is held to the eager one by the yardstick of the convergence study
(docs/CONVERGENCE.md): the distance between eager runs that differ only in the order of
their additions. Its control, ``lp`` with the chain reversed, reorders the gradient's sum
over the replicas alone (7e-9 after 5 steps here). Inductor also reorders the sums inside
every convolution and matrix product, and so does an eager run in channels_last (oneDNN's
NHWC kernels): that second control moved the parameters by 4.3e-6 after 5 steps, exactly
as far as compiling did. The bound is four times the larger control.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lptrain.errors import ConfigError
from lptrain.models import build_model
from lptrain.settings.locations import compose_config
from lptrain.train import compiled
from lptrain.train.replicas import Replicas
from lptrain.train.trainer import Trainer

QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0"]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def inductor_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Inductor's compiled kernels go to a folder of the test session's, not to
    /tmp/torchinductor_USER, which would outlive the tests."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "inductor"))


def trainer(tmp_path: Path, *overrides: str) -> Trainer:
    return Trainer(compose_config([*QUIET, "trainer.checkpoint_every=0", *overrides]), tmp_path)


def trained(tmp_path: Path, *overrides: str) -> tuple[Trainer, object]:
    t = trainer(tmp_path, *overrides)
    return t, t.fit()


def drift(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# -- refusals: one line, exit 2, before any run folder ----------------------------------------


def test_compile_without_a_cpp_compiler_is_refused_naming_what_it_looked_for(monkeypatch):
    monkeypatch.setattr(compiled, "cpp_compilers", lambda: ["/nonexistent/c++"])
    with pytest.raises(ConfigError, match=r"trainer.compile=true is not valid; Inductor compiles CPU replicas"):
        compose_config(["trainer.compile=true"])
    compose_config(["trainer.compile=false"])  # eager needs no compiler


def test_the_command_line_refuses_compile_without_a_compiler_in_one_line_and_makes_no_folder(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "CXX": "/nonexistent/c++"}
    cmd = [sys.executable, "-m", "lptrain", "trainer.compile=true", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: trainer.compile=true is not valid"), lines
    assert "/nonexistent/c++" in lines[0]
    assert not run_dir.exists() and not (tmp_path / "outputs").exists()


def test_compile_for_cuda_without_triton_says_so(monkeypatch):
    import torch.utils._triton

    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: False)
    assert "with Triton, which is not usable here" in compiled.compile_problem("cuda")
    assert (compiled.compile_problem("cpu") is None) == any(map(shutil.which, compiled.cpp_compilers()))


def test_cudnn_benchmark_is_refused_on_cpus():
    with pytest.raises(ConfigError, match=r"trainer.cudnn_benchmark=true is not valid; .* no cuDNN"):
        compose_config(["trainer.cudnn_benchmark=true", "trainer.devices=cpu*2"])


# -- what compiling keeps: the plain modules, their names, their hooks ------------------------


def test_compiled_replicas_keep_the_plain_modules_and_their_state_dict_keys(tmp_path):
    t = trainer(tmp_path, "trainer.compile=true", "trainer.devices=cpu*2")
    plain = build_model("small", 10, 28).state_dict().keys()
    for model, forward in zip(t.replicas.models, t.forwards):
        assert forward is not model and getattr(forward, "_orig_mod", None) is model
        assert model.state_dict().keys() == plain  # no _orig_mod. prefix
    state = t.save(0)
    saved = torch.load(state, weights_only=True)
    assert torch.equal(saved["params"], t.replicas.params[0])


# -- channels_last: the weights are NHWC views of the flat buffer; checkpoints in plain order --


def test_channels_last_weights_are_nhwc_views_of_the_flat_buffers_and_save_in_the_plain_order():
    model = build_model("small", 10, 28)
    plain = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reps = Replicas(model, [CPU, CPU], channels_last=True)
    convs = [p for p in reps.models[1].parameters() if p.dim() == 4 and p.shape[1] > 1]  # one channel: no order
    assert convs
    for p in convs:
        assert p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
        assert p.untyped_storage().data_ptr() == reps.params[1].untyped_storage().data_ptr()
        assert p.grad.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(reps.params[0], plain)  # the buffer's order differs ...
    assert torch.equal(reps.state_params(), plain)  # ... what a checkpoint holds does not
    other = Replicas(build_model("small", 10, 28), [CPU], channels_last=True)
    other.load_params(plain)
    assert torch.equal(other.params[0], reps.params[0])


@pytest.mark.slow
def test_channels_last_trains_as_the_default_layout_and_its_checkpoint_resumes_there(tmp_path):
    """The same training whichever the layout (the kernels differ: within a float32 rounding
    of the parameters' size), and a channels_last checkpoint continues a default-layout run."""
    common = ["trainer.steps=4", "trainer.devices=cpu*2", "trainer.batch_per_device=16"]
    plain, _ = trained(tmp_path / "a", *common)
    nhwc = trainer(tmp_path / "b", *common, "trainer.channels_last=true", "trainer.stop_at=2")
    nhwc.fit()
    nhwc.save(2)
    resumed, _ = trained(tmp_path / "c", *common, f"trainer.resume={nhwc.checkpoint_path}")
    assert resumed.start_step == 2
    scale = float(plain.replicas.params[0].abs().max())
    assert drift(resumed.replicas.state_params(), plain.replicas.state_params()) <= 1e-5 * scale
    assert nhwc.replicas.identical() and resumed.replicas.identical()


# -- the compiled trainer against the eager one -----------------------------------------------

STEPS = ["trainer.steps=5", "trainer.log_every=1"]


@pytest.fixture(scope="module")
def eager(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Eager lp, and the controls: lp with its chain reversed (the gradient's sum in another
    order) and lp in channels_last (the kernels' sums in another order)."""
    work = tmp_path_factory.mktemp("eager")
    out = {}
    controls = {"chain": ["comm.options.order=[3,2,1,0]"], "kernels": ["trainer.channels_last=true"]}
    for name, extra in {"lp": [], **controls}.items():
        t, _ = trained(work / name, *STEPS, *extra)
        out[name] = t.replicas.state_params().clone()
    return out


def reorder_bound(eager: dict[str, torch.Tensor]) -> float:
    """Four times what reordering alone moves the parameters (the larger control), plus two
    float32 ulps of the largest."""
    lp = eager["lp"]
    moved = max(drift(eager["chain"], lp), drift(eager["kernels"], lp))
    return 4 * moved + 2 * torch.finfo(torch.float32).eps * float(lp.abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False])
def test_compiled_training_matches_eager_within_the_reordering_control(tmp_path, eager, overlap, capsys):
    assert drift(eager["kernels"], eager["lp"]) > 0  # the control moves something: the bound has a scale
    t, summary = trained(tmp_path, *STEPS, "trainer.compile=true", f"trainer.overlap={str(overlap).lower()}")
    assert drift(t.replicas.state_params(), eager["lp"]) <= reorder_bound(eager)
    assert summary.replicas_identical
    assert summary.compile_s is not None and summary.compile_s > 0
    out = capsys.readouterr().out
    assert "compile: torch.compile on every replica" in out
    assert f"compile {summary.compile_s:.1f} s (first step), not in the step times" in out


@pytest.mark.slow
def test_a_compiled_run_resumes_to_the_uninterrupted_compiled_run(tmp_path):
    """Stopped at step 2 and resumed compiled: the same parameters as five compiled steps in one
    go (the same kernels on the same numbers, so bitwise)."""
    whole, _ = trained(tmp_path / "whole", *STEPS, "trainer.compile=true")
    first = trainer(tmp_path / "first", *STEPS, "trainer.compile=true", "trainer.stop_at=2")
    first.fit()
    first.save(2)
    resumed, summary = trained(tmp_path / "resumed", *STEPS, "trainer.compile=true", f"trainer.resume={first.run_dir}")
    assert torch.equal(resumed.replicas.state_params(), whole.replicas.state_params())
    assert summary.replicas_identical and summary.render(resumed.config, 1).count("compile ") == 1


@pytest.mark.slow
def test_compiled_bf16_autocast_trains_and_keeps_the_replicas_identical(tmp_path):
    t, summary = trained(tmp_path, "trainer.steps=3", "trainer.compile=true", "trainer.precision=bf16")
    assert summary.replicas_identical and torch.isfinite(torch.tensor(summary.final_loss))
