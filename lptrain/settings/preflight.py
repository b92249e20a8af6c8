"""Check every job of a command line before Hydra runs any of them.

Hydra makes a job's run folder before it calls the job, and a sweep's folder before its
first job. ``preflight`` composes each job's configuration itself (a sweep expanded the
way Hydra's basic sweeper expands it), applies the schema and ``check_config``, and turns
whatever Hydra or OmegaConf objects to into one line: a bad value then costs no folder,
no checkpoint and no event file.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass

from omegaconf import DictConfig

from lptrain.errors import ConfigError
from lptrain.settings.checks import check_config
from lptrain.settings.locations import compose, register_all
from lptrain.train.run_config import RunConfig

_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}
# Hydra flags that print a configuration instead of running it, with the flags' own values:
# lptrain checks that configuration as it would check a run, so what is printed could run.
# A tuple: the values the flag may take (none: a bare flag); None: it always takes one.
_PARTS = ("job", "hydra", "all")
SHOW_FLAGS = {"--cfg": _PARTS, "-c": _PARTS, "--resolve": (), "--package": None, "-p": None}
# Hydra's launchers that are packages of their own: what a user installs to get one.
LAUNCHER_PACKAGES = {
    "joblib": "the sweeps extra: pip install 'lptrain[sweeps]'",
    "submitit_slurm": "pip install hydra-submitit-launcher",
    "submitit_local": "pip install hydra-submitit-launcher",
}


def shows_config(args: Sequence[str]) -> bool:
    """Whether ``args`` asks Hydra (or lptrain, for a sweep) to print configurations, not run them."""
    return _without_show_flags(args)[1]


def _without_show_flags(args: Sequence[str]) -> tuple[list[str], bool]:
    """``args`` without ``--cfg job``, ``--resolve``, ``-p PKG`` ...; and whether any was there."""
    rest, shown, i = [], False, 0
    while i < len(args):
        flag = args[i]
        if flag in SHOW_FLAGS:
            shown, values = True, SHOW_FLAGS[flag]
            takes_value = values is None or (i + 1 < len(args) and args[i + 1] in values)
            i += 2 if takes_value else 1
            continue
        rest.append(flag)
        i += 1
    return rest, shown


def job_overrides(args: Sequence[str]) -> list[list[str]] | None:
    """The overrides of each job the command line would run (or, with ``--cfg``, print); None
    when Hydra should answer alone (``--info``, ``--hydra-help`` ...)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    multirun = any(a in ("-m", "--multirun") for a in args)
    rest, shown = _without_show_flags(args)
    if multirun and shown and not sweep_shown(args):
        raise ConfigError("-m with --cfg prints each job's configuration: use --cfg job (hydra and all show one job)")
    args = rest
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return None
    overrides = [a for a in args if not a.startswith("-")]
    if not multirun:
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    batches = BasicSweeper.split_arguments(parsed, None)
    return list(itertools.chain.from_iterable(batches))


def sweep_shown(args: Sequence[str]) -> bool:
    """Whether ``args`` asks for each job's configuration of a sweep (``-m ... --cfg job``),
    which Hydra cannot print and lptrain does (``print_sweep``)."""
    multirun = any(a in ("-m", "--multirun") for a in args)
    pairs = zip(args, [*args[1:], ""])
    return multirun and any(flag in ("--cfg", "-c") and value == "job" for flag, value in pairs)


def task_overrides(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides Hydra reports as the job's own (``hydra.overrides.task``): those of
    ``hydra.*`` and the ``hydra/...`` groups are Hydra's."""
    own = []
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if not (key == "hydra" or key.startswith(("hydra.", "hydra/"))):
            own.append(override)
    return tuple(own)


@dataclass(frozen=True)
class Job:
    """One job of a command line: its overrides, what Hydra composes for them, and that
    configuration checked (the ``RunConfig`` the job then runs with)."""

    overrides: list[str]
    composed: DictConfig
    config: RunConfig


def print_sweep(jobs: Sequence[Job]) -> None:
    """Each job's configuration as ``preflight`` composed and checked it, under a line naming
    its overrides."""
    from omegaconf import OmegaConf

    for number, job in enumerate(jobs):
        print(f"# job {number}: {' '.join(job.overrides)}")
        print(OmegaConf.to_yaml(job.composed))


def preflight(args: Sequence[str]) -> list[Job]:
    """Compose and check every job of ``args`` (none when Hydra answers alone, as for
    ``--info``). Raises ``ConfigError``."""
    register_all()
    try:
        jobs = job_overrides(args)
    except ConfigError:
        raise
    except Exception as err:  # an override Hydra cannot parse
        raise ConfigError(one_line(err)) from None
    checked = []
    for overrides in jobs or []:
        try:
            cfg = compose(overrides)  # Hydra's words made one line; then ours
        except Exception as err:
            raise ConfigError(one_line(err)) from None
        checked.append(Job(overrides, cfg, check_config(cfg)))
    return checked


def one_line(err: BaseException) -> str:
    """What Hydra or OmegaConf said, as one line that names the key and the valid choices."""
    root = err
    while root.__cause__ is not None:
        root = root.__cause__
    key = getattr(root, "full_key", None)
    text = str(root).split("\n")[0].strip()
    if key and type(root).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
        schema = getattr(root, "object_type", None)
        path, _, name = key.rpartition(".")
        valid = [f.name for f in fields(schema)] if schema is not None and is_dataclass(schema) else []
        where = f"; {path}'s options: {', '.join(valid)}" if valid else ""
        return f"{key} is not an option{where}"
    if key and type(root).__name__ == "ValidationError":
        value = getattr(root, "value", None)
        for word, phrase in _TYPE_WORDS.items():
            if text.endswith(f"converted to {word}"):
                return f"{key}={value} is not valid: expected {phrase}"
        return f"{key}={value} is not valid: {text}"
    options = getattr(root, "options", None)
    missing = getattr(root, "missing_cfg_file", None)
    if missing and options is not None:  # comm=foo: an option the group does not have
        group, _, name = str(missing).rpartition("/")
        choices = [o for o in options if not o.startswith("schema")]
        hint = LAUNCHER_PACKAGES.get(name) if group == "hydra/launcher" else None
        needs = f" ({name} needs {hint})" if hint else ""
        return f"{group}={name} is not valid; valid choices: {', '.join(choices)}{needs}"
    return " ".join(str(root).split())
