"""``check_task``: everything about a TaskRequest that can be checked before any session exists.

Called when a task is submitted (the gateway node, ``polar run``, the rollout server, which answers a ConfigError with
HTTP 400), so a typo fails at once, naming the field, instead of after the agent ran. Neither the server nor the
gateway owns it: both import it from here.

Each name (runtime backend, harness, builder and evaluator strategy) is looked up first, so a typo is an
UnknownComponentError naming the field, with a did-you-mean; ``polar run`` calls it with the task file as ``source``
when it reads the file, before anything starts.

- ``runtime``: the backend exists and accepts the spec and its ``config`` (``Runtime.check_spec``), and can restore a
  sandbox when ``reuse`` is ``reset`` (``Runtime.can_restore``); every prepare
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
from typing import TypeVar

from polar_cli.errors import ConfigError, UnknownComponentError
from polar_cli.models import TaskRequest
from polar_cli.models.task import SCRIPT_KEY
from polar_cli.proxy import inline_script
from polar_cli.registry import get_builder, get_evaluator, get_harness, get_runtime
from polar_cli.runtimes.prepare import check_prepare
from polar_cli.runtimes.reset import check_reuse

T = TypeVar("T")


def check_task(task: TaskRequest, *, base_dir: Path | None = None, source: str | None = None) -> None:
    """Raise ConfigError (or UnknownComponentError, with a did-you-mean) naming the task, the field of the first
    problem found, and ``source`` (the task file) when given."""
    prefix = f"{source}: " if source else ""
    runtime = _field(task, "runtime.backend", lambda: get_runtime(task.runtime.backend), prefix)
    harness = _field(task, "agent.harness", lambda: get_harness(task.agent.harness), prefix)
    builder = _field(task, "builder.strategy", lambda: get_builder(task.builder.strategy), prefix)
    evaluator = _field(task, "evaluator.strategy", lambda: get_evaluator(task.evaluator.strategy), prefix)
    _field(task, "runtime", lambda: runtime.check_spec(task.runtime), prefix)
    _field(task, "runtime.reuse", lambda: check_reuse(runtime, task.runtime), prefix)
    _field(task, "runtime.prepare", lambda: check_prepare(task.runtime.prepare, base_dir=base_dir), prefix)
    _field(task, "agent.config", lambda: harness.check_config(task.agent.config), prefix)
    _field(task, "builder.config", lambda: builder.check_config(task.builder.config), prefix)
    _field(task, "evaluator.config", lambda: evaluator.check_config(task.evaluator.config), prefix)
    script = task.metadata.get(SCRIPT_KEY)
    if script is not None:
        _field(task, "metadata.script", lambda: inline_script(script), prefix)


def _field(task: TaskRequest, where: str, check: Callable[[], T], prefix: str = "") -> T:
    try:
        return check()
    except (ConfigError, UnknownComponentError) as exc:
        raise type(exc)(f"{prefix}task {task.task_id!r}: {where}: {exc}") from exc
