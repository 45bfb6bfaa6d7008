"""Dataset interface: a source of tasks."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from polar_cli.interfaces.base import Component
from polar_cli.models import TaskRequest, validate_model


class Dataset(Component):
    """A named task source (SWE-Gym, a JSONL file, ...).

    ``options`` is the pydantic model of its config (``extra="forbid"``): ``check_config`` validates a config before
    anything runs, so a misspelled option is an error naming the field."""

    kind: ClassVar[str] = "dataset"
    options: ClassVar[type[BaseModel] | None] = None

    def check_config(self, config: Mapping[str, Any]) -> BaseModel | None:
        """The validated options (ConfigError naming the field), or None for a dataset without an options model."""
        if self.options is None:
            return None
        return validate_model(self.options, dict(config), source=f"dataset {self.name!r} options")

    @abstractmethod
    def tasks(self, **config: Any) -> Iterator[TaskRequest]:
        """Yield the dataset's tasks."""
