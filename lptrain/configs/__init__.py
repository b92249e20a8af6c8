"""The YAML defaults of every config group (Hydra's config module ``lptrain.configs``).

Importing it registers the schemas they start from (``lptrain.settings.schema``), so that
``hydra.initialize_config_module("lptrain.configs")`` composes them from anywhere.
"""

from lptrain.settings.schema import register

register()
