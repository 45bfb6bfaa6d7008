"""CLI commands, one module each; every module exposes ``register(app)``."""
