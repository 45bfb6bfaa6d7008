"""Polar plugin: the aider harness (PyPI ``aider-chat``), streamed OpenAI Chat Completions through litellm.

aider runs headless and unchanged: ``--message-file`` (the instruction, written in the session home: nothing of it is
parsed as an option), ``--yes-always`` (every confirmation answered yes, except aider's shell-command suggestions,
which it never runs unattended), ``--model openai/<served model>`` with ``--openai-api-base`` at the session and the
key in ``OPENAI_API_KEY``. aider has no shell tool: its actions are file edits in its edit format (``whole``: the
file's name, then its full text in a fence), and its feedback loop is the test command: with ``config.test_cmd`` set
(``--test-cmd ... --auto-test``) it runs the command after each edit and, when it fails, sends its output back to the
model. Without one, a run is usually one model call.

Offline: the served model's metadata (context window, zero prices) is written to ``.aider/model.metadata.json`` and
passed as ``--model-metadata-file``, so aider never downloads litellm's model list; litellm reads its bundled cost map
(``LITELLM_LOCAL_MODEL_COST_MAP=True``); analytics, the update check, release notes, URL detection (which would
fetch pages named in the instruction) are off, and the history files live in the session home, not the work dir.
``--no-git`` by default (aider would otherwise offer to create a repo, and commit its edits); ``config.git: true``
lets aider see the repo (repo map) with auto and dirty commits off.

aider takes a message that starts with ``/`` or ``!`` for one of its own commands (``!cmd`` runs a shell command),
so such an instruction gets a leading newline: it reaches the model as text. aider exits 0 even when every model call
failed; ``check_run`` fails a run whose output carries litellm's error.

Config: ``test_cmd``, ``edit_format`` (aider's default for the model when unset), ``git``, ``context_window``,
``settings`` (merged into the model metadata entry).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.api import (
    HarnessContext,
    HarnessLaunch,
    HarnessRun,
    NpmOptions,
    PypiHarness,
    RegisterHarness,
    deep_merge,
    dump_json,
    hookimpl,
)

INSTRUCTION_FILE = ".polar/instruction.txt"
METADATA_FILE = ".aider/model.metadata.json"
CHECK_SCRIPT = "polar-check.sh"
# litellm's exceptions as aider prints them when a model call failed for good (aider still exits 0)
MODEL_ERROR = re.compile(r"litellm\.\w*(Error|Exception)\b")


class AiderOptions(NpmOptions):
    """``AgentSpec.config`` of ``aider``."""

    test_cmd: str | None = Field(default=None, description="aider's --test-cmd, run after each edit (--auto-test)")
    edit_format: str | None = Field(default=None, description="aider's --edit-format (whole, diff, udiff, ...)")
    git: bool = Field(default=False, description="let aider use the work dir's git repo (commits stay off)")
    context_window: int = Field(default=131072, gt=0, description="the served model's context window, in tokens")


class AiderHarness(PypiHarness):
    """aider (``aider-chat`` on PyPI): file edits in its edit format, OpenAI chat through litellm."""

    name: ClassVar[str] = "aider"
    description: ClassVar[str] = "aider (PyPI aider-chat), streamed OpenAI chat via litellm; edits, test-cmd loop"
    pypi_package: ClassVar[str] = "aider-chat"
    version: ClassVar[str] = "0.86.2"
    binary: ClassVar[str] = "aider"
    provider: ClassVar[str] = "openai"
    options: ClassVar[type[BaseModel]] = AiderOptions

    def model_metadata(self, context: HarnessContext, options: AiderOptions) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "max_tokens": options.context_window,
            "max_input_tokens": options.context_window,
            "max_output_tokens": options.context_window,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
        return {f"openai/{context.model}": deep_merge(entry, options.settings)}

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: AiderOptions = self.parse_config(context.config)
        home = context.home
        argv = [
            "--model", f"openai/{context.model}",
            "--openai-api-base", context.base_url("openai"),
            "--model-metadata-file", f"{home}/{METADATA_FILE}",
            "--message-file", f"{home}/{INSTRUCTION_FILE}",
            "--yes-always",
            "--no-pretty", "--no-fancy-input", "--no-show-model-warnings", "--no-show-release-notes",
            "--no-check-update", "--no-analytics", "--no-detect-urls",
            "--input-history-file", f"{home}/.aider/input.history",
            "--chat-history-file", f"{home}/.aider/chat.history.md",
        ]  # fmt: skip
        argv += ["--no-auto-commits", "--no-dirty-commits", "--no-gitignore"] if options.git else ["--no-git"]
        if options.edit_format:
            argv += ["--edit-format", options.edit_format]
        if options.test_cmd:
            argv += ["--test-cmd", options.test_cmd, "--auto-test"]
        instruction = context.instruction
        if instruction[:1] in ("/", "!"):
            instruction = "\n" + instruction  # not one of aider's own commands
        return HarnessLaunch(
            argv=argv,
            env={
                "OPENAI_API_KEY": context.api_key,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_TELEMETRY": "False",
                "AIDER_ANALYTICS": "false",
            },
            files={
                INSTRUCTION_FILE: instruction,
                METADATA_FILE: dump_json(self.model_metadata(context, options)),
            },
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        found = MODEL_ERROR.search(run.stdout) or MODEL_ERROR.search(run.stderr)
        if found:
            return f"aider's model call failed ({found.group(0)}), though it exited 0"
        return None

    def doctor_script(self, command: str) -> list[dict[str, Any]]:
        """aider's own loop: an edit (``whole`` format) writing the command as a script, which the doctor's test
        command runs and fails on, so aider sends the output back; then a plain answer."""
        edit = f"{CHECK_SCRIPT}\n```\n{command}\n```\n"
        return [
            {"role": "assistant", "content": edit},
            {"role": "assistant", "content": "The file is written. Polar doctor: done."},
        ]

    def doctor_config(self) -> dict[str, Any]:
        # the test "fails" on purpose, so that aider reflects the script's output to the model
        return {"edit_format": "whole", "test_cmd": f"sh {CHECK_SCRIPT}; exit 1"}


@hookimpl
def register_harnesses(register: RegisterHarness) -> None:
    register(AiderHarness())
