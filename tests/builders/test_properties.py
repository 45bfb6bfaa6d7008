"""Property-based tests over generated sessions rendered with real HF tokenizers and chat templates.

Each generated session mixes multi-turn tool use (with the model's own argument spacing, which the template
re-serializes), reasoning blocks, truncated responses, parallel branches, interleaved sub-agents and compaction; half
are rendered with a template that drops earlier reasoning (which breaks the token prefix). For both builders the
independent ``verify`` must pass; for ``prefix_merging`` under either rule the chains must be exactly those of an oracle
that knows each call's true parent (``merge: prompt_prefix``: by the rendered text; ``exact``: by the parent's prompt
and sampled ids), each trace's ``context_exact`` must say, per completion, whether the tokens before its sampled
tokens are exactly its prompt, which under the exact rule they always are, and chains whose history re-renders
faithfully must reproduce the last prompt and response token for token.
"""

from __future__ import annotations

import itertools

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from polar_cli.builders import build_trajectory, verify
from polar_cli.builders.chains import BREAK_CAUSES, RUN_WINDOW, prefix_key
from polar_cli.models import Completion, Trace
from tests.builders.conftest import TokenizerCase
from tests.builders.sessions import DROP_REASONING_TEMPLATE, Simulator, Step, play

STEPS = st.one_of(
    st.just(("text",)),
    st.tuples(st.just("tools"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("reasoning_tools"), st.booleans()),
    st.just(("reasoning_text",)),
    st.tuples(st.just("truncated"), st.floats(0.1, 0.9)),
    st.tuples(st.just("branch"), st.integers(2, 3), st.integers(0, 2)),
    st.tuples(st.just("subagents"), st.integers(1, 3), st.integers(1, 3), st.booleans()),
    st.just(("compaction",)),
)
EVERYTHING: list[Step] = [
    ("tools", 1, True), ("reasoning_tools", False), ("text",), ("branch", 3, 1), ("subagents", 2, 2, True),
    ("truncated", 0.5), ("compaction",), ("tools", 2, False), ("reasoning_text",), ("reasoning_tools", True),
    ("subagents", 3, 2, False), ("text",),
]


def faithful(chain: list[Completion]) -> bool:
    """Every non-last turn re-renders, in the next prompt, exactly as sampled."""
    return all(
        b.prompt_ids[len(a.prompt_ids) : len(a.prompt_ids) + len(a.response_ids)] == a.response_ids
        and a.finish_reason != "length"
        for a, b in itertools.pairwise(chain)
    )


def contexts(trace: Trace, chain: list[Completion]) -> list[bool]:
    """For each completion of ``chain``, whether the trace's tokens before its sampled tokens (found by counting mask-1
    tokens, nothing else) are exactly its prompt."""
    tokens = [*trace.prompt_ids, *trace.response_ids]
    sampled = [len(trace.prompt_ids) + i for i, bit in enumerate(trace.loss_mask) if bit]
    out, k = [], 0
    for c in chain:
        assert c.response_ids, "the simulator samples at least one token a call"
        out.append(tokens[: sampled[k]] == c.prompt_ids)
        k += len(c.response_ids)
    return out


def check_session(case: TokenizerCase, plan: list[Step], seed: int, drop_reasoning: bool) -> None:
    sim = Simulator(case.tokenizer, chat_template=DROP_REASONING_TEMPLATE if drop_reasoning else None, seed=seed)
    comps = play(sim, plan)
    by_id = {c.completion_id: c for c in comps}
    sampled = sum(len(c.response_ids) for c in comps)

    per_request = build_trajectory("per_request", comps)
    assert len(per_request.traces) == len(comps)
    report = verify(per_request, comps)
    assert report.ok, report.violations

    assert all(t.context_exact for t in per_request.traces)
    for merge in ("exact", "prompt_prefix"):
        merged = build_trajectory("prefix_merging", comps, tokenizer=str(case.path), merge=merge)
        report = verify(merged, comps)
        assert report.ok, report.violations
        for trace in [*per_request.traces, *merged.traces]:  # one entry shape; text exactly on the sampled tokens
            entries = trace.response_logprobs or []
            assert all(list(e) == ["token", "token_id", "logprob"] for e in entries)
            assert [e["token"] is not None for e in entries] == [bool(m) for m in trace.loss_mask]
        assert report.placed_completions == len(comps) and report.trainable_tokens == sampled

        meta = merged.metadata
        chains = [t.metadata["completion_ids"] for t in merged.traces]
        assert chains == sim.expected_chains(exact=merge == "exact")
        assert meta["merge"] == merge
        assert meta["chains"] == meta["traces"] == len(merged.traces) == len(meta["completions_per_chain"])
        assert meta["prefix_breaks"] == len(chains) - 1
        assert set(meta["prefix_break_causes"]) <= set(BREAK_CAUSES)
        assert sum(meta["prefix_break_causes"].values()) == meta["prefix_breaks"]
        for b in meta["breaks"]:  # the runs are where the new prompt departs from the closest chain's
            prompt = by_id[b["completion_id"]].prompt_ids
            assert b["found_ids"] == prompt[b["first_difference"] :][:RUN_WINDOW]
            assert b["expected_ids"][:1] != b["found_ids"][:1] or not b["found_ids"]
        inexact = 0
        for trace, ids in zip(merged.traces, chains, strict=True):
            chain = [by_id[i] for i in ids]
            found = contexts(trace, chain)
            # the builder's own account of each completion's context is the truth, and under the exact rule it is
            # always its prompt: the tokens before each mask-1 run are exactly that completion's prompt_ids
            assert trace.metadata["context_exact"] == found and trace.context_exact == all(found)
            inexact += found.count(False)
            if merge == "exact":
                assert all(found)
            if merge == "exact" or faithful(chain):
                last = chain[-1]
                assert trace.prompt_ids + trace.response_ids == last.prompt_ids + last.response_ids
        assert meta["context_inexact_completions"] == inexact


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(STEPS, min_size=1, max_size=10), seed=st.integers(0, 2**16), drop_reasoning=st.booleans())
@example(plan=EVERYTHING, seed=0, drop_reasoning=False)
@example(plan=EVERYTHING, seed=1, drop_reasoning=True)
# A later parallel sample's prompt also extends the first prompt, whose chain ends in a sibling branch's response:
# it must not be appended to that sibling's chain.
@example(plan=[("branch", 2, 0), ("branch", 2, 0)], seed=0, drop_reasoning=False)
def test_generated_sessions_merge_and_verify(
    any_tokenizer: TokenizerCase, plan: list[Step], seed: int, drop_reasoning: bool
) -> None:
    check_session(any_tokenizer, plan, seed, drop_reasoning)


