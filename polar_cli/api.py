"""The plugin API: the one module a Polar plugin package imports. Everything else in ``polar_cli`` is internal.

A plugin is a module with ``@hookimpl`` functions named after the hooks (see docs/plugins.md); each hook receives a
``register`` callable typed for its category and is called with keyword arguments. Every component subclasses its
category's base class, sets ``name`` (what users write) and ``description``, and declares its config as ``options``, a
``StrictModel`` subclass that the host validates when a task is submitted (``self.parse_config(config)`` gives the
validated model back; the default ``NoOptions`` takes no key).

Everyone
    ``hookimpl``; ``Component`` (the root of every base class), ``StrictModel``, ``NoOptions``, ``validate_model``;
    the errors: ``PolarError`` (the root: one line to the user), ``ConfigError`` (bad config: name the field),
    ``PluginError``, ``MissingDependencyError`` with ``require`` and ``missing_dependency`` (an optional package,
    imported when needed, named with the extra that brings it).

Harnesses (``register_harnesses(register: RegisterHarness)``)
    ``Harness`` (implement ``launch``; ``check_run`` to catch failures that exit 0), or ``NpmHarness`` for a CLI
    installed from npm at a pinned version (implement ``build``; its options ``NpmOptions`` hold ``settings``), or
    ``PypiHarness`` for one installed from PyPI into its own venv (the same ``build``; local runtime only).
    ``HarnessContext`` in, ``HarnessLaunch`` out, ``HarnessRun`` to judge; helpers ``deep_merge`` (user settings over
    the adapter's), ``dump_json`` / ``dump_toml`` (config files), ``prompt_flag`` (the instruction as one argv element,
    or stdin when too long), ``json_lines`` (a CLI's JSON events). ``side_prompts`` or ``chain_role`` name the calls
    the harness makes for itself (``RoleVerdict``, ``system_prompt``; docs/builders.md, "Chain roles"). MCP servers
    and skills (docs/harnesses.md): options ``McpOptions`` (``mcp_servers`` of ``McpServer``, ``skills`` of ``Skill``)
    or ``SkillsOptions`` (skills only); helpers ``stdio_server`` (the ``{command, args, env}`` entry),
    ``startup_timeout_ms``, ``skill_files`` (a skills folder's files). ``HarnessError``.

Runtimes (``register_runtimes(register: RegisterRuntime)``)
    ``Runtime`` (implement ``start``; ``check_spec`` for the spec beyond its config; ``leftovers`` and
    ``remove_leftover`` for the crash sweeps: ``Leftover`` s made by an ``Owner``), returning a
    ``RuntimeHandle`` (``spawn``, ``upload``, ``download``, ``write_file``, ``stop``, ``cancel``; ``exec`` is built on
    ``spawn``) whose commands are ``RuntimeProcess``\\ es; ``RuntimeContext`` in, ``RuntimeSpec`` (with ``Mount``,
    ``PrepareAction``) to honour; ``ExecResult``, ``Stream``, ``OutputCallback``; the fixed paths ``SESSION_PATH``,
    ``HOME_PATH``, ``TOOLS_PATH`` and ``KILL_GRACE_SECONDS``. ``RuntimeFailure``.

Builders (``register_builders(register: RegisterBuilder)``)
    ``Builder`` (implement ``build``): recorded ``Completion``\\ s and a ``BuildContext`` in, a ``Trajectory`` of
    ``Trace``\\ s (``TokenLogprob`` entries, ``TrajectoryStatus``) out. ``BuildError``.

Evaluators (``register_evaluators(register: RegisterEvaluator)``)
    ``Evaluator`` (implement ``evaluate``): an ``EvaluationContext`` (the agent's ``RuntimeHandle``, a fresh one with
    ``refresh_runtime``, the deadline) in, an ``EvaluationResult`` out; helpers ``parse_pytest_output``,
    ``parse_junit_xml`` (test outcomes) and ``tail`` (the end of a long log). ``EvaluationError``.

Datasets (``register_datasets(register: RegisterDataset)``)
    ``Dataset`` (implement ``tasks``) yielding ``TaskRequest``\\ s (with ``AgentSpec``, ``RuntimeSpec``,
    ``BuilderSpec``, ``EvaluatorSpec``); ``load_from_hub`` and ``hub_cause`` read the HuggingFace Hub in one quiet
    line. ``HubError``.

Inference backends (``register_backends(register: RegisterBackend)``)
    ``InferenceBackend`` (implement ``client``) returning a ``BackendClient`` (``generate``, ``count_tokens``):
    a normalized ``ChatRequest`` in, a ``Generation`` with exact token ids out. ``BackendError``.

Commands (``register_commands(app: typer.Typer)``)
    Add commands or sub-apps to the ``polar`` typer app; a command parses options and calls a library function.
"""

