"""Where the Hydra configs and recipes are, in a source checkout and in an installed wheel.

The repository keeps them at the top level (``configs/``: the groups comm, model, data,
optim, trainer and ``config.yaml``; ``recipes/``: the ``recipe`` group), as the design
card lays it out. A wheel carries the same folders inside the package (``lptrain/configs``
and ``lptrain/recipes``, mapped in pyproject.toml), so ``lptrain`` finds them from any
directory after a regular install as well as from a checkout or an editable install.

The recipe files are a folder of their own named ``recipes`` while Hydra's group is
``recipe`` (``lptrain +recipe=alexnet``); Hydra names a group after its folder, so
``register_recipes`` stores each file in Hydra's ConfigStore under ``recipe`` instead of
putting the folder on the search path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from lptrain.train.run_config import RunConfig

PACKAGE = Path(__file__).resolve().parent.parent
RECIPE_GROUP = "recipe"


def _resource_dir(name: str) -> Path:
    """``lptrain/<name>`` in a wheel, else ``<checkout>/<name>`` (source tree, editable install)."""
    for candidate in (PACKAGE / name, PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"lptrain's {name}/ folder is missing: looked in {PACKAGE / name} and {PACKAGE.parent / name}; "
        "reinstall lptrain (pip install -e . from a checkout, or pip install lptrain)"
    )


def configs_dir() -> Path:
    """The folder of Hydra's primary config (config.yaml) and the groups."""
    return _resource_dir("configs")


def recipes_dir() -> Path:
    """The folder of the recipe files (Hydra's group ``recipe``)."""
    return _resource_dir("recipes")


def recipe_names() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))


def _package_header(text: str) -> str | None:
    """The ``# @package X`` line Hydra reads at the top of a config file, if there is one."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# @package"):
            return stripped.removeprefix("# @package").strip()
        if stripped and not stripped.startswith("#"):
            return None
    return None


def register_recipes() -> None:
    """Store every recipe file in Hydra's ConfigStore as group ``recipe``."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    for path in sorted(recipes_dir().glob("*.yaml")):
        text = path.read_text()
        node = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
        store.store(group=RECIPE_GROUP, name=path.stem, node=node, package=_package_header(text))


@cache
def register_all() -> None:
    """The schemas and the recipes: what Hydra needs besides the configs folder.

    Once per process: Hydra's ConfigStore keeps what is stored, so composing many jobs
    (a sweep's preflight) does not read and parse the recipe files again for each."""
    from lptrain.schema import register

    register()
    register_recipes()


@contextmanager
def hydra_context() -> Iterator[None]:
    """Hydra initialised on lptrain's configs, for ``hydra.compose`` (tests, scripts, preflight)."""
    from hydra import initialize_config_dir

    register_all()
    with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
        yield


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """What Hydra composes for ``lptrain OVERRIDES`` (without Hydra's own node), unchecked:
    for the preflight, which checks it, and for scripts that only read what a command
    line would choose."""
    from hydra import compose as hydra_compose

    with hydra_context():
        return hydra_compose("config", overrides=list(overrides))


def compose_config(overrides: Sequence[str] = ()) -> RunConfig:
    """The checked configuration ``lptrain OVERRIDES`` would run with, as typed values.

    Checked as the command line checks it (``lptrain.settings.checks.check_config``: a bad
    value is a ``ConfigError`` of one line), so that what Python callers hand to
    ``lptrain.train.trainer.Trainer`` is as sound as what the command line runs."""
    from lptrain.settings.checks import check_config

    return check_config(compose(overrides))
