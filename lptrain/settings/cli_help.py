"""``lptrain --help``: the groups, their choices and every option with one line each.

Built from the schema (``lptrain.schema``), where every default is stated, importing
neither torch nor Hydra, so it prints at once. ``lptrain --hydra-help`` still gives
Hydra's own help.
"""

from __future__ import annotations

from typing import Any

from lptrain.schema import GROUPS, SCHEMAS, field_help
from lptrain.settings.locations import configs_dir, recipe_names

USAGE = """\
usage: lptrain [-m] [GROUP=CHOICE ...] [KEY=VALUE ...] [+recipe=NAME]

Data-parallel BSP-SGD training: one model replica per device, the sub-gradients averaged
by the chosen collective algorithm every step. Options are Hydra overrides:

  lptrain                                     the default: small CNN, embedded MNIST, lp on 4 CPU replicas
  lptrain +recipe=alexnet comm=mst            a recipe (alexnet, googlenet, vgg16), another communicator
  lptrain -m comm=lp,mst,be,ring              a sweep (one run each); then: lptrain-report multirun/DATE/TIME
  lptrain trainer.resume=outputs/DATE/TIME    continue an interrupted run in its own folder

A run writes into hydra.run.dir (default outputs/DATE/TIME) and never into a folder that
holds another run: there, only trainer.resume=THAT_FOLDER continues it. Exit codes: 0 done,
1 a bug, 2 bad configuration or input (nothing written), 3 a peer failed (torchrun), 4 the
run's files could not be written, 130/143 Ctrl-C/SIGTERM (checkpoint saved).
"""


def _chosen_schema(group: str, choice: str) -> type | None:
    """The schema class that option file ``group/choice.yaml`` names in its defaults list."""
    import yaml

    path = configs_dir() / group / f"{choice}.yaml"
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    listed = data.get("defaults", []) if isinstance(data, dict) else []
    names = [entry for entry in listed if isinstance(entry, str) and entry.startswith("schema")]
    return SCHEMAS.get((group, names[0])) if names else None


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def render_help() -> str:
    import yaml

    top = yaml.safe_load((configs_dir() / "config.yaml").read_text())
    chosen = {k: v for d in top["defaults"] if isinstance(d, dict) for k, v in d.items()}
    lines = [USAGE]
    for group, base in GROUPS.items():
        choices = sorted(p.stem for p in (configs_dir() / group).glob("*.yaml"))
        default = chosen.get(group, "")
        lines.append(f"{group}={'|'.join(choices)}   (default: {default})")
        schemas = {n: cls for (g, n), cls in SCHEMAS.items() if g == group}
        common = {name for name, _, _ in field_help(base)}
        seen: dict[str, tuple[Any, str, list[str]]] = {}
        for schema_name, cls in schemas.items():
            for name, value, text in field_help(cls):
                seen.setdefault(name, (value, text, []))[2].append(schema_name.removeprefix("schema_"))
        option = _chosen_schema(group, default)
        values = {name: value for name, value, _ in field_help(option)} if option is not None else {}
        for name, (value, text, owners) in seen.items():
            shown = _show(values.get(name, value))
            shown = "(required)" if "MISSING" in shown else shown
            only = f" [{', '.join(owners)}]" if name not in common else ""
            lines.append(f"  {group + '.' + name:<30} {shown:<14} {text}{only}")
        lines.append("")
    recipes = "|".join(recipe_names())
    lines.append(f"+recipe={recipes}   the paper's networks, sized for a 2-core CPU (GPU settings inside)")
    lines.append("hydra.run.dir=PATH                 where the run writes; hydra.sweep.dir=PATH for -m")
    lines.append("--hydra-help                       Hydra's own help (--cfg job prints the composed configuration)")
    return "\n".join(lines)
