"""``polar run --samples K`` with a script of variants: the gateway gives each session its sample index, and the
scripted backend plays that sample's variant (the shell harness: a few lines of Python calling the model twice)."""

from __future__ import annotations

from pathlib import Path

import yaml

from polar_cli.harnesses.testing import polar_run_file

ROOT = Path(__file__).resolve().parents[2]


def test_each_sample_of_a_task_plays_its_variant(tmp_path: Path) -> None:
    variants = {"variants": [[{"content": f"v{k} hello"}, {"content": f"v{k} bye"}] for k in range(2)]}
    script = tmp_path / "variants.yaml"
    script.write_text(yaml.safe_dump(variants), encoding="utf-8")
    reports = polar_run_file(ROOT / "examples" / "shell-agent.yaml", tmp_path, "--script", str(script),
                             "--samples", "3")  # fmt: skip
    assert [r.exit_code for r in reports] == [0, 0, 0], reports[0].describe()
    played = {r.result.sample_index: [c.response_message["content"] for c in r.completions]
              for r in reports if r.result is not None}  # fmt: skip
    assert played == {0: ["v0 hello", "v0 bye"], 1: ["v1 hello", "v1 bye"], 2: ["v0 hello", "v0 bye"]}
