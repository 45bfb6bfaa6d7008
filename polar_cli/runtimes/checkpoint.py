"""What changed in a sandbox since its checkpoint: host dirs (walked), a container's processes and its rootfs
(``docker container diff``), as lists a restore acts on.

A restore removes what was added and fails on what was changed or deleted: a file that existed at the checkpoint
cannot be put back, so its sandbox is destroyed instead (``RuntimeHandle.restore``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polar_cli.runtimes.files import under

Stat = tuple[bool, int, int, int]  # (is a dir, size, mtime_ns, mode)
SHOWN = 5  # paths named in an error

# `sh -c PIDS_SCRIPT`: the pids now running in a container
PIDS_SCRIPT = 'for p in /proc/[0-9]*; do echo "${p#/proc/}"; done'
# `sh -c KILL_NEW_SCRIPT`, stdin the pids to keep: SIGKILL every other live process (zombies aside) until none is
# left (rounds against forks); prints those that would not die
KILL_NEW_SCRIPT = r"""keep=" $(tr '\n' ' ') $$ "
for round in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  left=""
  for p in /proc/[0-9]*; do p=${p#/proc/}; case "$keep" in *" $p "*) continue;; esac
    read -r s 2>/dev/null <"/proc/$p/stat" || continue; s=${s##*) }; [ "${s%% *}" = Z ] && continue
    kill -9 "$p" 2>/dev/null; left="$left $p"
  done
  [ -z "$left" ] && exit 0
  sleep 0.05
done
echo $left"""
ROOTFS_MARKER = "/tmp/.polar-checkpoint"
# `sh -c APPLY_SCRIPT`, stdin lines "R path" (remove), "C path" (must be a dir), "N path" (a dir, or not newer than
# the marker): prints what it could not accept, exits 1 then
APPLY_SCRIPT = f"""m={ROOTFS_MARKER}; bad=0
[ -e "$m" ] || {{ echo "the checkpoint marker $m is gone"; exit 1; }}
while IFS= read -r line; do op=${{line%% *}}; p=${{line#* }}
  case $op in
    R) rm -rf -- "$p" || {{ echo "cannot remove $p"; bad=1; }} ;;
    C) {{ [ -d "$p" ] && [ ! -L "$p" ]; }} || {{ echo "changed: $p"; bad=1; }} ;;
    N) [ -d "$p" ] || [ ! "$p" -nt "$m" ] || {{ echo "changed: $p"; bad=1; }} ;;
  esac
done
exit $bad"""


def shown(paths: Sequence[str]) -> str:
    more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
    return ", ".join(paths[:SHOWN]) + more


def topmost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another one of them (removing the parent removes them)."""
    result: list[str] = []
    for path in sorted(set(paths)):
        if not any(under(path, kept) is not None for kept in result):
            result.append(path)
    return result


def kept(path: str, keep: Sequence[str]) -> bool:
    return any(under(path, k) is not None for k in keep)


@dataclass(frozen=True)
class Changes:
    added: list[str] = field(default_factory=list)
    """Top-most paths that did not exist at the checkpoint (to remove)."""
    changed: list[str] = field(default_factory=list)
    """Paths that existed and were modified, replaced or deleted (a restore cannot undo these)."""


@dataclass(frozen=True)
class DirSnapshot:
    """Every entry under some host dirs at a checkpoint (``keep`` and what is under it left out)."""

    roots: tuple[Path, ...]
    keep: tuple[str, ...]
    entries: Mapping[str, Stat]

    @classmethod
    def take(cls, roots: Sequence[Path], keep: Sequence[Path] = ()) -> DirSnapshot:
        kept_paths = tuple(str(k) for k in keep)
        return cls(tuple(roots), kept_paths, _walk(roots, kept_paths))

    def changes(self) -> Changes:
        now = _walk(self.roots, self.keep)
        added = topmost(p for p in now if p not in self.entries)
        changed = []
        for path, (is_dir, size, mtime, mode) in self.entries.items():
            current = now.get(path)
            if current is None or current[0] != is_dir or current[3] != mode or (
                    not is_dir and current[1:3] != (size, mtime)):  # fmt: skip
                changed.append(path)
        return Changes(added, sorted(changed))


def _walk(roots: Sequence[Path], keep: Sequence[str]) -> dict[str, Stat]:
    entries: dict[str, Stat] = {}
    for root in roots:
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(root)  # the root's own mode counts too (a chmod of the home dir is a change)
            entries[str(root)] = (True, 0, 0, st.st_mode)
        for parent, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not kept(os.path.join(parent, d), keep)]
            for name in (*dirs, *files):
                path = os.path.join(parent, name)
                if kept(path, keep):
                    continue
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                is_dir = os.path.isdir(path) and not os.path.islink(path)
                entries[path] = (is_dir, st.st_size, st.st_mtime_ns, st.st_mode)
    return entries


def rootfs_plan(
    baseline: Mapping[str, int], current: Mapping[str, int], keep: Sequence[str]
) -> tuple[list[str], list[str]]:
    """From two ``container diff`` maps (path -> 0 modified, 1 added, 2 deleted): the APPLY_SCRIPT lines, and the
    paths changed beyond repair (deleted since the checkpoint, or a checkpoint entry no longer in the diff)."""
    keep = [*keep, "/polar", ROOTFS_MARKER]
    lines: list[str] = []
    broken: list[str] = []
    added = []
    for path, kind in current.items():
        if kept(path, keep):
            continue
        if "\n" in path:
            broken.append(repr(path))
        elif path not in baseline:
            if kind == 1:
                added.append(path)
            elif kind == 0:
                lines.append(f"C {path}")
            else:
                broken.append(path)
        elif baseline[path] != kind:
            broken.append(path)
        elif kind != 2:
            lines.append(f"N {path}")
    for path in baseline:
        if path not in current and not kept(path, keep):
            broken.append(path)
    return [f"R {p}" for p in topmost(added)] + lines, sorted(broken)
