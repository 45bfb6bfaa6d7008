"""The docs as tests (as datasette does): every shell and Python block of README.md and docs/*.md either runs in a named
test or is marked illustrative (``tests/support/docs.py`` has the markers); and every block, illustrative or not, is
checked for what can rot without anyone running it: each ``polar`` command parses against the real CLI (its command
and every flag exist), each Python block compiles and its imports resolve, each YAML/TOML/JSON block parses."""

from __future__ import annotations

import ast
import json
import shlex
import tomllib
from typing import Any

import pytest
import typer
import yaml

from polar_cli.cli import build_app
from tests.support.docs import DOCS, ROOT, Block, all_blocks, parse

BLOCKS = all_blocks()
CODE = [b for b in BLOCKS if b.language in ("bash", "python")]


def ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


@pytest.mark.parametrize("block", CODE, ids=ids(CODE))
def test_every_code_block_is_tested_or_marked_illustrative(block: Block) -> None:
    assert block.tested_by or block.illustrative, (
        f"{block.where}: put '<!-- docs: tested by tests/FILE.py::TEST -->' or '<!-- docs: illustrative (why) -->' "
        "on the line before the fence"
    )
    if block.tested_by:
        file, _, name = block.tested_by.partition("::")
        assert name, f"{block.where}: name the test: {block.tested_by}"
        source = ROOT / file
        assert source.is_file(), f"{block.where}: no such test file {file}"
        assert f"def {name}(" in source.read_text(), f"{block.where}: {file} has no test {name}"


def polar_segments(block: Block) -> list[list[str]]:
    """Each ``polar ...`` command of a shell block (a line may chain commands with ``&&``), split as the shell
    would, comments dropped."""
    commands = []
    for line in block.text.replace("\\\n", " ").splitlines():
        for part in line.split("&&"):
            if part.strip().startswith("polar "):
                commands.append(shlex.split(part, comments=True)[1:])
    return commands


SHELL = [b for b in BLOCKS if b.language == "bash" and polar_segments(b)]


@pytest.fixture(scope="module")
def cli() -> Any:
    return typer.main.get_command(build_app())


@pytest.mark.parametrize("block", SHELL, ids=ids(SHELL))
def test_polar_commands_in_the_docs_parse(block: Block, cli: Any) -> None:
    for args in polar_segments(block):
        try:
            parse(cli, args)
        except typer.Exit:
            pass  # --version, --help: eager options that end the parse, as they should
        except Exception as exc:  # typer's vendored click raises its own UsageError, BadParameter, NoSuchOption...
            message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
            pytest.fail(f"{block.where}: polar {' '.join(args)}: {message}")


PYTHON = [b for b in BLOCKS if b.language == "python"]


@pytest.mark.parametrize("block", PYTHON, ids=ids(PYTHON))
def test_python_blocks_compile_and_import_what_exists(block: Block) -> None:
    tree = ast.parse(block.text, filename=block.where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            exec(compile(ast.Module(body=[node], type_ignores=[]), block.where, "exec"), {})


DATA = [b for b in BLOCKS if b.language in ("yaml", "toml", "json")]
LOADERS: dict[str, Any] = {
    "yaml": lambda text: list(yaml.safe_load_all(text)),
    "toml": tomllib.loads,
    "json": json.loads,
}  # a YAML block may hold several documents (manifests)


@pytest.mark.parametrize("block", DATA, ids=ids(DATA))
def test_data_blocks_parse(block: Block) -> None:
    LOADERS[block.language](block.text)


INTERNAL = ("TRAINERS.md", "DESIGN.md", "PROTOCOLS.md", "HARNESSES.md", "SWEBENCH.md", "../shared")
"""Files of the developers' own notes, which users of Polar do not have: the docs must stand without them."""


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_no_doc_cites_the_developers_notes(path: Any) -> None:
    cited = [(n, name) for n, line in enumerate(path.read_text().splitlines(), 1) for name in INTERNAL if name in line]
    assert not cited, f"{path.relative_to(ROOT)} cites notes users do not have: " + ", ".join(
        f"{name} (line {n})" for n, name in cited
    )


def test_the_readme_installs_torch_cpu_before_the_train_extra() -> None:
    """A bare ``pip install -e ".[train]"`` pulls PyPI's CUDA torch (GBs): the README's block that installs the extra
    installs torch's CPU build first, from PyTorch's CPU index, and names the pin CI installs."""
    readme = ROOT / "README.md"
    blocks = [b for b in BLOCKS if b.path == readme and b.language == "bash" and '".[train]"' in b.text]
    assert blocks, "the README has no block installing the train extra"
    for block in blocks:
        lines = block.text.splitlines()
        train = next(i for i, line in enumerate(lines) if '".[train]"' in line)
        before = "\n".join(lines[:train])
        assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in before, block.where
        assert "torch==2.13.0+cpu" in before, block.where
    assert "torch==2.13.0+cpu" in (ROOT / ".ci" / "run").read_text()  # the pin the README quotes is CI's
