"""Layering rule: outside ``polar_cli/proxy`` the proxy is imported only as ``polar_cli.proxy``, and only the names in
its ``__all__`` (checked with :mod:`tests.test_layering`'s import walk)."""

from __future__ import annotations

from pathlib import Path

import pytest

import polar_cli.proxy
from tests.test_layering import REPO, Import, package_imports, within

PROXY = "polar_cli.proxy"


def reaches_inside(found: Import) -> bool:
    """Whether ``found`` binds something of the proxy other than the package or a name of its ``__all__``."""
    if not within(found.target, PROXY) or found.target == PROXY:
        return False
    return found.target.removeprefix(PROXY + ".") not in polar_cli.proxy.__all__


def test_no_module_outside_the_proxy_imports_its_internals() -> None:
    proxy_dir = REPO / "polar_cli" / "proxy"
    found = package_imports(REPO / "polar_cli") + package_imports(REPO / "bench")
    outside = [f for f in found if not (REPO / f.where.partition(":")[0]).is_relative_to(proxy_dir)]
    assert any(f.where.startswith("polar_cli/gateway/node.py") for f in outside)
    assert [f"{f.where} imports {f.target}" for f in outside if reaches_inside(f)] == []


def test_everything_the_proxy_declares_public_exists() -> None:
    assert [name for name in polar_cli.proxy.__all__ if not hasattr(polar_cli.proxy, name)] == []


@pytest.mark.parametrize(
    ("source", "inside"),
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
def test_the_rule_sees_every_form_of_import(tmp_path: Path, source: str, inside: bool) -> None:
    module = tmp_path / "polar_cli" / "gateway" / "example.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    found = [f.target for f in package_imports(tmp_path / "polar_cli") if reaches_inside(f)]
    assert bool(found) is inside, found
