"""Install a real (tiny) distribution on a path: dist-info metadata + module, as pip would lay it out."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_plugin_dist(root: Path, *, package: str, version: str, entry_point: str, module: str, source: str) -> Path:
    """Write ``module.py`` and ``<package>-<version>.dist-info`` under ``root``; return ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    dist_info = root / f"{package.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    (dist_info / "entry_points.txt").write_text(f"[polar]\n{entry_point} = {module}\n")
    return root
