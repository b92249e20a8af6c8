"""scripts/doc_samples.py runs a sample's command and keeps what a reader of the sample sees:
the command's own output, without torchrun's banner (which opens with a blank line)."""

from __future__ import annotations

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