def test_the_everything_session_exercises_the_scenarios(demo_tokenizer: TokenizerCase) -> None:
    """Guards the generator: the scenarios really produce the situations the properties are about."""
    sim = Simulator(demo_tokenizer.tokenizer, chat_template=DROP_REASONING_TEMPLATE, seed=1)
    comps = play(sim, EVERYTHING)
    loose = build_trajectory("prefix_merging", comps, eos_token_id=demo_tokenizer.eot, merge="prompt_prefix")
    causes = loose.metadata["prefix_break_causes"]
    assert set(causes) == {"same_prompt", "history_rerendered", "history_rewritten", "new_context"}
    assert 0 < loose.metadata["context_inexact_completions"] < len(comps)
    merged = build_trajectory("prefix_merging", comps, eos_token_id=demo_tokenizer.eot)
    causes = merged.metadata["prefix_break_causes"]  # the exact rule also breaks at re-serialized arguments and cuts
    assert set(causes) == {"same_prompt", "truncated_reply", "history_rerendered", "history_rewritten", "new_context"}
    assert merged.metadata["context_inexact_completions"] == 0
    assert any(c.finish_reason == "length" for c in comps)
    assert any(not faithful([a, b]) for a, b in itertools.pairwise(comps) if a.metadata == b.metadata)
    assert max(loose.metadata["completions_per_chain"]) >= 5 and max(merged.metadata["completions_per_chain"]) >= 3


IDS = st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 20), max_size=12)


@given(IDS, IDS)
def test_prefix_key_matches_exactly_the_strict_list_prefixes(p: list[int], q: list[int]) -> None:
    """The byte-level prefix check of ``partition`` agrees with the list check it replaces."""
    by_bytes = orjson.dumps(p).startswith(prefix_key(q))
    assert by_bytes == (p[: len(q)] == q and (len(p) > len(q) or not q))
    assert orjson.dumps(p + q).startswith(prefix_key(p)) == (bool(q) or not p)
