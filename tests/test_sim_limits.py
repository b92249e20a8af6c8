"""lptrain-sim refuses in one line what it cannot answer: one device, or more than it can price."""

from __future__ import annotations

import time

import pytest

from lptrain.exits import EXIT_USAGE
from lptrain.sim import cli


@pytest.mark.parametrize(
    "devices, message",
    [
        ("1000000", "--devices 1000000 is more than lptrain-sim prices (at most 1024"),
        ("1", "--devices 1: one device sends nothing"),
    ],
)
def test_predict_refuses_in_one_line(capsys, devices, message):
    began = time.monotonic()
    with pytest.raises(SystemExit) as ended:
        cli.main(["predict", "--topology", "pcie", "--devices", devices, "-b", "64M", "-e", "64M"])
    assert ended.value.code == EXIT_USAGE
    assert time.monotonic() - began < 60  # refused up front: pricing a million ranks runs for many minutes
    captured = capsys.readouterr()
    assert captured.out == ""  # no row of inf and nan
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain-sim predict: error: "), captured.err
    assert message in lines[0], lines[0]


def test_the_largest_priced_machine_still_runs(capsys):
    assert cli.main(["predict", "--devices", str(cli.MAX_DEVICES), "--algo", "mst", "-b", "1M", "-e", "1M"]) == 0
    assert "P=1024" in capsys.readouterr().out
