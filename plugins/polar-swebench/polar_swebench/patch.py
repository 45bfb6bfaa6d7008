"""The agent's patch: taken from its runtime as a git diff, cleaned of harness droppings, applied in a fresh runtime.

A diff is split into its per-file sections (``diff --git a/P b/P``); a section is dropped when either of its paths
matches an exclude pattern: ``name/`` drops a directory of that name at any depth, anything else is a glob matched
against the file's base name (``*.pyc``) and against its whole path.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

# `git add -A` so new files are in the diff; from the instance's base commit when known, so commits the agent made
# are in it too.
DEFAULT_PATCH_COMMAND = 'git add -A >/dev/null && git diff --cached --binary "${POLAR_BASE_COMMIT:-HEAD}"'
DEFAULT_EXCLUDE = (
    ".claude/", ".codex/", ".gemini/", ".qwen/", ".pi/", ".opencode/", "node_modules/", "__pycache__/", "*.pyc",
    ".pytest_cache/", ".venv/", ".cache/", ".grok/",
)  # fmt: skip
GIT_APPLY = ["git", "apply", "--verbose", "--whitespace=nowarn", "-"]
PATCH_FALLBACK = ["patch", "--batch", "--forward", "--fuzz=5", "-p1"]

_HEADER = re.compile(r"^diff --git (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class FileDiff:
    paths: tuple[str, ...]
    text: str


def _header_paths(rest: str) -> tuple[str, ...]:
    """The a/ and b/ paths of a ``diff --git`` header (quoted when they hold odd characters)."""
    if rest.startswith('"') or '"' in rest:
        try:
            parts = shlex.split(rest)
        except ValueError:
            parts = rest.split()
    else:
        half = len(rest) // 2  # "a/P b/P" with the same P: split in the middle when both halves agree
        parts = [rest[:half], rest[half + 1 :]] if rest[:half][2:] == rest[half + 1 :][2:] else rest.split()
    return tuple(p[2:] if p[:2] in ("a/", "b/") else p for p in parts)


def split_diff(diff: str) -> tuple[str, list[FileDiff]]:
    """The text before the first file section, and the file sections in order."""
    starts = [m.start() for m in _HEADER.finditer(diff)]
    if not starts:
        return diff, []
    preamble = diff[: starts[0]]
    files = []
    for begin, end in zip(starts, [*starts[1:], len(diff)], strict=True):
        section = diff[begin:end]
        header = section.split("\n", 1)[0][len("diff --git ") :]
        files.append(FileDiff(_header_paths(header), section))
    return preamble, files


def excluded(path: str, patterns: Iterable[str]) -> bool:
    parts = path.split("/")
    for pattern in patterns:
        if pattern.endswith("/"):
            name = pattern.rstrip("/")
            if any(fnmatch.fnmatchcase(part, name) for part in parts[:-1]):
                return True
        elif fnmatch.fnmatchcase(parts[-1], pattern) or fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def filter_patch(diff: str, exclude: Iterable[str] = DEFAULT_EXCLUDE) -> tuple[str, list[str]]:
    """``diff`` without the sections of excluded paths, and the paths dropped."""
    patterns = list(exclude)
    preamble, files = split_diff(diff)
    kept, dropped = [], []
    for section in files:
        if any(excluded(path, patterns) for path in section.paths):
            dropped.append(section.paths[-1])
        else:
            kept.append(section.text)
    return (preamble + "".join(kept) if kept else ""), dropped


def changed_paths(diff: str) -> list[str]:
    return [section.paths[-1] for section in split_diff(diff)[1]]
