"""The one error type for a configuration that cannot run as given."""


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or out of range.

    Its message is one line that names the key, the bad value and the valid choices; the
    command line prints it and exits with code 2, before anything is written.
    """
