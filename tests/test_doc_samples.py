"""scripts/doc_samples.py runs a sample's command and keeps what a reader of the sample sees:
the command's own output, without torchrun's banner (which opens with a blank line)."""

from __future__ import annotations

import pytest

import doc_samples
from doctools.samples import Sample, refreshed

# What torchrun writes before the program's own first line, with the line the program printed.
BANNER = (
    "import sys; print(); print('*' * 41); "
    "print('Setting OMP_NUM_THREADS environment variable for each process to be 1 in default'); "
    "print('*' * 41); print('# the first line of the output')"
)


def test_the_output_starts_at_the_commands_first_line_not_at_torchruns_banner():
    sample = Sample("docs/x.md", 1, f'python -c "{BANNER}"', "")
    lines, _ = doc_samples.run(sample, timeout=60)
    assert lines == ["# the first line of the output"]


def test_a_commands_tmp_paths_are_a_fresh_folder_shown_as_tmp():
    """A run folder an earlier run left in /tmp would change what the command prints."""
    probe = "import os, sys; p = sys.argv[1]; print(p, os.path.exists(p)); open(p, 'w').close()"
    sample = Sample("docs/x.md", 1, f'python -c "{probe}" /tmp/doc_samples_probe_file', "")
    first, _ = doc_samples.run(sample, timeout=60)
    again, _ = doc_samples.run(sample, timeout=60)
    assert first == again == ["/tmp/doc_samples_probe_file False"]


def test_the_lines_after_the_last_ellipsis_are_the_outputs_last_lines():
    """A table's last row has the shape of its first: the sample's last line stands for the
    output's last line, not for the first line of its shape."""
    shown = ["# size algo time", "1M lp 10.0", "...", "16M gloo 20.0"]
    output = ["# size algo time", "1M lp 11.0", "1M gloo 12.0", "16M lp 13.0", "16M gloo 14.0", ""]
    assert refreshed(shown, output) == ["# size algo time", "1M lp 11.0", "...", "16M gloo 14.0"]


DOCUMENT = """\
| to | run |
|---|---|
| emulate a cluster | `lptrain-cluster --nodes 4 -- lptrain-bench` (time: ?) |
| predict | `lptrain-sim predict` |

```bash
lptrain-cluster --help
lptrain-cluster --nodes 8 -- \\
    lptrain-bench --op all  # time: 2026-01-01, Old CPU, 2 threads, no GPU, torch 2.0: 9 s
python scripts/x.py --links   # time: ?
```

```
$ lptrain  # 2026-01-01, Old CPU: 9 s
done  # time: ?
```
"""


def test_a_marked_command_is_run_and_its_time_written_in_its_mark():
    """Only the marked commands run (continuations joined, a sample's lines left alone), and
    each mark then states the date, the machine and the wall clock, a stated one again."""
    ran: list[str] = []

    def runner(command: str) -> float:
        ran.append(command)
        return 70.4

    chosen = doc_samples.timed_commands("README.md", DOCUMENT)
    assert [t.stated for t in chosen] == ["?", "2026-01-01, Old CPU, 2 threads, no GPU, torch 2.0: 9 s", "?"]
    text = doc_samples.retime(DOCUMENT, chosen, runner, today="2026-12-05", machine="AMD EPYC, 2 threads")
    assert ran == [
        "lptrain-cluster --nodes 4 -- lptrain-bench",
        "lptrain-cluster --nodes 8 -- lptrain-bench --op all",
        "python scripts/x.py --links",
    ]
    stamp = "2026-12-05, AMD EPYC, 2 threads: 1 min 10 s"
    expected = (
        DOCUMENT.replace("(time: ?)", f"(time: {stamp})")
        .replace("# time: 2026-01-01, Old CPU, 2 threads, no GPU, torch 2.0: 9 s", f"# time: {stamp}")
        .replace("--links   # time: ?", f"--links   # time: {stamp}")
    )
    assert text == expected
    assert [t.stated for t in doc_samples.timed_commands("README.md", text)] == [stamp] * 3


def test_a_timed_command_that_fails_stops_the_script_naming_it():
    def runner(command: str) -> float:
        raise doc_samples.CommandFailed("exit code 5")

    chosen = doc_samples.timed_commands("README.md", DOCUMENT)
    with pytest.raises(SystemExit, match=r"README.md:3: lptrain-cluster --nodes 4 -- lptrain-bench: exit code 5"):
        doc_samples.retime(DOCUMENT, chosen, runner, today="2026-12-05", machine="AMD EPYC")


def test_list_shows_the_long_commands_with_the_time_they_state(capsys):
    """README's emulated-cluster command is long (minutes): it carries a time: mark, and
    --list says what the mark states."""
    doc_samples.main(["README.md", "--list"])
    listed = capsys.readouterr().out.splitlines()
    cluster = [row for row in listed if "lptrain-cluster --nodes 4 --link 200mbit --" in row]
    assert len(cluster) == 1 and "  (time: " in cluster[0], listed
