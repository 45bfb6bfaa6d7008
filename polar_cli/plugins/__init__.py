"""Built-in plugins, registered through the same hooks as installed ones (``DEFAULT_PLUGINS`` in
:mod:`polar_cli.registry`): datasets, runtimes, backends, harnesses, evaluators, builders and the CLI commands."""
