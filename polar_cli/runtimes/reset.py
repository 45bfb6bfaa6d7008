"""The verified reset of a used sandbox (``runtime.reuse: reset``): back to the state it had after prepare.

:func:`checkpoint_sandbox` runs once, after prepare and before the sandbox's first session: it brings the git
repository of ``runtime.reset.git`` (if any) to ``base`` and records its fingerprint, then asks the runtime to
record everything else (``RuntimeHandle.checkpoint``). :func:`reset_sandbox` runs after each session:

1. the runtime kills every process started since the checkpoint and removes every file added since outside the
   repository, failing on a file that was changed or deleted (``RuntimeHandle.restore``);
2. the repository: its refs put back as they were, ``git checkout -f`` of the checkpoint's HEAD, ``git reset
   --hard <base>``, ``git clean -ffdx``, reflogs expired and unreachable objects pruned (another session's commits
   must not be found by the next one);
3. the repository's fingerprint (HEAD, refs, ``git status --ignored``, loose/packed object counts, config, hooks and
   info files) must equal the checkpoint's;
4. ``runtime.reset.check``, the sandbox's own verification, must exit 0.

Any failure raises RuntimeFailure: the caller destroys the sandbox.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from dataclasses import dataclass

from polar_cli.errors import ConfigError, RuntimeFailure
from polar_cli.interfaces.runtime import ExecResult, Runtime, RuntimeHandle
from polar_cli.models.task import RuntimeSpec

GIT_STATE = """cd "$1" || exit 1
echo "$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)"
git rev-parse --verify "$2^{commit}"
"""
# `sh -c GIT_RESET polar-reset PATH HEAD BASE LOOSE`, stdin one `update REF SHA` line per ref of the
# checkpoint: the other refs deleted, these put back, the work tree reset and cleaned, reflogs expired, unreachable
# objects pruned when the loose object count moved; then the fingerprint (one exec: a reset's execs are its cost)
GIT_RESET = """cd "$1" || exit 1
g=$(git rev-parse --git-dir) || exit 1
rm -rf "$g/rebase-merge" "$g/rebase-apply" "$g/sequencer" "$g/MERGE_HEAD" "$g/CHERRY_PICK_HEAD" "$g/REVERT_HEAD" \
  "$g/FETCH_HEAD" "$g/BISECT_LOG" "$g/index.lock"
