"""A local SWE-style fixture: a tiny Python project in a git repo, its instance in SWE-bench format, candidate
patches made with git, and (for the Docker tests) an image holding the repo at /testbed.

No registry is reachable, so the image is made the way .ci/setup_docker.sh makes ``polar-test-base``: from this host's
own Debian packages. A container of ``polar-test-base`` (bash, coreutils, git) receives Debian's python3 and patch(1)
with the shared libraries they need, the host's pure-Python pytest, and the repo; it is committed as
``polar-swebench-fixture:<content hash>`` and reused while its content is unchanged.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest

from polar_cli.registry import LOAD_ENV, reset_registry

BASE_IMAGE = os.environ.get("POLAR_TEST_IMAGE", "polar-test-base:latest")
FIXTURE_REPOSITORY = "polar-swebench-fixture"
INSTANCE_ID = "polar-fixtures__calc-1"
REPO = "polar-fixtures/calc"
DEBIAN_PACKAGES = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "python3-minimal", "patch")
PYTEST_MODULES = ("pytest", "_pytest", "py", "pluggy", "iniconfig", "packaging", "pygments")
SKIP_PREFIXES = ("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale", "/usr/share/lintian")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "polar", "GIT_COMMITTER_EMAIL": "polar@example.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}  # fmt: skip

CALC = '''"""A tiny calculator with a bug in add."""


def add(a, b):
    return a - b


def sub(a, b):
    return a - b
'''
TESTS = """from calc import add, sub


def test_sub():
    assert sub(5, 3) == 2


def test_sub_negative():
    assert sub(1, 3) == -2
"""
NEW_TEST = """

def test_add():
    assert add(2, 3) == 5
    assert add(-1, 1) == 0
"""
EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
cd /testbed
git checkout {base} -- tests/test_calc.py
git apply -v - <<'EOF_POLAR_TEST_PATCH'
{test_patch}
EOF_POLAR_TEST_PATCH
: '>>>>> Start Test Output'
python3 -m pytest -rA -p no:cacheprovider tests/test_calc.py
: '>>>>> End Test Output'
git checkout {base} -- tests/test_calc.py
"""


PYTEST_SAMPLE = '''
import pytest


@pytest.fixture
def broken():
    raise RuntimeError("fixture setup fails")


def test_passes():
    assert True


def test_fails():
    assert 1 == 2


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known bug", strict=True)
def test_xfails():
    assert False


def test_errors(broken):
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n
'''


@pytest.fixture(scope="session")
def sample_tests() -> str:
    """A test module whose tests pass, fail, error, skip, xfail and are parametrized (run by pytest for real)."""
    return PYTEST_SAMPLE


@pytest.fixture(autouse=True)
def _swebench_loaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This package's components are registered (and no other installed plugin)."""
    monkeypatch.setenv(LOAD_ENV, "swebench")
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def pi_edit_script() -> list[dict[str, Any]]:
    """The scripted model: one call of pi's own ``edit`` tool on a path relative to where pi starts, then an answer."""
    edit = {"path": "calc/__init__.py",
            "edits": [{"oldText": "def add(a, b):\n    return a - b", "newText": "def add(a, b):\n    return a + b"}]}
    call = {"id": "call_edit_1", "type": "function", "function": {"name": "edit", "arguments": json.dumps(edit)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "assistant", "content": "add now adds: calc/__init__.py is fixed."},
    ]  # fmt: skip


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout


def diff_of(repo: Path, edits: dict[str, str]) -> str:
    """The patch ``edits`` (path -> new content) make to the base commit, made by git; the repo is reset after."""
    for path, content in edits.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(content)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--binary")
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    return patch


@dataclass(frozen=True)
class SweFixture:
    repo: Path
    base_commit: str
    instance: dict[str, Any]
    patches: dict[str, str]


@pytest.fixture(scope="session")
def swe_fixture(tmp_path_factory: pytest.TempPathFactory) -> SweFixture:
    repo = tmp_path_factory.mktemp("swe") / "testbed"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    fixed = CALC.replace("def add(a, b):\n    return a - b", "def add(a, b):\n    return a + b")
    test_patch = diff_of(repo, {"tests/test_calc.py": TESTS + NEW_TEST})
    patches = {
        "gold": diff_of(repo, {"calc/__init__.py": fixed}),
        "wrong": diff_of(repo, {"calc/__init__.py": CALC.replace("return a - b\n\n\ndef sub",
                                                                "return a * b\n\n\ndef sub")}),
        "breaks_p2p": diff_of(repo, {"calc/__init__.py": fixed.replace("def sub(a, b):\n    return a - b",
                                                                       "def sub(a, b):\n    return b - a")}),
    }  # fmt: skip
    # removes a line the file does not have: neither git apply nor patch's fuzz can place it
    patches["stale"] = patches["gold"].replace("-    return a - b", "-    return a // b", 1)
    instance = {
        "instance_id": INSTANCE_ID,
        "repo": REPO,
        "base_commit": base,
        "version": "0.1",
        "problem_statement": "calc.add(2, 3) returns -1: add subtracts instead of adding.",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "patch": patches["gold"],
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_sub", "tests/test_calc.py::test_sub_negative"]),
        "eval_script": EVAL_SCRIPT.format(base=base, test_patch=test_patch.rstrip("\n")),
        "log_parser": "parse_log_pytest",
    }
    return SweFixture(repo, base, instance, patches)


def _dpkg_files(package: str) -> list[str]:
    done = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"Debian package {package} is not installed here (the fixture image copies it from the host)")
    return [f for f in done.stdout.splitlines() if f and not f.startswith(SKIP_PREFIXES) and "__pycache__" not in f]


