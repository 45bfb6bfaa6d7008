"""``check_task``: everything about a TaskRequest that can be checked before any session exists.

Called when a task is submitted (the gateway node, ``polar run``, the rollout server, which answers a ConfigError with
HTTP 400), so a typo fails at once, naming the field, instead of after the agent ran. Neither the server nor the
gateway owns it: both import it from here.

- ``runtime``: the backend exists and accepts the spec and its ``config`` (``Runtime.check_spec``); every prepare
  action has what its type needs and names no host path outside the task's base dir;
- ``agent``: the harness exists and accepts ``agent.config`` (``Harness.check_config``);
- ``builder``: the strategy exists and accepts ``builder.config`` (``Builder.check_config``: strict for the built-ins);
- ``evaluator``: the strategy exists and accepts ``evaluator.config`` (``Evaluator.check_config``);
- ``metadata.script`` (the scripted backend's per-session script) is an inline list: a session may not name a host
  file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from polar_cli.errors import ConfigError
from polar_cli.models import TaskRequest
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.proxy import inline_script
from polar_cli.registry import get_builder, get_evaluator, get_harness, get_runtime
from polar_cli.runtimes.prepare import check_prepare


def check_task(task: TaskRequest, *, base_dir: Path | None = None) -> None:
    """Raise ConfigError (or UnknownComponentError) naming the task and the field of the first problem found."""
    runtime = get_runtime(task.runtime.backend)
    harness = get_harness(task.agent.harness)
    builder = get_builder(task.builder.strategy)
    evaluator = get_evaluator(task.evaluator.strategy)
    _field(task, "runtime", lambda: runtime.check_spec(task.runtime))
    _field(task, "runtime.prepare", lambda: check_prepare(task.runtime.prepare, base_dir=base_dir))
    _field(task, "agent.config", lambda: harness.check_config(task.agent.config))
    _field(task, "builder.config", lambda: builder.check_config(task.builder.config))
    _field(task, "evaluator.config", lambda: evaluator.check_config(task.evaluator.config))
    script = task.metadata.get(SCRIPT_KEY)
    if script is not None:
        _field(task, "metadata.script", lambda: inline_script(script))


def _field(task: TaskRequest, where: str, check: Callable[[], object]) -> None:
    try:
        check()
    except ConfigError as exc:
        raise ConfigError(f"task {task.task_id!r}: {where}: {exc}") from exc
