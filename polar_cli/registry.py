"""Plugin manager factory and component registry.

Built-in plugins (DEFAULT_PLUGINS) and installed ones (entry-point group ``polar``) go through the same hooks.
``POLAR_LOAD_PLUGINS`` is a comma-separated allow-list of entry-point names; set it to an empty string to load no
installed plugin at all (the test suite does this by default).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pluggy
from pydantic import BaseModel

from polar_cli import hookspecs
from polar_cli.errors import PluginError, UnknownComponentError
from polar_cli.interfaces import (
    Builder,
    Component,
    Dataset,
    Evaluator,
    Harness,
    InferenceBackend,
    Runtime,
)
from polar_cli.models.base import did_you_mean, folded

ENTRY_POINT_GROUP = "polar"
LOAD_ENV = "POLAR_LOAD_PLUGINS"
CORE_DISTRIBUTION = "polar-rl"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "polar_cli.plugins.datasets",
    "polar_cli.plugins.runtimes",
    "polar_cli.plugins.backends",
    "polar_cli.plugins.harnesses",
    "polar_cli.plugins.evaluators",
    "polar_cli.plugins.builders",
    "polar_cli.plugins.commands",
)

# category -> (hook name, interface)
CATEGORIES: dict[str, tuple[str, type[Component]]] = {
    "harness": ("register_harnesses", Harness),
    "runtime": ("register_runtimes", Runtime),
    "builder": ("register_builders", Builder),
    "evaluator": ("register_evaluators", Evaluator),
    "dataset": ("register_datasets", Dataset),
    "backend": ("register_backends", InferenceBackend),
}

C = TypeVar("C", bound=Component)


@dataclass(frozen=True)
class PluginSource:
    """Where a component came from."""

    plugin: str
    package: str
    version: str

    def __str__(self) -> str:
        return f"{self.package} {self.version} (plugin {self.plugin!r})"


@dataclass(frozen=True)
class Registration:
    kind: str
    name: str
    component: Component
    source: PluginSource


def _core_version() -> str:
    from polar_cli import __version__

    return __version__


def allowed_entry_points() -> set[str] | None:
    """The allow-list from ``POLAR_LOAD_PLUGINS``; ``None`` means load every installed plugin."""
    raw = os.environ.get(LOAD_ENV)
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def installed_entry_points() -> list[md.EntryPoint]:
    return sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def check_allow_list(allowed: set[str], installed: list[md.EntryPoint]) -> None:
    """PluginError for a ``POLAR_LOAD_PLUGINS`` name that no installed plugin has: a typo, or a package or module
    name where the entry-point name belongs (``polar-codex`` for ``codex``), would otherwise load nothing silently."""
    names = sorted({ep.name for ep in installed})
    for wrong in sorted(allowed - set(names)):
        by_other_name = [ep.name for ep in installed
                         if folded(wrong) in (folded(_dist_of(ep)[0]), folded(ep.value.split(":")[0]))]  # fmt: skip
        hint = f" (did you mean {by_other_name[0]!r}?)" if by_other_name else did_you_mean(wrong, names)
        raise PluginError(
            f"${LOAD_ENV} names {wrong!r}, which no installed plugin is{hint}: it is a comma-separated list of "
            f"plugin entry-point names (group {ENTRY_POINT_GROUP!r}, as `polar plugins --all` lists them), not package "
            f"or module names; installed: {', '.join(names) or 'none'}; empty: load none"
        )


def _dist_of(ep: md.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.value.split(":")[0], "unknown"
    return dist.metadata["Name"], dist.version


def create_plugin_manager() -> tuple[pluggy.PluginManager, dict[str, PluginSource]]:
    """A fresh manager with built-ins and the allowed installed plugins registered and checked."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    sources: dict[str, PluginSource] = {}
    for module_name in DEFAULT_PLUGINS:
        module = importlib.import_module(module_name)
        pm.register(module, name=module_name)
        sources[module_name] = PluginSource(module_name, CORE_DISTRIBUTION, _core_version())
    allowed = allowed_entry_points()
    installed = installed_entry_points()
    if allowed:
        check_allow_list(allowed, installed)
    for ep in installed:
        if allowed is not None and ep.name not in allowed:
            continue
        package, version = _dist_of(ep)
        try:
            plugin = ep.load()
        except Exception as exc:  # any import failure of third-party code is reported, not raised raw
            raise PluginError(
                f"plugin {ep.name!r} from {package} {version} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        if pm.is_registered(plugin):
            continue
        try:
            pm.register(plugin, name=ep.name)
        except ValueError as exc:
            raise PluginError(f"plugin {ep.name!r} from {package} {version} could not register: {exc}") from exc
        sources[ep.name] = PluginSource(ep.name, package, version)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin implements an unknown hook: {exc}") from exc
    return pm, sources


class Registry:
    """All registered components, validated: every name present and unique within its category."""

    def __init__(self, pm: pluggy.PluginManager, sources: dict[str, PluginSource]) -> None:
        self.pm = pm
        self.sources = sources
        self._by_kind: dict[str, dict[str, Registration]] = {kind: {} for kind in CATEGORIES}
        for kind, (hook_name, interface) in CATEGORIES.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                source = sources.get(impl.plugin_name) or PluginSource(impl.plugin_name, "unknown", "unknown")
                impl.function(register=self._registrar(kind, interface, source))

    def _registrar(self, kind: str, interface: type[Component], source: PluginSource) -> Callable[[Any], None]:
        def register(component: Any) -> None:
            if isinstance(component, type):
                raise PluginError(f"{source} registered the class {component.__name__} as a {kind}: pass an instance")
            if not isinstance(component, interface):
                raise PluginError(
                    f"{source} registered {component!r} as a {kind}, but it does not subclass {interface.__name__}"
                )
            name = getattr(component, "name", "")
            if not isinstance(name, str) or not name:
                raise PluginError(f"{source} registered a {kind} without a name: {type(component).__qualname__}")
            options = getattr(component, "options", None)
            if not (isinstance(options, type) and issubclass(options, BaseModel)) or (
                options.model_config.get("extra") != "forbid"
            ):
                raise PluginError(
                    f"{source} registered {kind} {name!r} whose options are not a strict pydantic model "
                    "(extra='forbid': subclass StrictModel)"
                )
            existing = self._by_kind[kind].get(name)
            if existing is not None:
                raise PluginError(f"duplicate {kind} name {name!r}: registered by {existing.source} and by {source}")
            self._by_kind[kind][name] = Registration(kind, name, component, source)

        return register

    def registrations(self, kind: str | None = None) -> list[Registration]:
        kinds = [kind] if kind else list(CATEGORIES)
        return [reg for k in kinds for reg in sorted(self._by_kind[k].values(), key=lambda r: r.name)]

    def names(self, kind: str) -> list[str]:
        return sorted(self._by_kind[kind])

    def get(self, kind: str, name: str) -> Component:
        try:
            return self._by_kind[kind][name].component
        except KeyError:
            available = ", ".join(self.names(kind)) or "none"
            hint = _left_out_hint(name) or did_you_mean(name, self.names(kind))
            raise UnknownComponentError(f"unknown {kind} {name!r}{hint}; available: {available}") from None



def _left_out_hint(name: str) -> str:
    """`` (installed plugin 'claude-code' is not loaded: ...)`` when ``name`` is the name of an installed plugin that
    ``POLAR_LOAD_PLUGINS`` leaves out (its components are usually named after it)."""
    allowed = allowed_entry_points()
    if allowed is None:
        return ""
    for ep in installed_entry_points():
        if ep.name not in allowed and folded(ep.name) == folded(name):
            return f" (installed plugin {ep.name!r} is not loaded: add it to ${LOAD_ENV})"
    return ""


_lock = threading.Lock()
_cached_pm: tuple[str | None, pluggy.PluginManager, dict[str, PluginSource]] | None = None
_cached_registry: tuple[str | None, Registry] | None = None


def _manager() -> tuple[pluggy.PluginManager, dict[str, PluginSource]]:
    global _cached_pm
    key = os.environ.get(LOAD_ENV)
    if _cached_pm is None or _cached_pm[0] != key:
        _cached_pm = (key, *create_plugin_manager())
    return _cached_pm[1], _cached_pm[2]


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, rebuilt when ``POLAR_LOAD_PLUGINS`` changes."""
    with _lock:
        return _manager()[0]


def get_registry() -> Registry:
    """The process-wide, validated component registry."""
    global _cached_registry
    key = os.environ.get(LOAD_ENV)
    with _lock:
        if _cached_registry is None or _cached_registry[0] != key:
            _cached_registry = (key, Registry(*_manager()))
        return _cached_registry[1]


def reset_registry() -> None:
    """Forget the cached manager and registry (tests, or after installing a plugin)."""
    global _cached_pm, _cached_registry
    with _lock:
        _cached_pm = None
        _cached_registry = None


def _get(kind: str, name: str, interface: type[C]) -> C:
    component = get_registry().get(kind, name)
    assert isinstance(component, interface)
    return component


def get_harness(name: str) -> Harness:
    return _get("harness", name, Harness)


def get_runtime(name: str) -> Runtime:
    return _get("runtime", name, Runtime)


def get_builder(name: str) -> Builder:
    return _get("builder", name, Builder)


def get_evaluator(name: str) -> Evaluator:
    return _get("evaluator", name, Evaluator)


def get_dataset(name: str) -> Dataset:
    return _get("dataset", name, Dataset)


def get_backend(name: str) -> InferenceBackend:
    return _get("backend", name, InferenceBackend)
