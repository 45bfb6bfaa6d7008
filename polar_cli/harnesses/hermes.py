"""The Hermes Agent harness (PyPI ``hermes-agent``, binary ``hermes``): OpenAI chat through its ``custom`` provider.

Hermes runs headless and unchanged in its one-shot mode, ``--oneshot=<instruction>`` (``-z``): one prompt, its tools,
approvals bypassed (it sets ``HERMES_YOLO_MODE`` itself), only the final answer on stdout. The instruction is joined to
the option with ``=``, one argument, so a leading ``-`` in it is not read as an option and no shell sees it.

``HERMES_HOME=<home>/.hermes`` keeps everything Hermes owns (config, sessions database, memories, logs, skills) in the
session home. Its ``config.yaml`` there points the ``custom`` provider at the session: ``model.provider: custom``,
``model.base_url`` the gateway, ``model.api_key`` the session key, ``model.default`` the served model (and
``--provider custom --model <served model>`` pin it for the run). Offline: no model catalog fetch
(``model_catalog.enabled: false``), no lazy installs of optional dependencies (``security.allow_lazy_installs:
false``, ``HERMES_DISABLE_LAZY_INSTALLS=1``), no ``tirith`` command scanner (it would be downloaded), no language
servers (``lsp``), no background skill curator; a one-shot run makes no update check. Memories are off so one session
learns nothing another sees.

Failure: a model call that fails for good (after Hermes's own retries) mostly ends the run with status **0**, the
error text printed as if it were the answer (``API call failed after 3 retries: ...``). So the adapter asks for Hermes's
usage report, ``--usage-file=/dev/stderr`` (a JSON object written after every one-shot run, failed or not), and a run
whose report says ``"failed": true``, or that wrote none, failed.

Config: ``toolsets`` (Hermes's ``--toolsets``, e.g. ``terminal,file``), ``settings`` (merged over config.yaml; not
``mcp_servers``: Polar starts no MCP server for Hermes, and a task's settings must not start one either).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, Field, field_validator

from polar_cli.harnesses.cli import CliOptions
from polar_cli.harnesses.npm import deep_merge
from polar_cli.harnesses.pypi import PypiHarness
from polar_cli.interfaces.harness import HarnessContext, HarnessLaunch, HarnessRun

HERMES_HOME = ".hermes"
CONFIG = f"{HERMES_HOME}/config.yaml"
# the first key of the usage report ``--usage-file`` writes (indented JSON), where it starts in stderr
USAGE_REPORT = '{\n  "estimated_cost_usd"'


class HermesOptions(CliOptions):
    """``AgentSpec.config`` of ``hermes``."""

    toolsets: str | None = Field(default=None, description="Hermes's --toolsets (e.g. 'terminal,file')")

    @field_validator("settings")
    @classmethod
    def _no_mcp_servers(cls, settings: dict[str, Any]) -> dict[str, Any]:
        if "mcp_servers" in settings:
            raise ValueError("may not declare mcp_servers (Polar starts no MCP server for hermes)")
        return settings


class HermesHarness(PypiHarness):
    """Hermes Agent (``hermes-agent`` on PyPI): its own tools, OpenAI chat through its custom provider."""

    name: ClassVar[str] = "hermes"
    description: ClassVar[str] = "Hermes Agent (PyPI hermes-agent), OpenAI chat via its custom provider"
    pypi_package: ClassVar[str] = "hermes-agent"
    version: ClassVar[str] = "0.19.0"
    binary: ClassVar[str] = "hermes"
    provider: ClassVar[str] = "openai"
    shell_tool: ClassVar[tuple[str, str]] = ("terminal", "command")
    options: ClassVar[type[BaseModel]] = HermesOptions

    def build(self, context: HarnessContext) -> HarnessLaunch:
        options: HermesOptions = self.parse_config(context.config)
        config: dict[str, Any] = {
            "model": {
                "provider": "custom",
                "default": context.model,
                "base_url": context.base_url("openai"),
                "api_key": context.api_key,
            },
            "model_catalog": {"enabled": False},
            "security": {"tirith_enabled": False, "allow_lazy_installs": False},
            "lsp": {"enabled": False},
            "curator": {"enabled": False},
            "memory": {"memory_enabled": False, "user_profile_enabled": False},
        }
        config = deep_merge(config, self.settings(context))
        argv = ["--provider", "custom", "--model", context.model]
        if options.toolsets:
            argv += ["--toolsets", options.toolsets]
        return HarnessLaunch(
            argv=[*argv, "--usage-file=/dev/stderr", f"--oneshot={context.instruction}"],
            env={"HERMES_HOME": f"{context.home}/{HERMES_HOME}", "HERMES_DISABLE_LAZY_INSTALLS": "1"},
            files={CONFIG: yaml.safe_dump(config, sort_keys=False, allow_unicode=True)},
        )

    def check_run(self, run: HarnessRun) -> str | None:
        failure = super().check_run(run)
        if failure:
            return failure
        report = usage_report(run.stderr)
        if report is None:
            return "hermes wrote no usage report"
        if report.get("failed"):
            return f"hermes failed: {run.stdout.strip()[-500:] or 'no answer'}"
        return None


def usage_report(stderr: str) -> dict[str, Any] | None:
    """The last usage report Hermes wrote to stderr (``--usage-file=/dev/stderr``), or None."""
    start = stderr.rfind(USAGE_REPORT)
    if start < 0:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(stderr, start)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
