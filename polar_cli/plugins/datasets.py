"""Built-in datasets: task files on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar_cli.config import read_data_file
from polar_cli.datasets.demo import DemoDataset
from polar_cli.datasets.hf import HFDataset
from polar_cli.errors import ConfigError
from polar_cli.hookspecs import RegisterDataset, hookimpl
from polar_cli.interfaces import Dataset
from polar_cli.models import StrictModel, TaskRequest, validate_model


class TaskFileOptions(StrictModel):
    """Options of the ``tasks_file`` dataset."""

    path: str


class TaskFileDataset(Dataset):
    """TaskRequests from a ``.jsonl`` file (one per line) or a ``.json``/``.yaml`` list."""

    name = "tasks_file"
    description = "TaskRequests from a JSONL, JSON or YAML file (config: path)"
    options = TaskFileOptions

    def tasks(self, **config: Any) -> Iterator[TaskRequest]:
        options: TaskFileOptions = self.parse_config(config)
        if not options.path:
            raise ConfigError("dataset 'tasks_file' needs config 'path'")
        path = Path(options.path)
        if path.suffix.lower() == ".jsonl":
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{number}: not valid JSON: {exc}") from exc
                yield validate_model(TaskRequest, data, source=f"{path}:{number}")
            return
        data = read_data_file(path)
        items = data if isinstance(data, list) else [data]
        for number, item in enumerate(items):
            yield validate_model(TaskRequest, item, source=f"{path}[{number}]")


@hookimpl
def register_datasets(register: RegisterDataset) -> None:
    register(TaskFileDataset())
    register(DemoDataset())
    register(HFDataset())
