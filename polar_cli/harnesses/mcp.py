"""MCP servers and skills for a harness: ``agent.config.mcp_servers`` and ``agent.config.skills``, one typed model
for every adapter, written by each adapter into its CLI's own configuration format.

An MCP server is a **local stdio command run inside the session's runtime**, started by the harness itself like any
other tool it runs: ``command`` is a program name (found on the runtime's ``PATH``) or an absolute path in the runtime;
Polar copies or mounts nothing for it. Remote servers (a ``url``: HTTP or SSE) are refused, so a task cannot make the
harness talk to a host the runtime would otherwise not reach through its config. Every string is taken literally:
``$`` and opencode's ``{env:...}``/``{file:...}`` are refused, because the CLIs expand them differently (Claude Code
and Gemini CLI expand ``$VAR``, opencode reads files for ``{file:...}``, Codex expands nothing).

A skill (the Agent Skills format: a folder with a ``SKILL.md`` whose front matter holds ``name`` and ``description``)
is written into the harness's own skills folder inside the session home, and nowhere else: extra files have relative
paths without ``..``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from polar_cli.harnesses.npm import NpmOptions
from polar_cli.models import StrictModel

SERVER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
SKILL_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
PROGRAM = re.compile(r"[A-Za-z0-9._+-]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EXPANDED = re.compile(r"\$|\{(env|file):")
SKILL_FILE_LIMIT = 1_000_000
# Where the CLIs' own config files list MCP servers (Gemini CLI and Qwen Code, Codex, opencode), and the keys of a
# remote server there: ``settings`` may refine a server of ``mcp_servers`` there, never add one or make it remote.
SETTINGS_SERVER_KEYS = ("mcpServers", "mcp_servers", "mcp")
REMOTE_KEYS = frozenset({"url", "httpUrl", "headers", "http_headers", "bearer_token_env_var", "oauth"})


def _literal(value: str) -> str:
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    if EXPANDED.search(value):
        raise ValueError(
            f"must be literal, not {value!r}: '$', '{{env:' and '{{file:' are expanded differently by each harness"
        )
    return value


def _server_name(name: str) -> str:
    if not SERVER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a server name (a letter, then up to 39 letters, digits, '_' or '-')")
    return name


def _command(command: str) -> str:
    _literal(command)
    if PROGRAM.fullmatch(command) and command not in (".", ".."):
        return command
    if command.startswith("/") and ".." not in command.split("/") and command.isprintable():
        return command
    raise ValueError(
        f"must be a program name found on the runtime's PATH or an absolute path in the runtime, not {command!r}"
    )


def _env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    return name


def _skill_name(name: str) -> str:
    if len(name) > 64 or not SKILL_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a skill name (lowercase letters, digits and single '-', at most 64)")
    return name


def _skill_path(path: str) -> str:
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{path!r} is not a relative path inside the skill's folder (no '..', '.', '//' or '/' first)")
    if path == "SKILL.md":
        raise ValueError("SKILL.md is written from the skill's description and instructions")
    return path


LiteralText = Annotated[str, AfterValidator(_literal)]


class McpServer(StrictModel):
    """One MCP server: a stdio command the harness starts inside the session's runtime."""

    command: Annotated[str, AfterValidator(_command)] = Field(
        description="a program on the runtime's PATH or an absolute path in the runtime"
    )
    args: list[LiteralText] = Field(default_factory=list, description="its arguments, literal")
    env: dict[Annotated[str, AfterValidator(_env_name)], LiteralText] = Field(
        default_factory=dict, description="variables for the server process, literal"
    )
    startup_timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, description="how long the harness waits for the server to start and list its tools"
    )

    @model_validator(mode="before")
    @classmethod
    def _stdio_only(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and ("url" in data or "httpUrl" in data or data.get("type") in ("http", "sse")):
            raise ValueError(
                "is a remote server (url): only local stdio servers are supported, a command run inside the runtime"
            )
        return data


class Skill(StrictModel):
    """One skill (Agent Skills format): ``SKILL.md`` made from the description and instructions, plus files."""

    description: str = Field(min_length=1, max_length=1024, description="when the agent should use the skill")
    instructions: str = Field(default="", description="the body of SKILL.md (Markdown)")
    files: dict[Annotated[str, AfterValidator(_skill_path)], str] = Field(
        default_factory=dict, description="more files of the skill: a relative path in its folder -> the text"
    )

    @model_validator(mode="after")
    def _size(self) -> Skill:
        size = len(self.instructions) + sum(len(text) for text in self.files.values())
        if size > SKILL_FILE_LIMIT:
            raise ValueError(f"is {size} characters in all; a skill holds at most {SKILL_FILE_LIMIT}")
        return self


ServerName = Annotated[str, AfterValidator(_server_name)]
SkillName = Annotated[str, AfterValidator(_skill_name)]


class SkillsOptions(NpmOptions):
    """``AgentSpec.config`` of an npm harness that loads skills (but runs no MCP servers)."""

    skills: dict[SkillName, Skill] = Field(
        default_factory=dict, description="skills written into the harness's skills folder in the session home"
    )


class McpOptions(SkillsOptions):
    """``AgentSpec.config`` of an npm harness that runs MCP servers and loads skills."""

    mcp_servers: dict[ServerName, McpServer] = Field(
        default_factory=dict,
        validate_default=True,
        description="local stdio MCP servers the harness starts inside the runtime",
    )

    @field_validator("mcp_servers")
    @classmethod
    def _settings_add_no_server(cls, servers: dict[str, McpServer], info: ValidationInfo) -> dict[str, McpServer]:
        settings = info.data.get("settings") or {}
        for key in SETTINGS_SERVER_KEYS:
            entries = settings.get(key)
            if entries is None:
                continue
            if not isinstance(entries, Mapping):
                raise ValueError(f"is where MCP servers are declared, not settings.{key} (not a mapping)")
            for name, entry in entries.items():
                where = f"settings.{key}.{name}"
                if name not in servers:
                    raise ValueError(f"must declare every MCP server ({where} adds {name!r}, which is not checked)")
                remote = sorted(REMOTE_KEYS & set(entry)) if isinstance(entry, Mapping) else []
                if remote or (isinstance(entry, Mapping) and entry.get("type") not in (None, "stdio", "local")):
                    raise ValueError(f"are local stdio servers only: {where} makes {name!r} remote")
        return servers


def stdio_server(server: McpServer) -> dict[str, Any]:
    """``{command, args, env}``: the entry shape Claude Code, Codex, Gemini CLI and Qwen Code share (each adds its own
    startup timeout key, if it has one)."""
    entry: dict[str, Any] = {"command": server.command, "args": list(server.args)}
    if server.env:
        entry["env"] = dict(server.env)
    return entry


def startup_timeout_ms(servers: Mapping[str, McpServer]) -> int:
    """The longest startup timeout of ``servers``, in milliseconds (for a harness that has one setting for all)."""
    return max((round(s.startup_timeout_seconds * 1000) for s in servers.values()), default=0)


def skill_files(skills: Mapping[str, Skill], folder: str) -> dict[str, str]:
    """The files of ``skills`` under ``folder`` (relative to the session home): ``<folder>/<name>/SKILL.md`` and
    ``<folder>/<name>/<path>`` for each extra file."""
    files: dict[str, str] = {}
    for name, skill in skills.items():
        front = yaml.safe_dump({"name": name, "description": skill.description}, sort_keys=False, allow_unicode=True)
        files[posixpath.join(folder, name, "SKILL.md")] = f"---\n{front}---\n\n{skill.instructions}"
        for path, text in skill.files.items():
            files[posixpath.join(folder, name, path)] = text
    return files
