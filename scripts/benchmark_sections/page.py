"""docs/BENCHMARKS.md's side of the sections: where each one's record is kept, how a record
becomes the section between its markers (heading, question, commands, run, machine, load,
then the section's own render), and the README's headline table made from the records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmark_sections import SECTIONS, Section, cluster
from doctools import DOCS, ROOT, document
from doctools.commands import duration
from doctools.files import read_json, write_atomically, write_json
from doctools.machine import describe
from doctools.markdown import anchor, table

DOC = DOCS / "BENCHMARKS.md"
DATA = DOCS / "data" / "benchmarks"
README = ROOT / "README.md"
PREFIX = "benchmarks"  # <!-- benchmarks:NAME --> ... <!-- /benchmarks:NAME -->
HEADLINE = "headline"  # the README's section


def markers(name: str) -> tuple[str, str]:
    return document.markers(name, PREFIX)


def replace_section(text: str, name: str, body: list[str], where: str = "the document") -> str:
    return document.replace_section(text, name, body, PREFIX, where)


def data_path(name: str, data_dir: Path) -> Path:
    return data_dir / f"{name}.json"


def load_record(name: str, data_dir: Path) -> dict | None:
    """A section's saved record; the cluster's is made from cluster.json beside ``data_dir``
    (cluster_results.py's own file). None where nothing was saved."""
    if name == cluster.NAME:
        path = data_dir.parent / cluster.DATA.name
        return cluster.record(read_json(path)) if path.exists() else None
    path = data_path(name, data_dir)
    return read_json(path) if path.exists() else None


def frame(section: Section, record: dict) -> list[str]:
    """The section between its markers: heading, question, commands, conditions, then its
    tables and reading."""
    lines = [f"## {section.heading}", "", section.question, "", "```bash", *record["commands"], "```", ""]
    took = f", took {duration(record['took_s'])}" if record.get("took_s") else ""
    lines.append(
        f"- Run: {record['started']}{took}; `python scripts/benchmarks.py --only {section.name}` runs it again."
    )
    lines.append(f"- Machine: {describe(record['machine'])}.")
    if record.get("load"):
        end = f"; {record['load_end'][0]:.2f} at its end" if record.get("load_end") else ""
        lines.append(
            f"- Load average at its start: {' / '.join(f'{x:.2f}' for x in record['load'])} (1 / 5 / 15 min)"
            f"{end}. The machine is shared with other work, so the figures move from run to run."
        )
    return [*lines, "", *section.render(record["results"])]


def write_section(section: Section, record: dict, doc: Path, data_dir: Path) -> None:
    """The record saved and its section rewritten in ``doc``; rendered before anything is
    written, so a failure changes nothing."""
    body = frame(section, record)
    text = replace_section(doc.read_text(), section.name, body, where=str(doc))
    if section.name != cluster.NAME:  # the cluster's JSON is cluster_results.py's own
        write_json(data_path(section.name, data_dir), record)
    write_atomically(doc, text)


def headline(records: dict[str, dict]) -> list[str]:
    """The README's table: one row per section that has a record and a headline, in the
    document's order, each linked to its section."""
    rows = []
    for section in SECTIONS:
        record = records.get(section.name)
        got = section.headline(record["results"]) if record is not None else None
        if got is None:
            continue
        what, figure = got
        date = str(record["started"]).split()[0]
        rows.append([what, figure, f"[{date}](docs/BENCHMARKS.md#{anchor(section.heading)})"])
    return table(["what", "result", "measured"], rows)


def write_headline(readme: Path, data_dir: Path, say: Callable[[str], None]) -> None:
    """The headline table rewritten in ``readme`` from the records in ``data_dir`` (said and
    skipped where ``readme`` has no headline markers)."""
    begin = markers(HEADLINE)[0]
    if not readme.exists() or begin not in readme.read_text():
        say(f"no headline table: {readme} has no '{begin}' line")
        return
    records = {s.name: r for s in SECTIONS if (r := load_record(s.name, data_dir)) is not None}
    document.update_sections(readme, {HEADLINE: headline(records)}, PREFIX)
    say(f"wrote the headline table in {readme}")
