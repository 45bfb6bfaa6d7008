"""A task's sampling (``agent.sampling``) forced onto every model call of its sessions, and the one warning a task
gets when the logprobs its completions record are not those of the distribution its tokens were sampled from."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from polar_cli.models.inference import LogprobsMode
from polar_cli.models.task import SamplingSpec

log = logging.getLogger("polar.proxy")

_REPLACED = ("temperature", "top_p", "top_k", "seed")
_RESHAPES: dict[str, Callable[[float], bool]] = {
    "temperature": lambda v: v != 1,
    "top_p": lambda v: v < 1,
    "top_k": lambda v: v >= 1,
    "min_p": lambda v: v > 0,
    "presence_penalty": lambda v: v != 0,
    "frequency_penalty": lambda v: v != 0,
    "repetition_penalty": lambda v: v != 1,
}
"""Which values of a sampling param make the sampled distribution differ from the model's raw one."""


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def apply_sampling(params: dict[str, Any], spec: SamplingSpec) -> None:
    """Force ``spec`` onto one call's ``ChatRequest.params``, where every codec puts what the harness asked under
    OpenAI chat names (Anthropic ``max_tokens``, Responses ``max_output_tokens``, Google ``maxOutputTokens`` all become
    ``max_tokens``): its values replace the harness's, and ``max_tokens`` caps the harness's (or is the value when the
    harness sent none)."""
    for name in _REPLACED:
        value = getattr(spec, name)
        if value is not None:
            params[name] = value
    cap = spec.max_tokens
    if cap is not None:
        asked = params.get("max_tokens")
        params["max_tokens"] = min(asked, cap) if _number(asked) else cap


def reshaping(params: Mapping[str, Any]) -> list[str]:
    """The settings of a call (as sent upstream) under which the sampled distribution is not the model's raw one,
    e.g. ``["temperature 0.7"]``; empty when none is known to (an unset value is the server's default)."""
    return [
        f"{name} {value:g}"
        for name, reshapes in _RESHAPES.items()
        if _number(value := params.get(name)) and reshapes(value)
    ]


class RawLogprobsWarning:
    """Warns once per task (``metadata.task_id``, else the session id) that samples from a reshaped distribution
    (:func:`reshaping`) while the backend records raw logprobs. The tasks already warned about are remembered up to
    ``remember`` of them, the most recent: a task's sessions run close together, so that is once per task."""

    def __init__(self, remember: int = 4096) -> None:
        self.remember = remember
        self._warned: OrderedDict[str, None] = OrderedDict()

    def check(self, task: str, params: Mapping[str, Any], logprobs_mode: LogprobsMode | None) -> bool:
        """Warn if this call records raw logprobs of a reshaped distribution and ``task`` was not warned about yet;
        whether it warned."""
        if logprobs_mode != "raw" or task in self._warned:
            return False
        settings = reshaping(params)
        if not settings:
            return False
        self._warned[task] = None
        if len(self._warned) > self.remember:
            self._warned.popitem(last=False)
        log.warning(
            "task %s samples with %s, but the backend returns raw logprobs: the logprobs its completions record are "
            "the model's raw distribution, not the one its tokens were sampled from (logprobs_mode 'raw'). To record "
            "the sampling distribution, start vLLM with `--logprobs-mode processed_logprobs` and give Polar's vllm "
            "backend the option `logprobs_mode: processed`; or sample at temperature 1 (agent.sampling.temperature: 1) "
            "without top_p, top_k, min_p or penalties.",
            task,
            ", ".join(settings),
        )
        return True
