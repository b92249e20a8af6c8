"""lptrain.settings: the configuration's checks, and the command line's front door.

``checks`` turns Hydra's composed configuration into a ``RunConfig`` (the schema's
dataclasses of ``lptrain.schema``, with what follows from them derived once) or one line
of ``ConfigError``; ``preflight`` composes every job of a command line and checks it before
Hydra creates anything; ``cli_help`` prints ``lptrain --help`` without importing torch;
``locations`` finds the configs and recipes in a checkout or an installed wheel (and
``compose_config`` gives Python callers a checked ``RunConfig``); ``rundirs`` claims run
folders; ``launchers`` shares the devices among a parallel sweep's jobs and ``outcomes``
reads back what its jobs in other processes came to. ``ConfigError`` lives in
``lptrain.errors``, where every layer can raise it; it is exported here as well.
"""

from lptrain.errors import ConfigError

__all__ = ["ConfigError"]
