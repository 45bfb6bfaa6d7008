"""What a trainer asks for: a task and the specs of its runtime, agent, builder and evaluator."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from polar_cli.models.base import StrictModel
from polar_cli.models.completion import TokenMode
from polar_cli.models.inference import MAX_POLICY_VERSION
from polar_cli.models.limits import MAX_COUNT, MAX_NUM_SAMPLES, BoundedId, HttpURL, Timeout
from polar_cli.models.rewards import RewardShaping
from polar_cli.models.trace import RewardAssignment

SCRIPT_KEY = "script"
"""``metadata.script``: the scripted backend's per-session script (an inline list of turns). It plays the model; it
is not data about the task, so what a session records of its task's metadata leaves it out (``without_script``)."""


def without_script(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A task's ``metadata`` as results, traces and exports record it: all of it but ``script``."""
    return {key: value for key, value in metadata.items() if key != SCRIPT_KEY}


class PrepareAction(StrictModel):
    """One step run in the runtime before the harness starts."""

    type: Literal["exec", "write_file", "upload"] = "exec"
    command: str | None = None
    path: str | None = None
    content: str | None = None
    source: str | None = None
    timeout_seconds: Timeout | None = None


class Mount(StrictModel):
    source: str
    target: str
    read_only: bool = False


class ResetSpec(StrictModel):
    """``runtime.reset``: how a used sandbox is brought back to the state it had after prepare (``reuse: reset``).

    The runtime always kills what the session started and removes the files it added outside ``git``; with ``git``
    the repository there is reset to ``base``; ``check`` is the sandbox's own verification."""

    git: str | None = Field(
        default=None, description="a git repository in the runtime (absolute, or relative to the session dir): git "
        "reset --hard <base>, git clean -ffdx, its refs, config and hooks as they were after prepare",
    )  # fmt: skip
    base: str | None = Field(default=None, description="the revision the repository goes back to (default: its HEAD "
                             "after prepare)")  # fmt: skip
    check: str | None = Field(default=None, description="shell text run after the reset (cwd: git, else the "
                              "workdir); anything but exit 0 destroys the sandbox")  # fmt: skip
    timeout_seconds: Timeout = Field(default=120.0, description="budget of the whole reset, check included")


class RuntimeSpec(StrictModel):
    """Where the harness runs: ``local``, ``docker``, ``apptainer`` or a plugin runtime.

    ``reuse: reset`` lets a gateway with a sandbox pool (``pipeline.sandbox_pool``) hand a used sandbox to the next
    session of the same spec after ``reset``, for at most ``reuse_max_sessions`` sessions and ``reuse_max_seconds``
    (docs/runtimes.md, "Warm pools and reuse")."""

    backend: str = "local"
    image: str | None = None
    network: str | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cpus: float | None = None
    memory: str | None = None
    mounts: list[Mount] = Field(default_factory=list)
    prepare: list[PrepareAction] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    reuse: Literal["none", "reset"] = Field(
        default="none", description="none: a sandbox serves one session; reset: after a session it is reset and may "
        "serve the next one of the same spec",
    )  # fmt: skip
    reset: ResetSpec = Field(default_factory=ResetSpec, description="how a used sandbox is reset (reuse: reset)")
    reuse_max_sessions: int = Field(default=16, ge=1, le=MAX_COUNT, description="sessions one sandbox serves at most")
    reuse_max_seconds: Timeout = Field(default=3600.0, description="a sandbox older than this is not reused")


class SamplingSpec(StrictModel):
    """``agent.sampling``: what the proxy forces on every model call of the task's sessions, whatever the harness
    asked. ``temperature``, ``top_p``, ``top_k`` and ``seed`` replace the harness's values; ``max_tokens`` is a cap (the
    smaller of it and the harness's value, or the cap when the harness sent none). Unset fields leave the harness's.
    ``stale_fraction`` chooses the replica each call goes to (cross-policy sampling), not how it samples."""

    temperature: float | None = Field(default=None, strict=True, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, strict=True, gt=0, le=1)
    top_k: int | None = Field(default=None, strict=True, le=MAX_COUNT, description="-1: no top-k; else at least 1")
    max_tokens: int | None = Field(
        default=None, strict=True, ge=1, le=MAX_COUNT, description="a cap on each call's sampled tokens"
    )
    seed: int | None = Field(default=None, strict=True, ge=-(2**63), lt=2**63)
    stale_fraction: float | None = Field(
        default=None, strict=True, ge=0, le=1,
        description="cross-policy sampling: each model call goes to a stale replica of the pool with this "
        "probability (a fresh draw per call), else to a current one (docs/proxy.md, \"Cross-policy sampling\")",
    )  # fmt: skip

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (no top-k) or at least 1")
        return value

    def forced(self) -> dict[str, Any]:
        """The fields the task set (what a completion records as ``metadata.sampling``)."""
        return self.model_dump(exclude_none=True)


class SessionLimits(StrictModel):
    """``agent.limits``: guard rails per session, enforced by the proxy. A session that hits one ends with status
    ``limit`` and the limit named, keeping what it captured (like ``timeout``). Unset fields are no limit."""

    max_model_calls: int | None = Field(
        default=None, strict=True, ge=1, le=MAX_COUNT,
        description="model calls the session may make; the next one is refused",
    )  # fmt: skip
    max_sampled_tokens: int | None = Field(
        default=None, strict=True, ge=1, le=MAX_COUNT,
        description="sampled tokens over the whole session; once reached, the next call is refused",
    )  # fmt: skip
    max_call_tokens: int | None = Field(
        default=None, strict=True, ge=1, le=MAX_COUNT,
        description="one call's sampled tokens: a cap on each request's max tokens (a harness's smaller value stays)",
    )  # fmt: skip
    repeat_limit: int | None = Field(
        default=None, strict=True, ge=2, le=MAX_COUNT,
        description="loop detection: this many consecutive completions with the same sampled token ids end the session",
    )  # fmt: skip

    def set(self) -> dict[str, int]:
        """The limits the task set."""
        return self.model_dump(exclude_none=True)


class AgentSpec(StrictModel):
    """Which harness runs, against which served model, sampled how, within which limits."""

    harness: str
    model_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: Timeout | None = None
    sampling: SamplingSpec | None = None
    limits: SessionLimits | None = None
    token_mode: TokenMode | None = Field(
        default=None,
        description="messages: the server renders the harness's messages; tokens: the proxy sends the prompt as ids, "
        "earlier assistant turns spliced in exactly as sampled (docs/builders.md, 'Token mode'); default: the "
        "gateway's",
    )
    keep_reasoning: bool = Field(
        default=True,
        description="tokens mode: earlier reasoning stays in the prompt exactly as sampled (true), or is dropped as "
        "the chat template drops it (false: the chain breaks with cause reasoning_dropped)",
    )


class BuilderSpec(StrictModel):
    """How recorded completions become traces."""

    strategy: str = "prefix_merging"
    config: dict[str, Any] = Field(default_factory=dict)


class EvaluatorSpec(StrictModel):
    """How a session is scored."""

    strategy: str = "session_completion"
    refresh_runtime: bool = False
    timeout_seconds: Timeout | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    reward_to: RewardAssignment = Field(
        default="main+subagents",
        description="which traces of a session receive its reward: main, main+subagents, or all (side traces too); "
        "the others keep reward None and trainable False",
    )
    shaping: RewardShaping | None = Field(
        default=None,
        description="reward shaping the gateway applies before the reward is recorded: fixed rewards for timeout, "
        "limit and error endings, an overlong penalty past a token budget (docs/trainers.md)",
    )


def new_task_id() -> str:
    """A fresh task id, ``task-<16 hex digits>``: what a task submitted without one gets."""
    return f"task-{secrets.token_hex(8)}"


class TaskRequest(StrictModel):
    """One task, expanded into ``num_samples`` sessions. Without a ``task_id`` it gets a fresh one each time it is
    validated, so the same file submitted twice is two tasks; the same ``task_id`` and body again is the same task."""

    task_id: BoundedId = Field(default_factory=new_task_id)
    instruction: str
    num_samples: int = Field(default=1, ge=1, le=MAX_NUM_SAMPLES)
    timeout_seconds: Timeout = 1800.0
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    agent: AgentSpec
    builder: BuilderSpec = Field(default_factory=BuilderSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    callback_url: HttpURL | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        le=MAX_POLICY_VERSION,
        description="a session whose oldest completion's policy_version is more than this many versions behind the "
        "current one is cancelled (status stale, its traces kept); None: never",
    )
