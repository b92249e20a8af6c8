"""The wheels a bare GPU machine needs to run lptrain from a checkout, and a check that it has them all.

A lent GPU machine has its own ``python3`` with torch, torchvision and many common packages
(numpy, PyYAML, matplotlib, tensorboard, tqdm, pytest, pytest-timeout, scipy, pandas,
scikit-learn, packaging) but no package registry. What lptrain needs beyond those is
brought along as wheels in ``.whl/`` (ignored by git) and installed there with
``pip install --no-index --no-deps --target``::

    python3 scripts/gpu_wheels.py                   # here: download and build into .whl/
    python3 scripts/gpu_wheels.py check /tmp/site   # there (or in a dry run): is every need met?

``check`` reads lptrain's own dependencies from pyproject.toml and every carried wheel's
``Requires-Dist`` (extras and markers that do not apply left out) and says, one line each,
what is missing or of a version outside the declared range (exit 1), so a missing package
shows before any test is collected. It also checks that the installed torch lies in the
range pyproject.toml declares.

antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 and hydra-core 1.3 pin) exists only as a source archive,
so its wheel is built here; it is pure Python, like the others.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What the machine lacks, each at one version (two versions of one name stop the install).
# mlxtend 0.23.x: 0.25 asks for scikit-learn>=1.8 and numpy>=2.3.5, newer than needed.
DOWNLOAD = {"hydra-core": "1.3.8", "omegaconf": "2.3.1", "mlxtend": "0.23.4"}
BUILD = {"antlr4-python3-runtime": "4.9.3"}  # only a source archive on the registry
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def prepare(dest: Path, python_version: str) -> list[Path]:
    """Download and build the wheels into ``dest`` (emptied of other wheels first)."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    _pip(
        "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
        "--implementation", "cp", *platform_args, "-d", str(dest),
        *(f"{name}=={version}" for name, version in DOWNLOAD.items()),
    )  # fmt: skip
    _pip(
        "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", str(dest),
        *(f"{name}=={version}" for name, version in BUILD.items()),
    )  # fmt: skip
    wheels = sorted(dest.glob("*.whl"))
    names = [_wheel_name(w) for w in wheels]
    if sorted(names) != sorted(_norm(n) for n in (*DOWNLOAD, *BUILD)):
        raise SystemExit(f"gpu_wheels: expected one wheel of each of {sorted(names)}, found {[w.name for w in wheels]}")
    return wheels


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _wheel_name(wheel: Path) -> str:
    return _norm(wheel.name.split("-")[0])


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def project_requirements() -> list[str]:
    """lptrain's own dependencies, as pyproject.toml declares them."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def unmet(requirements: list[str], paths: list[str]) -> list[str]:
    """One line per requirement not met by the distributions found on ``paths`` (plus sys.path)."""
    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    for dist in metadata.distributions(path=[*paths, *sys.path]):
        found.setdefault(_norm(dist.metadata["Name"]), dist.version)
    problems = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra, or another Python
        have = found.get(_norm(req.name))
        if have is None:
            problems.append(f"missing: {req.name} (needed as {text})")
        elif req.specifier and not req.specifier.contains(have.split("+")[0], prereleases=True):
            problems.append(f"wrong version: {req.name} {have} is installed, {text} is needed")
    return problems


def check(target: Path, wheels_dir: Path) -> int:
    requirements = project_requirements()
    for wheel in sorted(wheels_dir.glob("*.whl")):
        requirements += _wheel_requirements(wheel)
    problems = unmet(requirements, [str(target)])
    for line in problems:
        print(f"gpu_wheels: {line}", file=sys.stderr)
    if not problems:
        print(f"gpu_wheels: all {len(requirements)} requirements met (lptrain's and the carried wheels')")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=("prepare", "check"), default="prepare")
    parser.add_argument("target", nargs="?", type=Path, default=Path("/tmp/lptrain-site"), help="check: the --target")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="the wheels' folder (default .whl/)")
    parser.add_argument("--python-version", default="3.12", help="prepare: the GPU machine's Python (default 3.12)")
    args = parser.parse_args(argv)
    if args.action == "check":
        return check(args.target, args.wheels)
    wheels = prepare(args.wheels, args.python_version)
    total = sum(w.stat().st_size for w in wheels)
    print(f"gpu_wheels: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.wheels}:")
    for w in wheels:
        print(f"  {w.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
