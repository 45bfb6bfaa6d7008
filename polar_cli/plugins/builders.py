"""Built-in trajectory builders: ``per_request`` and ``prefix_merging``."""

from __future__ import annotations

from polar_cli.builders.per_request import PerRequestBuilder
from polar_cli.builders.prefix_merging import PrefixMergingBuilder
from polar_cli.hookspecs import RegisterBuilder, hookimpl


@hookimpl
def register_builders(register: RegisterBuilder) -> None:
    register(PerRequestBuilder())
    register(PrefixMergingBuilder())
