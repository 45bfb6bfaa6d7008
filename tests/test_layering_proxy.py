"""Layering: outside ``polar_cli/proxy`` the proxy is imported only through ``polar_cli.proxy`` and its ``__all__``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import polar_cli.proxy

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "polar_cli"
PROXY = PACKAGE / "proxy"


def outside_modules() -> list[Path]:
    """Every module of the package outside ``polar_cli/proxy``, and the benchmarks."""
    package = [p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(PROXY)]
    return sorted(package + list((ROOT / "bench").rglob("*.py")))


def imports(source: str, module: str) -> Iterator[tuple[int, str, str | None]]:
    """``(line, imported module, name)`` for every import in ``source`` (in functions and TYPE_CHECKING blocks
    too), ``name`` None for ``import x``; relative imports are resolved against ``module`` (a dotted name whose
    last part is the module's own, ``__init__`` for a package)."""
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            imported = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, imported, alias.name


def proxy_internals(source: str, module: str) -> list[str]:
    """Each import in ``source`` that reaches past ``polar_cli.proxy``'s public surface, as ``line: what``."""
    public = set(polar_cli.proxy.__all__)
    found = []
    for line, imported, name in imports(source, module):
        if imported.startswith("polar_cli.proxy."):
            found.append(f"{line}: {imported}")
        elif imported == "polar_cli.proxy" and name is not None and name not in public:
            found.append(f"{line}: {name} from polar_cli.proxy (not in its __all__)")
    return found


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_no_module_outside_the_proxy_imports_its_internals() -> None:
    modules = outside_modules()
    assert len(modules) > 50 and PACKAGE / "gateway" / "node.py" in modules and not any(
        p.is_relative_to(PROXY) for p in modules
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in modules
        for line in proxy_internals(path.read_text(encoding="utf-8"), dotted(path))
    ]
    assert offenders == []


def test_everything_the_proxy_declares_public_exists() -> None:
    assert [name for name in polar_cli.proxy.__all__ if not hasattr(polar_cli.proxy, name)] == []


@pytest.mark.parametrize(
    ("source", "offending"),
    [
        ("from polar_cli.proxy.app import create_proxy_app\n", True),
        ("import polar_cli.proxy.state\n", True),
        ("def f():\n    from polar_cli.proxy.codecs import get_codec\n", True),
        ("if TYPE_CHECKING:\n    from polar_cli.proxy.streaming import pump\n", True),
        ("from polar_cli.proxy import MAX_JSON_DEPTH\n", True),
        ("from polar_cli.proxy import app\n", True),
        ("from ..proxy.journal import read_journal\n", True),
        ("from .. import proxy\n", False),
        ("from ..proxy import read_journal\n", False),
        ("from polar_cli.proxy import ProxyConfig, read_journal\n", False),
        ("from polar_cli import proxy\n", False),
        ("import polar_cli.proxy\n", False),
        ("from polar_cli.proxying import x\n", False),
    ],
)
def test_the_check_sees_every_form_of_import(source: str, offending: bool) -> None:
    found = proxy_internals(source, "polar_cli.gateway.example")
    assert bool(found) is offending, found
