"""scripts/ has a shape: the documents' generators share one harness (scripts/doctools),
each benchmark section is a module of the same shape (scripts/benchmark_sections), and
nothing finds its imports by editing ``sys.path`` (pyproject's pytest ``pythonpath`` and
the script's own folder do that)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"NAME": str, "HEADING": str, "QUESTION": str, "MINUTES": int, "DEFAULT": bool}


def sys_path_edits(source: str) -> list[int]:
    """The lines of ``source`` that change ``sys.path``: a call of one of its methods
    (insert, append, extend ...), an assignment to it or to an item of it."""

    def is_sys_path(node: ast.AST) -> bool:
        return ast.unparse(node) in ("sys.path", "os.sys.path")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for target in targets:
                if is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value)):
                    lines.append(node.lineno)
    return sorted(lines)


def test_the_check_finds_each_way_of_editing_sys_path():
    source = "import sys\nsys.path.insert(0, 'x')\nsys.path += ['y']\nsys.path[:0] = ['z']\nprint(sys.path)\n"
    assert sys_path_edits(source) == [2, 3, 4]


@pytest.mark.parametrize("folder", ["scripts", "tests"])
def test_no_script_or_test_edits_sys_path(folder):
    edits = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := sys_path_edits(path.read_text()))
    }
    assert not edits, f"sys.path edited at {edits}: import through pyproject's pytest pythonpath instead"


def test_the_scripts_packages_are_on_pytests_path_and_not_in_the_wheel():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "scripts" in pyproject["tool"]["pytest"]["ini_options"]["pythonpath"]
    packages = pyproject["tool"]["setuptools"]["packages"]
    assert not [p for p in packages if "doctools" in p or "benchmark_sections" in p]
    assert not (ROOT / "lptrain" / "cluster" / "experiment.py").exists()  # docs tooling: scripts/doctools


def test_every_benchmark_section_module_has_the_same_shape():
    import benchmark_sections

    names = []
    for module in benchmark_sections.MODULES:
        for constant, kind in SHAPE.items():
            assert isinstance(getattr(module, constant, None), kind), f"{module.__name__}.{constant}"
        for function in ("measure", "render", "headline"):
            assert callable(getattr(module, function, None)), f"{module.__name__}.{function}"
        assert module.__doc__, module.__name__
        names.append(module.NAME)
    assert len(set(names)) == len(names)
    assert [s.name for s in benchmark_sections.SECTIONS] == names
    on_disk = {p.stem for p in (ROOT / "scripts" / "benchmark_sections").glob("*.py")}
    listed = {m.__name__.rsplit(".", 1)[1] for m in benchmark_sections.MODULES}
    assert on_disk - listed == {"__init__", "common", "page"}, "a section module missing from MODULES"


def test_a_section_without_a_headline_says_so_with_none():
    import benchmark_sections

    for section in benchmark_sections.SECTIONS:
        if section.name in ("ddp-hook", "data", "overlap"):
            assert section.headline({}) is None


def test_a_script_finds_the_shared_packages_from_any_folder(tmp_path):
    """``python scripts/X.py`` puts scripts/ first on the path: no PYTHONPATH is needed for it."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "benchmarks.py"), "--list"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "inprocess"
