"""``per_request``: one trace per recorded completion, with the role of the prefix chain it belongs to."""

from __future__ import annotations

from polar_cli.builders.base import TraceBuilder
from polar_cli.builders.chains import partition
from polar_cli.builders.common import (
    base_metadata,
    finish,
    make_trace,
    ordered_completions,
    policy_versions,
    sampled_entries,
)
from polar_cli.builders.config import BuilderConfig
from polar_cli.builders.end_of_turn import end_of_turn
from polar_cli.builders.roles import completion_roles, harness_adapter
from polar_cli.errors import BuildError
from polar_cli.interfaces.builder import BuildContext
from polar_cli.models import Completion, Trajectory


class PerRequestBuilder(TraceBuilder):
    """Each completion becomes a trace: its prompt, its sampled tokens (all trainable) and their logprobs."""

    name = "per_request"
    description = "one trace per model call: prompt ids, sampled ids, loss mask all 1, sampled logprobs"

    def _build(self, completions: list[Completion], cfg: BuilderConfig, context: BuildContext) -> Trajectory:
        ordered = ordered_completions(completions, cfg, self.name)
        meta = base_metadata(context, ordered, self.name)
        try:  # only for the roles: without end-of-turn ids every call is its own chain, which still says whose it is
            eot_ids = end_of_turn(cfg, self.name, context=context, completions=ordered).ids if ordered else frozenset()
        except BuildError:
            eot_ids = frozenset()
        roles = completion_roles(partition(ordered, eot_ids, cfg.merge), ordered, harness_adapter(meta["harness"]))
        traces = []
        for c, role in zip(ordered, roles, strict=True):
            traces.append(
                make_trace(
                    prompt_ids=list(c.prompt_ids),
                    response_ids=list(c.response_ids),
                    loss_mask=[1] * len(c.response_ids),
                    entries=None if c.response_logprobs is None else sampled_entries(c),
                    prompt_messages=c.request_messages,
                    response_messages=[c.response_message],
                    tools=c.request_tools,
                    finish_reason=c.finish_reason,
                    metadata={
                        **meta,
                        "completion_id": c.completion_id,
                        "completion_index": c.index,
                        "token_source": c.token_source,
                    },
                    versions=policy_versions([c], [0]),
                    role=role,
                )
            )
        stats = {
            "builder": self.name,
            "completions": len(ordered),
            "traces": len(traces),
            "trainable_tokens": sum(len(c.response_ids) for c in ordered),
            "missing_logprobs": sum(c.response_logprobs is None for c in ordered),
            "context_inexact_completions": 0,  # each trace is its completion's own prompt and sampled ids
        }
        return finish(meta["session_id"], context.status, traces, stats)
