"""The repository's layout and what an installed lptrain carries (configs and recipes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

from lptrain.settings.locations import compose_config, configs_dir, recipe_names, recipes_dir

ROOT = Path(__file__).resolve().parents[1]


def test_the_repository_root_has_the_design_cards_layout():
    for name in ("pyproject.toml", "README.md", "lptrain", "configs", "recipes", "tests", "scripts"):
        assert (ROOT / name).exists(), name
    groups = sorted(p.name for p in (ROOT / "configs").iterdir() if p.is_dir())
    assert groups == ["comm", "data", "model", "optim", "trainer"]
    assert not (ROOT / "lptrain" / "configs").exists()  # one copy only: the top-level folders


def test_pyproject_lists_every_package_of_the_source_tree():
    """The list is explicit (configs and recipes map in from outside lptrain/), so check nothing is forgotten."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = find_packages(where=str(ROOT), include=["lptrain*"])
    assert sorted(listed) == sorted([*found, "lptrain.configs", "lptrain.recipes"])


def test_a_checkout_reads_the_top_level_folders():
    assert configs_dir() == ROOT / "configs" and recipes_dir() == ROOT / "recipes"
    assert recipe_names() == sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert compose_config(["+recipe=googlenet"]).model.name == "googlenet"


def test_a_regular_install_finds_its_configs_and_recipes_from_any_directory(tmp_path):
    """Not only the editable install: a built wheel must carry configs/ and recipes/."""
    source = tmp_path / "source"  # a copy: no stale build/ folder of the checkout can slip into the wheel
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("lptrain", "configs", "recipes"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
        + ["--target", str(target), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "lptrain" / "configs" / "config.yaml").is_file()
    assert sorted(p.stem for p in (target / "lptrain" / "recipes").glob("*.yaml")) == recipe_names()
    env = dict(os.environ, PYTHONPATH=str(target))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "lptrain", "+recipe=vgg16", "--cfg", "job"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "name: vgg16" in result.stdout and "warmup_steps" in result.stdout
    where = subprocess.run(
        [sys.executable, "-c", "from lptrain.settings.locations import configs_dir; print(configs_dir())"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(target / "lptrain" / "configs")


def _gpu_wheels():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "scripts" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torch_and_torchvision_are_a_range_and_the_installed_ones_lie_in_it():
    """A user's own CUDA build of torch must be able to satisfy the requirement, and what
    the tests run on must be inside what is declared (the GPU check asserts the same there)."""
    from packaging.requirements import Requirement

    wheels = _gpu_wheels()
    declared = {Requirement(r).name: Requirement(r) for r in wheels.project_requirements()}
    for name in ("torch", "torchvision"):
        spec = declared[name].specifier
        assert not any(s.operator in ("==", "===") for s in spec), f"{name} is pinned ({spec}): declare a range"
    assert wheels.unmet(wheels.project_requirements(), []) == []


def test_the_requirement_check_names_what_is_missing_and_what_is_out_of_range():
    wheels = _gpu_wheels()
    problems = wheels.unmet(["torch>=99", "no-such-package-lptrain>=1", "pytest; extra == 'x'"], [])
    assert problems == [
        f"wrong version: torch {torch_version()} is installed, torch>=99 is needed",
        "missing: no-such-package-lptrain (needed as no-such-package-lptrain>=1)",
    ]


def torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def test_the_gpu_wheel_set_covers_what_the_gpu_machine_lacks():
    """hydra-core, omegaconf and antlr4 (built from its source archive) and mlxtend: each once."""
    wheels = _gpu_wheels()
    assert set(wheels.DOWNLOAD) | set(wheels.BUILD) == {"hydra-core", "omegaconf", "antlr4-python3-runtime", "mlxtend"}
    assert not set(wheels.DOWNLOAD) & set(wheels.BUILD)
