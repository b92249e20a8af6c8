"""Values refused before a run folder is made: a tuning file's bad row, too many CPU replicas."""

from __future__ import annotations

import json

import pytest

from lptrain.auto.tuning import TuningTable
from lptrain.comm.errors import CollectiveInputError
from lptrain.data.loader import available_cpus
from lptrain.errors import ConfigError
from lptrain.exits import EXIT_USAGE
from lptrain.settings.checks import CPU_REPLICAS_PER_CORE
from lptrain.settings.locations import compose_config


def _tuning(tmp_path, **row_changes) -> str:
    rows = [
        {"op": "allreduce", "bytes": 65536, "algo": "lp", "options": {"block_size": 65536}, "time_us": 800.0},
        {"op": "allreduce", "bytes": 4194304, "algo": "lp", "options": {"block_size": 65536}, "time_us": 1800.0},
    ]
    rows[1].update(row_changes)
    path = tmp_path / "tuning.json"
    head = {"lptrain_tuning": 1, "executor": "in-process", "device_type": "cpu", "world_size": 4, "dtype": "float32"}
    path.write_text(json.dumps({**head, "rows": rows}))  # json writes inf as Infinity, as Python reads it back
    return str(path)


def test_a_tuning_row_with_block_size_0_is_refused_before_a_run_folder_is_made(tmp_path, capsys):
    from lptrain.cli import main

    path = _tuning(tmp_path, options={"block_size": 0})
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as ended:
        main(
            [
                "comm=auto",
                f"comm.options.tuning={path}",
                "trainer.devices=cpu*4",
                "trainer.steps=2",
                f"hydra.run.dir={run_dir}",
            ]
        )
    assert ended.value.code == EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert path in lines[0] and "row 1" in lines[0] and "block_size" in lines[0], lines[0]
    assert not run_dir.exists()


@pytest.mark.parametrize("time_us", [float("inf"), float("nan")])
def test_a_tuning_row_with_an_infinite_time_is_refused(tmp_path, time_us):
    path = _tuning(tmp_path, time_us=time_us)
    with pytest.raises(CollectiveInputError, match=rf"tuning file '{path}': row 1 needs .*time_us"):
        TuningTable.load(path)
    with pytest.raises(ConfigError, match="row 1"):
        compose_config(["comm=auto", f"comm.options.tuning={path}", "trainer.devices=cpu*4"])


def test_far_more_cpu_replicas_than_cores_are_refused():
    most = CPU_REPLICAS_PER_CORE * available_cpus()
    with pytest.raises(ConfigError, match=rf"trainer.devices=cpu\*{most + 1} is not valid; .*at most {most}"):
        compose_config([f"trainer.devices=cpu*{most + 1}"])
    if most < 1000:
        with pytest.raises(ConfigError, match=r"trainer.devices=cpu\*1000 is not valid"):
            compose_config(["trainer.devices=cpu*1000"])
    assert len(compose_config([f"trainer.devices=cpu*{min(most, 8)}"]).devices) == min(most, 8)
