"""Dataset interface: a source of tasks."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

from polar_cli.interfaces.base import Component
from polar_cli.models import TaskRequest


class Dataset(Component):
    """A named task source (SWE-Gym, a JSONL file, ...).

    Its ``options`` model is validated (``check_config``) before anything runs, so a misspelt option is an error naming
    the field."""

    kind: ClassVar[str] = "dataset"

    @abstractmethod
    def tasks(self, **config: Any) -> Iterator[TaskRequest]:
        """Yield the dataset's tasks (``self.parse_config(config)`` gives the options)."""
