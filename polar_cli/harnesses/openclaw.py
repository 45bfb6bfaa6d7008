"""OpenClaw (``openclaw``): its headless ``agent exec`` turn, OpenAI Chat Completions through a custom provider.

``agent exec`` runs one embedded agent turn without a Gateway, in a temporary state directory it removes afterwards.
``--config <home>/.openclaw/openclaw.json`` pins the run to Polar's config (no ambient config): one provider ``polar``
(``api: openai-completions``, the session's base URL and key, the served model only, ``models.mode: replace`` so no
catalog is merged in), the agent's primary model that model, update checks and telemetry off. ``OPENCLAW_HOME`` and
``OPENCLAW_STATE_DIR`` keep every default path in the session home; ``OPENCLAW_NO_AUTO_UPDATE``, ``OPENCLAW_OFFLINE``
and ``OPENCLAW_DISABLE_BONJOUR`` stop update requests, helper downloads and mDNS. The instruction goes in on stdin
(``--message-file -``); ``--cwd`` scopes the workspace and tools to the session dir; ``--json`` prints its result
envelope (``status`` ``ok`` or ``error``), which ``check_run`` reads.

OpenClaw needs Node 24.16 or newer (``node:sqlite``; its preinstall script refuses an older npm's Node, so it is
installed with ``--ignore-scripts``): Node 24 is installed beside it (``node_version``) and runs ``openclaw.mjs``.
Without its postinstall, each start tries to add an optional native package (``@openclaw/fs-safe-<platform>``) with
npm inside its install prefix; under Polar that fails and it goes on without it. Config: ``settings`` (merged into
openclaw.json), ``model_limits`` (``{"contextWindow": N, "maxTokens": N}`` for the model entry), ``timeout`` (its
deadline, seconds).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.harnesses.npm import NpmHarness, NpmOptions, deep_merge, dump_json, json_object
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun


class OpenclawOptions(NpmOptions):
    """``AgentSpec.config`` of ``openclaw``."""

    model_limits: dict[str, Any] | None = Field(default=None, description="e.g. {contextWindow: 32768}")
    timeout: int = Field(default=3600, ge=1, description="its own agent deadline in seconds (agent exec --timeout)")


class OpenclawHarness(NpmHarness):
    name: ClassVar[str] = "openclaw"
    description: ClassVar[str] = "OpenClaw (openclaw agent exec), OpenAI chat via a custom provider"
    npm_package: ClassVar[str] = "openclaw"
    version: ClassVar[str] = "2026.9.6"
    binary: ClassVar[str] = "openclaw"
    node_version: ClassVar[str] = "24.21.0"  # it needs >= 24.16 (node:sqlite)
    entry: ClassVar[str] = "openclaw.mjs"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("exec", "command")
    options: ClassVar[type[BaseModel]] = OpenclawOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: OpenclawOptions = self.parse_config(context.config)
        model: dict[str, Any] = {"id": context.model, "name": context.model, "reasoning": False, "input": ["text"]}
        model.update(options.model_limits or {})
        config: dict[str, Any] = {
            "models": {
                "mode": "replace",
                "providers": {
                    "polar": {
                        "baseUrl": context.base_url("openai"),
                        "apiKey": context.api_key,
                        "api": "openai-completions",
                        "models": [model],
                    }
                },
            },
            "agents": {"defaults": {"model": {"primary": f"polar/{context.model}"}}},
            "update": {"checkOnStart": False},
            "telemetry": {"enabled": False},
        }
        config = deep_merge(config, options.settings)
        home = context.home
        argv = ["agent", "exec", "--message-file", "-", "--json",
                "--config", f"{home}/.openclaw/openclaw.json", "--cwd", context.workdir,
                "--model", f"polar/{context.model}", "--timeout", str(options.timeout)]  # fmt: skip
        return HarnessLaunch(
            argv=argv,
            env={
                "OPENCLAW_HOME": home,
                "OPENCLAW_STATE_DIR": f"{home}/.openclaw",
                "OPENCLAW_NO_AUTO_UPDATE": "1",
                "OPENCLAW_OFFLINE": "1",
                "OPENCLAW_DISABLE_BONJOUR": "1",
            },
            files={".openclaw/openclaw.json": dump_json(config)},
            stdin=context.instruction.encode(),
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        envelope = json_object(run.stdout)
        if envelope is None:
            return "openclaw printed no JSON result envelope"
        if envelope.get("status") != "ok":
            error = envelope.get("error")
            detail = error.get("message") if isinstance(error, dict) else envelope.get("status")
            return f"openclaw's run did not end ok: {detail}"
        return None
