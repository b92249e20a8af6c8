"""scripts/doc_samples.py runs a sample's command and keeps what a reader of the sample sees:
the command's own output, without torchrun's banner (which opens with a blank line)."""

from __future__ import annotations

import doc_samples
from doctools.samples import Sample

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
