"""The common root of every pluggable component, and its one idiom for options."""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from polar_cli.errors import ConfigError
from polar_cli.models.base import StrictModel, describe_validation_error


class NoOptions(StrictModel):
    """The options of a component that takes none: any key is an error."""


class Component(ABC):  # noqa: B024 - the root carries only naming and options, each category adds its abstract methods
    """A named, registered piece of Polar: a harness, runtime, builder, evaluator, dataset or backend.

    ``kind`` is the plugin category; ``name`` is what users write in specs and on the command line. ``options`` is the
    pydantic model of the component's config (``AgentSpec.config``, ``RuntimeSpec.config``, ``BuilderSpec.config``,
    ``EvaluatorSpec.config``, dataset options): strict (``extra="forbid"``, e.g. a ``StrictModel``; the registry
    refuses any other), so a misspelt key is an error naming the field when the task is submitted.
    """

    kind: ClassVar[str] = "component"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[type[BaseModel]] = NoOptions

    def parse_config(self, config: Mapping[str, Any]) -> Any:
        """``config`` validated as :attr:`options` (an instance of it); ConfigError naming each bad field."""
        try:
            return self.options.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigError(f"{self.kind} {self.name!r}: {self.describe_config_error(exc)}") from exc

    def check_config(self, config: Mapping[str, Any]) -> None:
        """Raise ConfigError naming the field when ``config`` is not one this component accepts. Called when a task is
        submitted, possibly on another machine: check the config, not the host. The default parses :attr:`options`;
        override to check more, and call it first."""
        self.parse_config(config)

    def describe_config_error(self, exc: ValidationError) -> str:
        """``exc`` in words, one part per problem, each naming its field."""
        return describe_validation_error(exc, self.options)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name!r} ({type(self).__module__}.{type(self).__qualname__})>"
