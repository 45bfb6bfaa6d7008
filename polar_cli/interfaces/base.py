"""The common root of every pluggable component."""

from __future__ import annotations

from abc import ABC
from typing import ClassVar


class Component(ABC):  # noqa: B024 - the root carries only naming, each category adds its abstract methods
    """A named, registered piece of Polar: a harness, runtime, builder, evaluator, dataset or backend.

    ``kind`` is the plugin category; ``name`` is what users write in specs and on the command line.
    """

    kind: ClassVar[str] = "component"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name!r} ({type(self).__module__}.{type(self).__qualname__})>"
