"""Loading user config files (YAML or JSON) into validated models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from polar_cli.errors import ConfigError
from polar_cli.models import validate_model

M = TypeVar("M", bound=BaseModel)


def read_data_file(path: str | Path) -> Any:
    """Parse a ``.json``, ``.yaml`` or ``.yml`` file; errors name the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {exc}") from exc


def load_model_file(model: type[M], path: str | Path) -> M:
    """Read and validate one config file as ``model``; a bad field is named together with the file."""
    return validate_model(model, read_data_file(path), source=str(path))


def set_dotted(data: dict[str, Any], overrides: dict[str, Any], *, source: str) -> dict[str, Any]:
    """Apply ``overrides`` (dotted keys, e.g. ``agent.harness``; None = not given) to ``data`` in place."""
    for dotted, value in overrides.items():
        if value is None:
            continue
        target = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = target.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: {key} must be a mapping")
            target = node
        target[leaf] = value
    return data
