"""``hf``: TaskRequests from any HuggingFace dataset (hub name or local folder) or a local parquet/JSONL/JSON/CSV
file, loaded with ``datasets``.

Each row becomes one TaskRequest: ``instruction`` and ``task_id`` are Jinja2 templates over the row's fields (plus
``_index``, the row number); ``json_fields`` are parsed from JSON text first (e.g. a scripted-backend script);
``metadata_fields`` copies columns into the task's metadata (``{key: column}``); ``task``
is a partial TaskRequest (runtime, agent, evaluator, builder, timeout...) whose string values are templates too, so a
row can carry its own test command or image. Templates are compiled, and the columns they name checked, before any
task runs; an undefined field is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from pydantic import Field, field_validator

from polar_cli import hf_hub
from polar_cli.errors import ConfigError, PolarError
from polar_cli.extras import require
from polar_cli.interfaces import Dataset
from polar_cli.models import StrictModel, TaskRequest, validate_model

FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
LOCAL_COPY = ("give a local copy: polar generate --dataset hf -O path=/data/rows.jsonl (a dataset folder or a "
              f"{'/'.join(FILE_BUILDERS)} file)")  # fmt: skip
_env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)


def _check_template(value: str) -> str:
    try:
        _env.parse(value)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"not a valid Jinja2 template: {exc.message} (line {exc.lineno})") from exc
    return value


class HFDatasetOptions(StrictModel):
    """Options of the ``hf`` dataset."""

    path: str = Field(description="hub dataset name, local dataset folder, or a .parquet/.jsonl/.json/.csv file")
    name: str | None = Field(default=None, description="the dataset's config name (hub datasets)")
    split: str = "train"
    revision: str | None = None
    data_files: list[str] | None = None
    instruction: str = Field(description="Jinja2 template of the instruction, over the row's fields")
    task_id: str = Field(default="row-{{ _index }}", description="Jinja2 template of the task id")
    metadata_fields: dict[str, str] = Field(default_factory=dict, description="metadata key -> column copied")
    json_fields: list[str] = Field(default_factory=list, description="columns holding JSON text, parsed first")
    task: dict[str, Any] = Field(default_factory=dict, description="partial TaskRequest; string values are templates")

    _templates = field_validator("instruction", "task_id")(_check_template)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _render(value: Any, row: dict[str, Any]) -> Any:
    if isinstance(value, str):
        return _env.from_string(value).render(row) if ("{{" in value or "{%" in value) else value
    if isinstance(value, dict):
        return {k: _render(v, row) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, row) for v in value]
    return value


def load_rows(options: HFDatasetOptions) -> Any:
    """The ``datasets.Dataset`` the options name (ConfigError when ``datasets`` or the data is missing)."""
    datasets = require("datasets", needed_by="dataset 'hf'")
    local = Path(options.path)
    try:
        if local.is_file():
            builder = FILE_BUILDERS.get(local.suffix.lower())
            if builder is None:
                raise ConfigError(f"dataset 'hf': {local}: use a {', '.join(FILE_BUILDERS)} file")
            return datasets.load_dataset(builder, data_files=str(local), split=options.split)

        def load() -> Any:
            return datasets.load_dataset(options.path, options.name, split=options.split, revision=options.revision,
                                         data_files=options.data_files)  # fmt: skip

        if local.exists():  # a dataset folder
            with hf_hub.quiet():
                return load()
        return hf_hub.load_from_hub(load, name=f"{options.path} (split {options.split})", local_copy=LOCAL_COPY)
    except PolarError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ValueError...)
        raise ConfigError(f"dataset 'hf': cannot load {options.path!r}: {hf_hub.cause(exc)}") from exc


class HFDataset(Dataset):
    name = "hf"
    description = "a HuggingFace dataset or local parquet/JSONL/JSON file, mapped to tasks with Jinja2 templates"
    options = HFDatasetOptions

    def tasks(self, **config: Any) -> Iterator[TaskRequest]:
        options: HFDatasetOptions = self.parse_config(config)
        rows = load_rows(options)
        columns = set(rows.column_names) | {"_index"}
        wanted = {options.instruction, options.task_id, *_strings(options.task)}
        for text in wanted:
            missing = jinja2.meta.find_undeclared_variables(_env.parse(text)) - columns
            if missing:
                raise ConfigError(f"dataset 'hf': template {text!r} names unknown field(s) {sorted(missing)}; "
                                  f"columns: {sorted(columns - {'_index'})}")  # fmt: skip
        absent = sorted((set(options.metadata_fields.values()) | set(options.json_fields)) - columns)
        if absent:
            raise ConfigError(f"dataset 'hf': metadata_fields names unknown column(s) {absent}")
        for index, row in enumerate(rows):
            row = {**row, "_index": index}
            for column in options.json_fields:
                try:
                    row[column] = json.loads(row[column]) if isinstance(row[column], str) else row[column]
                except ValueError as exc:
                    raise ConfigError(f"dataset 'hf' row {index}: {column} is not JSON: {exc}") from exc
            data = _render(options.task, row)
            data["instruction"] = _render(options.instruction, row)
            data["task_id"] = _render(options.task_id, row)
            metadata = dict(data.get("metadata") or {})
            metadata.update({key: row[column] for key, column in options.metadata_fields.items()})
            data["metadata"] = metadata
            data.setdefault("agent", {}).setdefault("harness", "shell")
            yield validate_model(TaskRequest, data, source=f"dataset 'hf' row {index}")
