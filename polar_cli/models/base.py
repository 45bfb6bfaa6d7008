"""Shared pydantic configuration and readable validation errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from polar_cli.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """User-facing config: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def folded(name: str) -> str:
    """``name`` as compared for suggestions: ``-`` and ``_`` alike, case ignored."""
    return name.replace("-", "_").lower()


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'claude_code'?)`` for the closest of ``choices`` (``-``/``_`` and case confusions first), or
    ``""``: the one suggestion every unknown plugin name, entry point or config key gets."""
    choices = list(choices)
    same = [choice for choice in choices if folded(choice) == folded(name)]
    if not same:
        by_folded = {folded(choice): choice for choice in choices}
        close = difflib.get_close_matches(folded(name), list(by_folded), n=1, cutoff=0.6)
        same = [by_folded[match] for match in close]
    return f" (did you mean {same[0]!r}?)" if same else ""


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _known_fields(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names of the (sub)model that owns ``loc``'s last part, best effort."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        current = _first_model(annotation)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One readable line per problem, naming each field (and a close spelling for unknown ones)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        where = _location(loc)
        if err.get("type") == "extra_forbidden":
            hint = did_you_mean(str(loc[-1]), _known_fields(model, loc)) if loc else ""
            lines.append(f"unknown field '{where}'{hint}")
        else:
            lines.append(f"{where}: {err.get('msg')}")
    return "; ".join(lines)


def describe_config_keys_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """Like :func:`describe_validation_error`, in the words of a ``config`` mapping's keys: ``unknown config a, b
    (known: x, y)``, ``config api must be one of 'p' or 'q'``, ``config settings must be a mapping``."""
    errors = exc.errors()
    unknown = sorted(_location(tuple(e["loc"])) for e in errors if e["type"] == "extra_forbidden")
    known = ", ".join(sorted(model.model_fields))
    hints = "".join(did_you_mean(key, model.model_fields) for key in unknown[:1] if len(unknown) == 1)
    parts = [f"unknown config {', '.join(unknown)}{hints} (known: {known})"] if unknown else []
    for err in errors:
        where, kind, context = f"config {_location(tuple(err['loc']))}", err["type"], err.get("ctx") or {}
        if kind == "literal_error":
            parts.append(f"{where} must be one of {context.get('expected')}")
        elif kind in ("dict_type", "mapping_type"):
            parts.append(f"{where} must be a mapping")
        elif kind == "value_error":
            parts.append(f"{where} {context.get('error')}")
        elif kind != "extra_forbidden":
            parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def validate_model(model: type[M], data: Any, *, source: str | None = None) -> M:
    """Validate ``data`` as ``model``; a failure becomes a ConfigError naming the fields and the source."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        prefix = f"{source}: " if source else ""
        raise ConfigError(f"{prefix}invalid {model.__name__}: {describe_validation_error(exc, model)}") from exc