want=$(cat)
{ git for-each-ref --format='%(refname)' | while IFS= read -r ref; do
    case "$want" in *"update $ref "*) ;; *) echo "delete $ref" ;; esac
  done
  [ -z "$want" ] || printf '%s\n' "$want"
} | git update-ref --stdin || exit 1
git checkout -q -f "$2" || exit 1
git reset -q --hard "$3" || exit 1
rm -f "$g/ORIG_HEAD"
git clean -ffdxq || exit 1
git reflog expire --expire=now --all || exit 1
[ "$(git count-objects | cut -d' ' -f1)" = "$4" ] || git prune --expire=now || exit 1
"""
GIT_FINGERPRINT = """cd "$1" || exit 1
g=$(git rev-parse --git-dir) || exit 1
git for-each-ref --format='ref %(refname) %(objectname)' || exit 1
echo "head $(git symbolic-ref -q HEAD || git rev-parse HEAD)"
git status --porcelain --ignored --untracked-files=all | sed 's/^/status /'
git count-objects -v | grep -e '^count' -e '^in-pack' -e '^packs'
cksum "$g/config"
find "$g/hooks" "$g/info" -type f -exec cksum {} + 2>/dev/null | sort"""


@dataclass(frozen=True)
class GitCheckpoint:
    path: str
    head: str
    """What ``git checkout -f`` takes back to: the branch name, or the commit when HEAD was detached."""
    base: str
    """The commit the work tree is reset to."""
    fingerprint: str

    @property
    def refs(self) -> dict[str, str]:
        return _refs(self.fingerprint)

    @property
    def loose(self) -> str:
        return next(line.split()[1] for line in self.fingerprint.splitlines() if line.startswith("count:"))


@dataclass(frozen=True)
class Checkpoint:
    """What a sandbox is reset to."""

    git: GitCheckpoint | None = None


def _refs(fingerprint: str) -> dict[str, str]:
    refs = {}
    for line in fingerprint.splitlines():
        if line.startswith("ref "):
            _, name, sha = line.split(" ", 2)
            refs[name] = sha
    return refs


async def _sh(handle: RuntimeHandle, script: str, args: list[str], what: str, stdin: str | None = None) -> ExecResult:
    result = await handle.exec(["/bin/sh", "-c", script, "polar-reset", *args], timeout=300,
                               stdin=stdin.encode() if stdin is not None else None)  # fmt: skip
    if not result.ok:
        reason = (result.stderr or result.stdout).strip()[-500:] or f"exit {result.exit_code}"
        raise RuntimeFailure(f"{what} failed: {reason}")
    return result


async def _git_reset(handle: RuntimeHandle, path: str, head: str, base: str, loose: str, refs: dict[str, str]) -> str:
    """Reset the repository at ``path`` (``refs`` as they must be); its fingerprint after."""
    batch = "".join(f"update {name} {sha}\n" for name, sha in refs.items())
    script = f"(\n{GIT_RESET}) || exit 1\n{GIT_FINGERPRINT}"  # the reset in a subshell: both cd from the same place
    result = await _sh(handle, script, [path, head, base, loose], f"git reset of {path}", batch)
    return result.stdout


def check_reuse(runtime: Runtime, spec: RuntimeSpec) -> None:
    """ConfigError when ``reuse: reset`` asks a runtime that cannot restore a sandbox."""
    if spec.reuse == "reset" and not runtime.can_restore:
        raise ConfigError(f"runtime {runtime.name!r} cannot reset a sandbox: reuse 'reset' needs 'docker' or 'local'")


async def checkpoint_sandbox(handle: RuntimeHandle, spec: RuntimeSpec) -> Checkpoint:
    """Record the freshly prepared sandbox as the state :func:`reset_sandbox` returns to."""
    git = None
    if spec.reset.git:
        path = posixpath.normpath(posixpath.join(handle.session_path, spec.reset.git))  # relative: to the session dir
        state = await _sh(handle, GIT_STATE, [path, spec.reset.base or "HEAD"], f"git repository {path}")
        head, base = state.stdout.split()
        first = await _sh(handle, GIT_FINGERPRINT, [path], f"git status of {path}")
        fingerprint = await _git_reset(handle, path, head, base, "", _refs(first.stdout))  # "": prune now
        git = GitCheckpoint(path, head, base, fingerprint)
    await handle.checkpoint([git.path] if git else [])
    return Checkpoint(git)


async def reset_sandbox(handle: RuntimeHandle, spec: RuntimeSpec, checkpoint: Checkpoint) -> None:
    """Bring a used sandbox back to ``checkpoint`` and verify it; RuntimeFailure when it cannot be."""
    try:
        async with asyncio.timeout(spec.reset.timeout_seconds):
            await handle.restore()
            git = checkpoint.git
            if git is not None:
                now = await _git_reset(handle, git.path, git.head, git.base, git.loose, git.refs)
                if now != git.fingerprint:
                    raise RuntimeFailure(
                        f"git repository {git.path} differs from its checkpoint: {_first_diff(git.fingerprint, now)}"
                    )
            if spec.reset.check:
                cwd = git.path if git is not None else None
                result = await handle.exec(
                    ["/bin/sh", "-c", spec.reset.check], cwd=cwd, timeout=spec.reset.timeout_seconds
                )
                if not result.ok:
                    reason = (result.stderr or result.stdout).strip()[-500:] or f"exit {result.exit_code}"
                    raise RuntimeFailure(f"reset check {shlex.quote(spec.reset.check)} failed: {reason}")
    except TimeoutError:
        raise RuntimeFailure(f"the reset took longer than {spec.reset.timeout_seconds:g} s") from None


def _first_diff(before: str, after: str) -> str:
    old, new = before.splitlines(), after.splitlines()
    gone = [line for line in old if line not in new]
    added = [line for line in new if line not in old]
    return "; ".join([*(f"was {line!r}" for line in gone[:2]), *(f"now {line!r}" for line in added[:2])])
