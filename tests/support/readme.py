"""README.md's code blocks, so that tests run them as written (and break when the README changes)."""

from __future__ import annotations

import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(heading: str, language: str, index: int = 0) -> str:
    """The ``index``-th fenced ``language`` block of the README section whose ``## `` heading starts with
    ``heading`` (the section ends at the next ``## `` heading)."""
    text = README.read_text()
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks = section.split(f"```{language}\n")[1:]
    if len(blocks) <= index:
        raise AssertionError(f"README.md section {heading!r} has no {language} block #{index}")
    return blocks[index][: blocks[index].index("```")]


def polar_commands(block: str) -> list[list[str]]:
    """The ``polar ...`` lines of a shell block, split as the shell would, comments dropped."""
    return [shlex.split(line.split("#")[0]) for line in block.strip().splitlines() if line.startswith("polar ")]