def _libraries(binaries: list[str]) -> set[str]:
    done = subprocess.run(["ldd", *binaries], capture_output=True, text=True)
    found = set()
    for line in done.stdout.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            found.add(parts[1].split()[0])
    return found


def _arcname(path: str) -> str:
    """The path with its folder resolved (usrmerge: /lib is /usr/lib in the image too), relative to /."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)).lstrip("/")


PYTEST_LAUNCHER = b'#!/bin/sh\nexec python3 -m pytest "$@"\n'  # pytest's console script, as pip would install it


def _python_layer() -> bytes:
    """Debian's python3 and patch(1), their libraries, and the host's pure-Python pytest (with its ``pytest`` command,
    which SWE-Gym's and SWE-bench's eval scripts call), as a tar of /."""
    files = {f for package in DEBIAN_PACKAGES for f in _dpkg_files(package) if os.path.isfile(f) or os.path.islink(f)}
    elves = [f for f in files if os.path.isfile(f) and not os.path.islink(f) and (f.endswith(".so") or "/bin/" in f)]
    libraries = _libraries(elves)
    files |= libraries | {os.path.realpath(lib) for lib in libraries}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(files):
            tar.add(path, arcname=_arcname(path), recursive=False)
        distributions = packages_distributions()
        for module in PYTEST_MODULES:
            source = Path(__import__(module).__file__ or "")
            if source.name == "__init__.py":
                source = source.parent
            # the dist-info too: pytest and pluggy read their own versions from it
            names = {re.sub(r"[-_.]+", "_", d).lower() + "-" for d in distributions.get(module, [])}
            infos = [i for i in source.parent.glob("*.dist-info") if i.name.lower().startswith(tuple(names))]
            for path in [source, *infos] if names else [source]:
                tar.add(path, arcname=f"usr/lib/python3/dist-packages/{path.name}",
                        filter=lambda info: None if "__pycache__" in info.name else info)  # fmt: skip
        launcher = tarfile.TarInfo("usr/local/bin/pytest")
        launcher.size, launcher.mode = len(PYTEST_LAUNCHER), 0o755
        tar.addfile(launcher, io.BytesIO(PYTEST_LAUNCHER))
    return buffer.getvalue()


def _repo_layer(repo: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(repo, arcname="testbed")
    return buffer.getvalue()


def _resolved_by_polar_run(data: dict[str, Any], folder: Path) -> Any:
    """``polar run`` of the task ``data`` (a subprocess); its one SessionResult, checked completed, reward 1.0 on every
    trace, the fixture's FAIL_TO_PASS test passing after the patch applied."""
    from polar_cli.harnesses.testing import polar_run_file

    task_file = folder / "task.json"
    task_file.write_text(json.dumps(data))
    (report,) = polar_run_file(task_file, folder)
    result = report.result
    assert result is not None and report.exit_code == 0, report.describe()
    assert (result.status, result.reward) == ("completed", 1.0), report.describe()
    evaluation = result.metadata["evaluation"]
    assert evaluation["resolved"] is True and evaluation["patch_applied"] is True
    assert evaluation["tests"]["FAIL_TO_PASS"] == {"tests/test_calc.py::test_add": "PASSED"}
    assert result.trajectory.traces and all(t.reward == 1.0 for t in result.trajectory.traces)
    return result


@pytest.fixture
def resolved_by_polar_run() -> Callable[[dict[str, Any], Path], Any]:
    """``resolved_by_polar_run(task_data, folder)``: the SessionResult of ``polar run``, checked graded resolved."""
    return _resolved_by_polar_run


@pytest.fixture
def need_cli() -> Callable[[str], None]:
    """``need_cli(name)``: skip unless harness ``name``'s CLI is installed; under CI fail instead (a test that always
    skips is a hole)."""
    from polar_cli.harnesses.testing import in_ci, missing_cli_reason
    from polar_cli.registry import get_harness

    def need(name: str) -> None:
        reason = missing_cli_reason(get_harness(name))
        if reason:
            if in_ci():
                pytest.fail(reason)
            pytest.skip(reason)

    return need


def docker_or_skip() -> Any:
    from polar_cli.runtimes.docker import docker_client

    try:
        client = docker_client()
        client.images.get(BASE_IMAGE)
    except Exception as exc:
        reason = f"no Docker Engine with {BASE_IMAGE} ({exc}); run .ci/setup_docker.sh"
        if os.environ.get("CI", "") not in ("", "0", "false"):
            pytest.fail(reason)
        pytest.skip(reason)
    return client


@pytest.fixture(scope="session")
def swe_image(swe_fixture: SweFixture) -> Iterator[str]:
    """The fixture instance's image (built once per content, kept like polar-test-base)."""
    client = docker_or_skip()
    try:
        layers = [_python_layer(), _repo_layer(swe_fixture.repo)]
        digest = hashlib.sha256(b"".join(hashlib.sha256(layer).digest() for layer in layers))
        digest.update(client.images.get(BASE_IMAGE).id.encode())
        tag = f"{FIXTURE_REPOSITORY}:{digest.hexdigest()[:16]}"
        try:
            client.images.get(tag)
        except Exception:
            container = client.containers.create(BASE_IMAGE, command=["true"])
            try:
                for layer in layers:
                    container.put_archive("/", layer)
                container.commit(repository=FIXTURE_REPOSITORY, tag=tag.split(":")[1],
                                 changes=['CMD ["/bin/bash"]'])  # fmt: skip
            finally:
                container.remove(force=True)
        yield tag
    finally:
        client.close()

