"""Layering rules, checked with ``ast`` over the source: who may import whom.

One test per rule. A new rule is a new test over :func:`package_imports` (every import a package's modules make,
type-checking-only and function-level ones included, each as the dotted name it binds) and :func:`within`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PLUGIN_PACKAGES = sorted(path for path in REPO.glob("plugins/polar-*/polar_*") if path.is_dir())
"""The import packages of the plugin distributions in this repository (their tests are beside them, not inside)."""


class Import(NamedTuple):
    where: str
    """``path:line`` of the statement."""
    target: str
    """The dotted name the statement binds: ``from polar_cli.api import Harness`` -> ``polar_cli.api.Harness``."""


def imports(path: Path, package: str) -> list[Import]:
    """Every import in the module at ``path`` (in ``package``, which resolves its relative imports)."""
    found = []
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(f"{shown}:{node.lineno}", alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            found += [Import(f"{shown}:{node.lineno}", f"{base}.{alias.name}") for alias in node.names]
    return found


def package_imports(package_dir: Path) -> list[Import]:
    """Every import made by the modules of the package at ``package_dir`` (its subpackages included)."""
    root = package_dir.parent
    return [
        found
        for path in sorted(package_dir.rglob("*.py"))
        for found in imports(path, ".".join(path.parent.relative_to(root).parts))
    ]


def within(target: str, module: str) -> bool:
    """Whether ``target`` is ``module`` or something inside it."""
    return target == module or target.startswith(module + ".")


def test_imports_resolve_every_form(tmp_path: Path) -> None:
    module = tmp_path / "pkg" / "sub" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "import a.b\nfrom c import d\nfrom . import e\nfrom ..f import g\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from h import i\n\ndef later():\n    import j\n"
    )
    targets = [found.target for found in package_imports(tmp_path / "pkg")]
    assert targets == ["a.b", "c.d", "pkg.sub.e", "pkg.f.g", "typing.TYPE_CHECKING", "h.i", "j"]


def test_plugin_packages_import_only_polar_cli_api() -> None:
    assert [path.name for path in PLUGIN_PACKAGES] == [
        "polar_aider",
        "polar_claude_code",
        "polar_codex",
        "polar_mini_swe_agent",
        "polar_swebench",
    ]
    outside = [
        f"{found.where} imports {found.target}"
        for package in PLUGIN_PACKAGES
        for found in package_imports(package)
        if within(found.target, "polar_cli") and not within(found.target, "polar_cli.api")
    ]
    assert outside == [], "a plugin package imports polar_cli.api only"


def test_server_and_gateway_import_nothing_from_each_other() -> None:
    """They speak through ``polar_cli.node_protocol``; what starts both (``polar_cli.launch``) lives outside both."""
    crossing = [
        f"{found.where} imports {found.target}"
        for package, other in (("server", "gateway"), ("gateway", "server"))
        for found in package_imports(REPO / "polar_cli" / package)
        if within(found.target, f"polar_cli.{other}")
    ]
    assert crossing == [], "polar_cli.server and polar_cli.gateway import nothing from each other"


def test_the_node_protocol_imports_neither_side() -> None:
    crossing = [
        f"{found.where} imports {found.target}"
        for found in package_imports(REPO / "polar_cli" / "node_protocol")
        if within(found.target, "polar_cli.server") or within(found.target, "polar_cli.gateway")
    ]
    assert crossing == [], "polar_cli.node_protocol is shared by both sides: it imports neither"


def test_only_the_verl_loop_imports_verl_and_ray() -> None:
    """veRL is imported by ``polar_cli.trainers.verl_loop`` alone, which nothing in ``polar_cli`` imports: a Polar
    install without veRL imports everything else. Ray is imported by that loop and by ``polar_cli.ray`` (the gateways
    as Ray actors), which nothing in ``polar_cli`` imports either."""
    loop = REPO / "polar_cli" / "trainers" / "verl_loop.py"
    found = package_imports(REPO / "polar_cli")
    outside = [
        f"{imp.where} imports {imp.target}"
        for imp in found
        if within(imp.target, "verl") and not imp.where.startswith("polar_cli/trainers/verl_loop.py:")
    ]
    assert outside == [], "only polar_cli/trainers/verl_loop.py imports verl"
    importers = [f"{imp.where}" for imp in found if within(imp.target, "polar_cli.trainers.verl_loop")]
    assert importers == [], "nothing in polar_cli imports polar_cli.trainers.verl_loop"
    assert any(within(imp.target, "verl") for imp in imports(loop, "polar_cli.trainers"))


def test_only_polar_cli_ray_and_the_verl_loop_import_ray() -> None:
    """``polar_cli.ray`` imports Ray only when called (``polar_cli.extras.require``), so a Polar install without
    Ray imports it too; nothing else in ``polar_cli`` imports Ray or ``polar_cli.ray``."""
    found = package_imports(REPO / "polar_cli")
    allowed = ("polar_cli/ray.py:", "polar_cli/trainers/verl_loop.py:")
    outside = [
        f"{imp.where} imports {imp.target}"
        for imp in found
        if within(imp.target, "ray") and not imp.where.startswith(allowed)
    ]
    assert outside == [], "only polar_cli/ray.py and polar_cli/trainers/verl_loop.py import ray"
    importers = [imp.where for imp in found if within(imp.target, "polar_cli.ray")]
    assert importers == [], "nothing in polar_cli imports polar_cli.ray"
    source = (REPO / "polar_cli" / "ray.py").read_text()
    assert 'require("ray"' in source and not any(
        within(imp.target, "ray") for imp in imports(REPO / "polar_cli" / "ray.py", "polar_cli")
    ), "polar_cli.ray imports Ray when called, never at import"
