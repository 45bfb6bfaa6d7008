"""``prefix_merging``: one token-faithful trace per prefix chain (paper section 3.4.2).

Within a chain of completions ``c_1 .. c_K`` (``chains.partition``, under the config's ``merge`` rule) the trace is
``p_1 ‖ a_1 ‖ u_1 ‖ a_2 ‖ ... ‖ a_K``:

* ``a_m`` — the tokens ``c_m`` sampled, verbatim (loss mask 1, their sampled logprobs).
* ``u_m`` — the interstitial tokens of ``p_{m+1}`` (tool results, the next user turn, the generation prompt), loss
  mask 0 with placeholder logprob entries. Under ``merge: exact`` (the default) ``p_{m+1}`` starts with
  ``p_m ‖ a_m``, so ``u_m`` is the rest of it and the trace before each ``a_m`` is exactly ``p_m``. Under
  ``merge: prompt_prefix`` ``p_{m+1}`` holds the chat template's re-rendering of ``a_m``, which may differ
  (re-serialized tool arguments, dropped reasoning); ``u_m`` starts after the first end-of-turn token that follows
  ``p_m`` (at it, when ``a_m`` was cut before one, so the template's closing is kept, untrained). Where the
  re-rendering differed, the later completions of the chain sit in a context they were not sampled in: the trace
  says so (``Trace.context_exact`` and, per completion, ``metadata["context_exact"]``).

Unlike the reference implementation, a completion that fails the prefix check is never dropped or truncated: it
starts (or later continues) another chain, so every sampled token lands in exactly one trace. Each trace records its
chain's role (``roles.chain_roles``: main, subagent or side).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from polar_cli.builders.base import TraceBuilder
from polar_cli.builders.chains import BREAK_CAUSES, Chain, partition
from polar_cli.builders.common import (
    base_metadata,
    finish,
    make_trace,
    ordered_completions,
    placeholder_entries,
    policy_versions,
    sampled_entries,
)
from polar_cli.builders.config import BuilderConfig
from polar_cli.builders.end_of_turn import end_of_turn
from polar_cli.builders.roles import chain_roles, harness_adapter
from polar_cli.interfaces.builder import BuildContext
from polar_cli.interfaces.harness import RoleVerdict
from polar_cli.models import Completion, TokenLogprob, Trace, Trajectory


class PrefixMergingBuilder(TraceBuilder):
    """Merge completions whose prompts extend each other into one trace per chain."""

    name = "prefix_merging"
    description = "one trace per strict-prefix chain: sampled tokens trainable, template interstitials masked"

    def _build(self, completions: list[Completion], cfg: BuilderConfig, context: BuildContext) -> Trajectory:
        ordered = ordered_completions(completions, cfg, self.name)
        # an empty session merges nothing: it needs no end-of-turn id
        eot = end_of_turn(cfg, self.name, context=context, completions=ordered) if ordered else None
        eot_ids = eot.ids if eot is not None else frozenset()
        meta = base_metadata(context, ordered, self.name)
        if eot is not None:
            meta["end_of_turn_source"] = eot.source
        parts = partition(ordered, eot_ids, cfg.merge)
        roles = chain_roles(parts, ordered, harness_adapter(meta["harness"]))
        traces = [
            merge_chain(i, chain, ordered, meta, role)
            for i, (chain, role) in enumerate(zip(parts.chains, roles, strict=True))
        ]
        causes = Counter(b.cause for b in parts.breaks)
        stats = {
            "builder": self.name,
            "merge": cfg.merge,
            "end_of_turn_ids": sorted(eot_ids),
            "end_of_turn_source": eot.source if eot is not None else None,
            "completions": len(ordered),
            "chains": len(parts.chains),
            "traces": len(traces),
            "completions_per_chain": [len(chain.members) for chain in parts.chains],
            "chain_roles": [role.role for role in roles],
            "trainable_tokens": sum(sum(t.loss_mask) for t in traces),
            "interstitial_tokens": sum(len(t.loss_mask) - sum(t.loss_mask) for t in traces),
            "context_inexact_completions": sum(t.metadata["context_exact"].count(False) for t in traces),
            "prefix_breaks": len(parts.breaks),
            "prefix_break_causes": {cause: causes[cause] for cause in BREAK_CAUSES if causes[cause]},
            "breaks": [b.as_dict() for b in parts.breaks],
        }
        return finish(meta["session_id"], context.status, traces, stats)


def merge_chain(
    number: int,
    chain: Chain,
    ordered: list[Completion],
    meta: dict[str, Any],
    role: RoleVerdict | None = None,
) -> Trace:
    """The trace ``p_1 ‖ a_1 ‖ u_1 ‖ ... ‖ a_K`` of one chain, with whether each ``a_m`` follows exactly ``p_m``."""
    members = [ordered[pos] for pos in chain.members]
    first, last = members[0], members[-1]
    response_ids: list[int] = []
    loss_mask: list[int] = []
    with_logprobs = all(c.response_logprobs is not None for c in members)
    entries: list[TokenLogprob] | None = [] if with_logprobs else None
    starts: list[int] = []
    exact = [True]  # the first completion's context is its own prompt
    for k, c in enumerate(members):
        sampled = c.response_ids
        starts.append(len(response_ids))
        response_ids += sampled
        loss_mask += [1] * len(sampled)
        if entries is not None:
            entries += sampled_entries(c)
        if k + 1 == len(members):
            break
        following = members[k + 1].prompt_ids
        resume = chain.resume[k]
        # the trace so far is p_k ‖ a_k when c was exact; it goes on with following[resume:], so the next completion's
        # context is its prompt exactly when the ids its prompt holds for this turn are the ones c sampled
        exact.append(exact[-1] and following[len(c.prompt_ids) : resume] == sampled)
        interstitial = following[resume:]
        response_ids += interstitial
        loss_mask += [0] * len(interstitial)
        if entries is not None:
            entries += placeholder_entries(interstitial)
    if len(last.request_messages) >= len(first.request_messages):
        response_messages = [*last.request_messages[len(first.request_messages) :], last.response_message]
    else:  # message history shrank although tokens extend: keep what each call answered
        response_messages = [c.response_message for c in members]
    return make_trace(
        prompt_ids=list(first.prompt_ids),
        response_ids=response_ids,
        loss_mask=loss_mask,
        entries=entries,
        prompt_messages=first.request_messages,
        response_messages=response_messages,
        tools=first.request_tools,
        finish_reason=last.finish_reason,
        metadata={
            **meta,
            "chain": number,
            "completion_ids": [c.completion_id for c in members],
            "completion_indices": [c.index for c in members],
            "context_exact": exact,
            "token_source": "retokenized" if any(c.token_source == "retokenized" for c in members) else "backend",
        },
        versions=policy_versions(members, starts),
        role=role,
        context_exact=all(exact),
    )
