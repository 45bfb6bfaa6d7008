"""The fenced code blocks of README.md and docs/*.md, with the marker each carries on the line before its fence:

- ``<!-- docs: tested by tests/path.py::test_name -->``: that test runs the block as written;
- ``<!-- docs: illustrative (why) -->``: the block shows a shape or needs what a test cannot have (a GPU server, the
  Hub); tests/test_docs.py still checks that its ``polar`` commands parse, its Python compiles and its imports resolve.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- docs: (tested by (?P<test>\S+)|illustrative(?P<why>.*?)) -->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    text: str
    marker: str | None
    """The whole marker comment before the fence, or None."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def tested_by(self) -> str | None:
        match = MARKER.match(self.marker or "")
        return match.group("test") if match else None

    @property
    def illustrative(self) -> bool:
        match = MARKER.match(self.marker or "")
        return bool(match and match.group("why") is not None)


def code_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        previous = lines[i - 1].strip() if i > 0 else ""
        marker = previous if previous.startswith("<!-- docs:") else None
        blocks.append(Block(path, i + 1, match.group(1), "\n".join(lines[i + 1 : end]) + "\n", marker))
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in DOCS for block in code_blocks(path)]


def parse(cli: Any, args: list[str]) -> Any:
    """Parse ``polar ARGS`` as the real CLI would, down to the leaf command, without running it: each group's
    subcommand is looked up by name, then the leaf parses its options and arguments (callbacks included). Returns
    the leaf's context (its ``params``: the parsed values)."""
    command, name, rest, ctx = cli, "polar", list(args), None
    while hasattr(command, "get_command") and rest and not rest[0].startswith("-"):
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"no command {rest[0]!r} under {name!r}"
        command, name, rest = sub, rest[0], rest[1:]
    return command.make_context(name, rest, parent=ctx)