from __future__ import annotations

from polar_cli.errors import (
    BackendError,
    BuildError,
    ConfigError,
    EvaluationError,
    HarnessError,
    HubError,
    MissingDependencyError,
    PluginError,
    PolarError,
    RuntimeFailure,
)
from polar_cli.evaluators.outcomes import parse_junit_xml, parse_pytest_output
from polar_cli.extras import missing as missing_dependency
from polar_cli.extras import require
from polar_cli.harnesses.mcp import (
    McpOptions,
    McpServer,
    Skill,
    SkillsOptions,
    skill_files,
    startup_timeout_ms,
    stdio_server,
)
from polar_cli.harnesses.npm import NpmHarness, NpmOptions, deep_merge, dump_json, prompt_flag
from polar_cli.harnesses.pypi import PypiHarness
from polar_cli.harnesses.run import tail
from polar_cli.harnesses.toml import dumps as dump_toml
from polar_cli.hf_hub import cause as hub_cause
from polar_cli.hf_hub import load_from_hub
from polar_cli.hookspecs import (
    RegisterBackend,
    RegisterBuilder,
    RegisterDataset,
    RegisterEvaluator,
    RegisterHarness,
    RegisterRuntime,
    hookimpl,
)
from polar_cli.interfaces import (
    BackendClient,
    BuildContext,
    Builder,
    Component,
    Dataset,
    EvaluationContext,
    EvaluationResult,
    Evaluator,
    ExecResult,
    Harness,
    HarnessContext,
    HarnessLaunch,
    HarnessRun,
    InferenceBackend,
    NoOptions,
    RoleVerdict,
    Runtime,
    RuntimeContext,
    RuntimeHandle,
    RuntimeProcess,
    json_lines,
    system_prompt,
)
from polar_cli.interfaces.runtime import (
    HOME_PATH,
    KILL_GRACE_SECONDS,
    SESSION_PATH,
    TOOLS_PATH,
    Leftover,
    OutputCallback,
    Owner,
    Stream,
)
from polar_cli.models import (
    AgentSpec,
    BuilderSpec,
    Completion,
    EvaluatorSpec,
    Mount,
    PrepareAction,
    RuntimeSpec,
    StrictModel,
    TaskRequest,
    TokenLogprob,
    Trace,
    Trajectory,
    TrajectoryStatus,
    validate_model,
)
from polar_cli.models.chat import ChatRequest, Generation

__all__ = [
    "HOME_PATH",
    "KILL_GRACE_SECONDS",
    "SESSION_PATH",
    "TOOLS_PATH",
    "AgentSpec",
    "BackendClient",
    "BackendError",
    "BuildContext",
    "BuildError",
    "Builder",
    "BuilderSpec",
    "ChatRequest",
    "Completion",
    "Component",
    "ConfigError",
    "Dataset",
    "EvaluationContext",
    "EvaluationError",
    "EvaluationResult",
    "Evaluator",
    "EvaluatorSpec",
    "ExecResult",
    "Generation",
    "Harness",
    "HarnessContext",
    "HarnessError",
    "HarnessLaunch",
    "HarnessRun",
    "HubError",
    "InferenceBackend",
    "Leftover",
    "McpOptions",
    "McpServer",
    "MissingDependencyError",
    "Mount",
    "NoOptions",
    "NpmHarness",
    "NpmOptions",
    "OutputCallback",
    "Owner",
    "PluginError",
    "PolarError",
    "PrepareAction",
    "PypiHarness",
    "RegisterBackend",
    "RegisterBuilder",
    "RegisterDataset",
    "RegisterEvaluator",
    "RegisterHarness",
    "RegisterRuntime",
    "RoleVerdict",
    "Runtime",
    "RuntimeContext",
    "RuntimeFailure",
    "RuntimeHandle",
    "RuntimeProcess",
    "RuntimeSpec",
    "Skill",
    "SkillsOptions",
    "Stream",
    "StrictModel",
    "TaskRequest",
    "TokenLogprob",
    "Trace",
    "Trajectory",
    "TrajectoryStatus",
    "deep_merge",
    "dump_json",
    "dump_toml",
    "hookimpl",
    "hub_cause",
    "json_lines",
    "load_from_hub",
    "missing_dependency",
    "parse_junit_xml",
    "parse_pytest_output",
    "prompt_flag",
    "require",
    "skill_files",
    "startup_timeout_ms",
    "stdio_server",
    "system_prompt",
    "tail",
    "validate_model",
]
