"""lptrain.settings: the configuration's schema, its checks, and the command line's front door.

``schema`` holds one dataclass per config group (Hydra structured configs: the YAML files
in the top-level ``configs/`` are their defaults), ``checks`` the ranges and choices a type
cannot express, ``preflight`` composes every job of a command line and checks it before
Hydra creates anything, ``cli_help`` prints ``lptrain --help`` without importing torch, and
``locations`` finds the configs and recipes in a checkout or an installed wheel (and
``compose_config`` composes a checked configuration for Python callers). ``ConfigError``
lives in ``lptrain.errors``, where every layer can raise it; it is exported here as well.
"""

from lptrain.errors import ConfigError

__all__ = ["ConfigError"]
