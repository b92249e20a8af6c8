"""The one error type for a configuration that cannot run as given.

It sits at the top of the package, beside ``lptrain.exits`` (its exit code is
``EXIT_USAGE``), so that every layer can raise it: ``lptrain.settings`` when it checks a
configuration, ``lptrain.train`` for what only the devices, the data or the checkpoint
can tell.
"""


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or out of range.

    Its message is one line that names the key, the bad value and the valid choices; the
    command line prints it and exits with code 2, before anything is written.
    """
