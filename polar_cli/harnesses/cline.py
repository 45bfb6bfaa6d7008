"""Cline CLI (npm ``cline``): OpenAI Chat Completions through its ``openai-compatible`` provider.

``CLINE_DIR=<home>/.cline`` holds its state; ``data/settings/providers.json`` (the file ``cline auth -p
openai-compatible -b URL -k KEY -m MODEL`` writes) selects the session's gateway, key and the served model, and
``data/settings/global-settings.json`` opts out of telemetry and auto-update (``CLINE_NO_AUTO_UPDATE`` too).
``CLINE_SESSION_BACKEND_MODE=local`` runs the session in the CLI's own process: by default it starts (or reuses) a
background hub daemon that would outlive the run. providers.json alone pins the provider and model: ``-P``/``-m``
on the command line rewrite its entry without the base URL (and the CLI then calls its vendor's host). ``--auto-approve
true`` (its default for a prompt run) bypasses approvals, ``--json`` prints its events (a ``run_result`` with its
``finishReason`` last). ``--json`` wants the prompt as an argument (a piped one is refused in that mode), so the
instruction is the one argument after ``--`` (a leading ``-`` stays text). It refuses a one-word prompt argument
("unknown command or unquoted prompt"), so an instruction without whitespace, or above 100 kB, goes in on stdin
instead, without ``--json``.

Config: ``settings`` (merged into global-settings.json).
"""

from __future__ import annotations

from typing import Any, ClassVar

from polar_cli.harnesses.npm import ARG_LIMIT, NpmHarness, deep_merge, dump_json
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun, json_lines

PROVIDER = "openai-compatible"
UPDATED_AT = "2026-01-01T00:00:00.000Z"  # the entry's timestamp, as ``cline auth`` writes it


class ClineHarness(NpmHarness):
    name: ClassVar[str] = "cline"
    description: ClassVar[str] = "Cline CLI (cline), OpenAI chat via its openai-compatible provider"
    npm_package: ClassVar[str] = "cline"
    version: ClassVar[str] = "3.0.65"
    binary: ClassVar[str] = "cline"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("run_commands", "commands")

    def build(self, context: HarnessContext) -> HarnessLaunch:
        providers = {
            "version": 1,
            "lastUsedProvider": PROVIDER,
            "modes": {},
            "providers": {
                PROVIDER: {
                    "settings": {
                        "provider": PROVIDER,
                        "apiKey": context.api_key,
                        "model": context.model,
                        "baseUrl": context.base_url("openai"),
                    },
                    "updatedAt": UPDATED_AT,
                    "tokenSource": "manual",
                }
            },
        }
        settings: dict[str, Any] = {"telemetryOptOut": True, "autoUpdateEnabled": False}
        settings = deep_merge(settings, self.settings(context))
        argv = ["--auto-approve", "true", "-c", context.workdir]
        instruction = context.instruction
        stdin: bytes | None = None
        if len(instruction.encode()) <= ARG_LIMIT and len(instruction.split()) > 1:
            argv = ["--json", *argv, "--", instruction]
        else:
            stdin = instruction.encode()
        return HarnessLaunch(
            argv=argv,
            env={
                "CLINE_DIR": f"{context.home}/.cline",
                "CLINE_SESSION_BACKEND_MODE": "local",
                "CLINE_NO_AUTO_UPDATE": "1",
                "CLINE_NO_INTERACTIVE": "1",
            },
            files={
                ".cline/data/settings/providers.json": dump_json(providers),
                ".cline/data/settings/global-settings.json": dump_json(settings),
            },
            stdin=stdin,
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        results = [event for event in json_lines(run.stdout) if event.get("type") == "run_result"]
        if results and results[-1].get("finishReason") not in ("completed", "stop", None):
            return f"cline's run ended with {results[-1].get('finishReason')}"
        return None
