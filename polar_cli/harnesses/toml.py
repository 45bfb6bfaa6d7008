"""A tiny TOML writer for harness config files (nested tables of strings, numbers, booleans and lists)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "-_" for c in key) else json.dumps(key)


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as TOML: scalars first, then one ``[table]`` per nested mapping (recursively)."""
    lines: list[str] = []

    def table(path: list[str], mapping: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in mapping.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in mapping.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            lines.append(f"\n[{'.'.join(_key(p) for p in path)}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars)
        for key, value in tables:
            table([*path, key], value)

    table([], data)
    return "\n".join(lines).lstrip("\n") + "\n"
