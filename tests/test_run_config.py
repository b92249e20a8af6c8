"""The configuration flows one way: Hydra composes, ``check_config`` returns typed values with
what follows from them derived once, and every default is stated in the schema alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import MISSING, asdict, fields
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from lptrain.schema import GROUPS, SCHEMAS
from lptrain.settings.locations import compose, compose_config, configs_dir
from lptrain.train.run_config import RunConfig
from lptrain.train.sync import SYNC_STRATEGIES, AllreduceSync, ReduceSync

PACKAGE = Path(__file__).resolve().parents[1] / "lptrain"
OPTION_FILES = sorted((group, path) for group in GROUPS for path in (configs_dir() / group).glob("*.yaml"))


def schema_of(group: str, path: Path) -> type:
    listed = yaml.safe_load(path.read_text())["defaults"]
    names = [entry for entry in listed if isinstance(entry, str) and entry.startswith("schema")]
    assert len(names) == 1, f"{path} names {names}: one schema each"
    return SCHEMAS[(group, names[0])]


@pytest.mark.parametrize(("group", "path"), OPTION_FILES, ids=lambda v: getattr(v, "name", v))
def test_an_option_file_only_chooses_a_schema_and_its_name(group, path):
    """A YAML file that stated a value would be a second place for that default."""
    data = yaml.safe_load(path.read_text())
    assert set(data) <= {"defaults", "name"}, f"{path} states values: {sorted(set(data) - {'defaults', 'name'})}"
    assert data["defaults"][-1] == "_self_"
    if "name" in data:
        assert data["name"] == path.stem


@pytest.mark.parametrize(("group", "path"), OPTION_FILES, ids=lambda v: getattr(v, "name", v))
def test_composing_an_option_gives_its_schema_defaults(group, path):
    """What a run gets is what the schema (and so ``lptrain --help``) says: no YAML disagrees."""
    cls = schema_of(group, path)
    composed = OmegaConf.to_container(compose([f"{group}={path.stem}"])[group], resolve=False)
    expected = asdict(cls(**({"name": path.stem} if "name" in {f.name for f in fields(cls)} else {})))
    assert composed == expected


def test_every_schema_field_has_a_default_but_the_options_name():
    for (group, _), cls in SCHEMAS.items():
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING:
                assert f.name == "name", f"{group}.{f.name} has no default in {cls.__name__}"


def test_check_config_returns_typed_groups_and_the_derived_values():
    config = compose_config(["trainer.devices=cpu*3", "trainer.global_batch=24", "trainer.sync=reduce", "comm=ring"])
    assert isinstance(config, RunConfig)
    assert type(config.comm).__name__ == "ScheduleCommConfig" and config.comm.name == "ring"
    assert [str(d) for d in config.devices] == ["cpu"] * 3 and config.processes == 1
    assert (config.replicas, config.per_device_batch, config.global_batch, config.local_batch) == (3, 8, 24, 24)
    assert config.sync is SYNC_STRATEGIES["reduce"]
    assert config.groups()["trainer"]["global_batch"] == 24  # plain data, what config.yaml holds


def test_interpolated_defaults_are_resolved_in_the_typed_values():
    config = compose_config(["data=synthetic", "model.image_size=40"])
    assert config.data.image_size == 40


COUNT_RESOLVES = """
import sys
import lptrain.train.devices as devices
calls = []
real = devices.resolve_devices
def counted(*args, **kwargs):
    calls.append(args)
    return real(*args, **kwargs)
devices.resolve_devices = counted
from lptrain.cli import main
try:
    main(sys.argv[1:])
finally:
    print("RESOLVED", len(calls), flush=True)
"""


@pytest.mark.parametrize(
    ("args", "jobs"),
    [([], 1), (["-m", "comm=lp,ring"], 2)],
    ids=["one run", "a sweep of two"],
)
def test_the_devices_are_resolved_once_per_run(tmp_path, args, jobs):
    where = "hydra.sweep.dir" if args else "hydra.run.dir"
    command = [
        *args,
        f"{where}={tmp_path / 'out'}",
        "trainer.steps=1",
        "trainer.devices=cpu*2",
        "trainer.batch_per_device=4",
        "trainer.progress=false",
        "trainer.eval_every=0",
        "trainer.checkpoint_every=0",
        "trainer.tensorboard=false",
    ]
    result = subprocess.run(
        [sys.executable, "-c", COUNT_RESOLVES, *command], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"RESOLVED {jobs}" in result.stdout


def test_nothing_below_the_command_line_reads_a_dictconfig():
    """Only the settings (which check what Hydra composed) and the command line touch OmegaConf;
    the schema only registers itself with Hydra."""
    allowed = {"lptrain/cli.py", "lptrain/schema.py"}
    readers = []
    for path in PACKAGE.rglob("*.py"):
        name = str(path.relative_to(PACKAGE.parent))
        if name.startswith("lptrain/settings/") or name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            if any(m.split(".")[0] in ("omegaconf", "hydra") for m in modules):
                readers.append(name)
    assert not readers, f"below the command line, modules read Hydra's configuration: {sorted(set(readers))}"


def test_no_sync_mode_is_tested_by_its_name():
    hits = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in PACKAGE.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "sync ==" in line or "sync !=" in line
    ]
    assert not hits, hits


class Recorder:
    """A communicator that records what it is asked."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def allreduce(self, tensors, op="sum"):
        self.calls.append(("allreduce", len(tensors), op))

    def reduce(self, tensors, root=0, op="sum"):
        self.calls.append(("reduce", len(tensors), root, op))

    def broadcast(self, tensors, root=0):
        self.calls.append(("broadcast", [len(t) for t in tensors], root))


def test_the_allreduce_strategy_sends_gradients_and_steps_every_replica():
    sync, comm = AllreduceSync(), Recorder()
    sync.reduce_gradients(comm, ["g0", "g1", "g2"])
    sync.broadcast_parameters(comm, [[0] * 10] * 3, [(0, 4), (4, 10)])
    assert comm.calls == [("allreduce", 3, "avg")]
    assert sync.updated(["a", "b", "c"]) == ["a", "b", "c"]
    assert sync.overflow_counts(1) and sync.overflow_counts(0)
    assert sync.messages(10, 2, 4) == [("allreduce", 20)] and sync.bytes_per_step(10, 2, 4) == 20


def test_the_reduce_strategy_updates_the_root_and_broadcasts_its_parameters():
    sync, comm = ReduceSync(), Recorder()
    sync.reduce_gradients(comm, ["g0", "g1", "g2"])
    sync.broadcast_parameters(comm, [list(range(10))] * 3, [(0, 4), (4, 10)])
    assert comm.calls == [("reduce", 3, 0, "avg"), ("broadcast", [4, 4, 4], 0), ("broadcast", [6, 6, 6], 0)]
    assert sync.updated(["a", "b", "c"]) == ["a"]
    assert sync.overflow_counts(0) and not sync.overflow_counts(1)
    assert sync.messages(10, 2, 4) == [("reduce", 20), ("broadcast", 40)] and sync.bytes_per_step(10, 2, 4) == 60
