"""scripts/benchmarks.py, without measuring anything: a section is replaced between its
markers and nothing else changes, a missing marker is a one-line error, a failed section
leaves the document as it was, the document renders again from its saved JSON, and the
headline table links to the sections it quotes."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "benchmarks.py"
WORK_LOG = re.compile(r"issue [0-9]+|this session|this morning|the morning's|later the same day", re.I)


@pytest.fixture(scope="module")
def bm():
    import benchmarks  # scripts/ is on the path: pyproject's pytest pythonpath

    return benchmarks


def _doc(bm, names=("a", "b", "c")) -> str:
    parts = ["# Title\n\nan introduction\n"]
    for name in names:
        begin, end = bm.markers(name)
        parts.append(f"{begin}\n## Section {name}\n\nold {name}\n{end}\n\nbetween {name}\n")
    return "\n".join(parts)


def test_a_section_is_replaced_between_its_markers_and_the_rest_is_kept_byte_for_byte(bm):
    text = _doc(bm)
    new = bm.replace_section(text, "b", ["## Section b", "", "new b"])
    assert "new b" in new and "old b" not in new
    assert new.count("<!-- benchmarks:b -->") == 1 and new.count("<!-- /benchmarks:b -->") == 1
    before, after = text.split("<!-- benchmarks:b -->")[0], text.split("<!-- /benchmarks:b -->")[1]
    assert new.startswith(before) and new.endswith(after)
    assert bm.replace_section(new, "b", ["## Section b", "", "old b"]) == text  # back again, byte for byte


@pytest.mark.parametrize("broken", ["<!-- benchmarks:b -->", "<!-- /benchmarks:b -->"])
def test_a_missing_marker_is_a_one_line_error(bm, broken):
    text = _doc(bm).replace(broken + "\n", "")
    with pytest.raises(bm.MarkerError) as err:
        bm.replace_section(text, "b", ["x"])
    assert "\n" not in str(err.value) and "<!-- benchmarks:b -->" in str(err.value)


def test_a_missing_marker_stops_the_run_before_anything_is_measured(bm, tmp_path, capsys, monkeypatch):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(_doc(bm, ["processes"]))
    monkeypatch.setattr(bm.BY_NAME["inprocess"], "measure", None)  # would fail if it were called
    code = bm.main(["--only", "inprocess", "--doc", str(doc), "--data-dir", str(tmp_path / "data"),
                    "--readme", str(tmp_path / "README.md")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "benchmarks:inprocess" in err


def _inprocess_results() -> dict:
    rows = []
    for p in (4, 8):
        for op in ("allreduce", "broadcast", "reduce"):
            for size in (1024, 64 << 20):
                rows.append({"op": op, "size": size, "algo": "memcpy", "devices": p, "time_us": 1.0, "moved": 10.0,
                             "vs_memcpy": 1.0, "wrong": None})  # fmt: skip
                for i, algo in enumerate(("lp", "lp-rb", "mst", "be", "ring")):
                    rows.append({"op": op, "size": size, "algo": algo, "devices": p, "time_us": 20.0 + i,
                                 "moved": 8.0 + i, "vs_memcpy": 0.8 + i / 10, "wrong": 0})  # fmt: skip
    return {"rows": rows}


def _record(name: str, results: dict) -> dict:
    return {"section": name, "started": "2026-01-02 03:04 UTC", "took_s": 65.0, "load": [1.0, 2.0, 3.0],
            "load_end": [1.5, 2.0, 3.0], "commands": ["lptrain-bench --op all"], "results": results,
            "machine": {"cpu": "a CPU", "cores": 2, "memory_gib": 8.0, "os": "Linux 6", "python": "3.11",
                        "torch": "2.14.1", "threads": 2, "cuda": False}}  # fmt: skip


def test_a_section_renders_from_its_saved_json_and_fills_the_readme_headline(bm, tmp_path):
    doc, data, readme = tmp_path / "BENCHMARKS.md", tmp_path / "data" / "benchmarks", tmp_path / "README.md"
    data.mkdir(parents=True)
    doc.write_text(_doc(bm, ["inprocess", "processes"]))
    before = doc.read_text()
    (data / "inprocess.json").write_text(json.dumps(_record("inprocess", _inprocess_results())))
    readme.write_text("# lptrain\n\n<!-- benchmarks:headline -->\n<!-- /benchmarks:headline -->\n\nthe rest\n")
    code = bm.main(["--render", "--only", "inprocess,processes", "--doc", str(doc), "--data-dir", str(data),
                    "--readme", str(readme)])  # fmt: skip
    assert code == 0
    text = doc.read_text()
    heading = bm.BY_NAME["inprocess"].heading
    assert f"## {heading}" in text and "2026-01-02 03:04 UTC" in text
    assert "| 4 | allreduce | 10.0 | 8.0 (0.80) |" in text  # 64M: moved GB/s and the ratio to memcpy
    assert "1.00 / 2.00 / 3.00" in text  # the load average at the start
    assert text.split("<!-- benchmarks:processes -->")[1] == before.split("<!-- benchmarks:processes -->")[1]
    head = readme.read_text()
    assert head.endswith("<!-- /benchmarks:headline -->\n\nthe rest\n")
    link = re.search(r"\(docs/BENCHMARKS\.md#([\w-]+)\)", head)
    assert link and link.group(1) == bm.anchor(heading) == "in-process-collectives-against-memcpy"
    assert "0.80x memcpy" in head


def test_a_failed_section_leaves_the_document_and_its_data_as_they_were(bm, tmp_path, monkeypatch):
    doc, data = tmp_path / "BENCHMARKS.md", tmp_path / "data"
    doc.write_text(_doc(bm, ["inprocess", "data"]))
    before = doc.read_bytes()

    def fails(run):
        run("python -c 'import sys; sys.exit(3)'")

    monkeypatch.setattr(bm.BY_NAME["inprocess"], "measure", fails)
    monkeypatch.setattr(bm.BY_NAME["data"], "measure", lambda run: {"not": "what render_data reads"})
    monkeypatch.setattr(bm, "machine", lambda: {})
    readme = tmp_path / "README.md"  # none: the headline is not written
    assert bm.main(["--only", "inprocess,data", "--doc", str(doc), "--data-dir", str(data),
                    "--readme", str(readme)]) == 1  # fmt: skip
    assert doc.read_bytes() == before and not data.exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_run_on_another_document_leaves_the_checkouts_readme_alone(bm, tmp_path, monkeypatch):
    """The headline table is made from the data folder's records: a run whose document and
    data are elsewhere (a test's, a trial's) must not rewrite the checkout's README.md from
    them unless --readme names it."""
    readme = tmp_path / "README.md"
    text = "# lptrain\n\n<!-- benchmarks:headline -->\n| a headline |\n<!-- /benchmarks:headline -->\n"
    readme.write_text(text)
    monkeypatch.setattr(bm, "README", readme)  # stands in for the checkout's README.md
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(_doc(bm, ["data"]))
    monkeypatch.setattr(bm.BY_NAME["data"], "measure", lambda run: {"not": "what render_data reads"})
    monkeypatch.setattr(bm, "machine", lambda: {})
    assert bm.main(["--only", "data", "--doc", str(doc), "--data-dir", str(tmp_path / "data")]) == 1
    assert readme.read_text() == text
    assert bm.main(["--render", "--only", "data", "--doc", str(doc), "--data-dir", str(tmp_path / "data")]) == 0
    assert readme.read_text() == text


def test_the_gpu_section_quotes_the_benchmark_step_of_the_check():
    """The section shows the command scripts/gpu_check.sh ran, read from the script itself."""
    from benchmark_sections import gpu

    saved = json.loads((ROOT / "docs" / "data" / "benchmarks" / "gpu.json").read_text())
    assert gpu.bench_step(gpu.CHECK.read_text()) == saved["results"]["bench_command"]
    script = 'x\nstep bench 25 "$PY" -m lptrain.bench --algo lp \\\n    --json "$logs/b.json"\ny\n'
    assert gpu.bench_step(script) == "python -m lptrain.bench --algo lp"  # continuation joined, the log left out


def test_the_gpu_section_refuses_in_one_line_without_cuda(bm, tmp_path, capsys, monkeypatch):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(_doc(bm, ["gpu"]))
    monkeypatch.setattr(bm, "cuda_available", lambda: False)
    assert bm.main(["--only", "gpu", "--doc", str(doc), "--data-dir", str(tmp_path / "data"),
                    "--readme", str(tmp_path / "README.md")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA" in err


def test_the_command_line_helps_lists_and_rejects_an_unknown_section(tmp_path):
    run = [sys.executable, str(SCRIPT)]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "--only" in shown and "--render" in shown and "cluster (only when named)" in shown
    listed = subprocess.run([*run, "--list"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert [line.split()[0] for line in listed.splitlines()][:2] == ["inprocess", "processes"]
    bad = subprocess.run([*run, "--only", "nonsense"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "no section nonsense" in bad.stderr


def test_the_committed_document_is_what_its_saved_data_renders(bm, tmp_path):
    """docs/BENCHMARKS.md, rendered again from docs/data/ without measuring, is unchanged:
    no figure in it that the data (and so the run that saved it) does not hold."""
    data = tmp_path / "data" / "benchmarks"
    shutil.copytree(ROOT / "docs" / "data" / "benchmarks", data)
    shutil.copy(ROOT / "docs" / "data" / "cluster.json", data.parent / "cluster.json")
    doc = tmp_path / "BENCHMARKS.md"
    shutil.copy(ROOT / "docs" / "BENCHMARKS.md", doc)
    readme = tmp_path / "README.md"  # none: the headline is not written
    assert bm.main(["--render", "--doc", str(doc), "--data-dir", str(data), "--readme", str(readme)]) == 0
    assert doc.read_text() == (ROOT / "docs" / "BENCHMARKS.md").read_text()


def test_the_document_states_the_present_not_a_work_log(bm):
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert not WORK_LOG.findall(text)
    for section in bm.SECTIONS:
        begin, end = bm.markers(section.name)
        assert text.count(begin) == 1 and text.count(end) == 1, section.name
        assert f"(#{bm.anchor(section.heading)})" in text  # the index links every section


def test_a_rewritten_document_keeps_its_permissions(bm, tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("old\n")
    doc.chmod(0o644)
    bm.write_atomically(doc, "new\n")
    assert doc.read_text() == "new\n" and doc.stat().st_mode & 0o777 == 0o644


def test_run_as_these_tests_run_it_the_script_leaves_its_checkout_clean(tmp_path):
    """benchmarks.py on a document and data folder of its own, without --readme (as the tests
    above run it), inside a git checkout: ``git status`` there is clean after, README.md
    included (its headline table is not rewritten from a folder with no data)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", checkout / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "README.md", checkout / "README.md")
    (checkout / ".gitignore").write_text("__pycache__/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run([*git, *command], cwd=checkout, check=True)
    doc = tmp_path / "BENCHMARKS.md"
    shutil.copy(ROOT / "docs" / "BENCHMARKS.md", doc)
    script = checkout / "scripts" / "benchmarks.py"
    run = subprocess.run(
        [sys.executable, str(script), "--render", "--doc", str(doc), "--data-dir", str(tmp_path / "data")],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    status = subprocess.run(["git", "status", "--porcelain"], cwd=checkout, capture_output=True, text=True)
    assert status.stdout == "", status.stdout
