"""CLI commands, one module each; every module exposes ``register(app)``, called by the built-in
``register_commands`` (``polar_cli.plugins.commands``)."""
