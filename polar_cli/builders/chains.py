"""Partition a session's completions into prefix chains (paper section 3.4.2), under one of two join rules.

``exact`` (the default): a completion joins a chain when its prompt starts with the chain's last prompt followed by
exactly the ids that last completion sampled (end-of-turn included when sampled), so the trace built from the chain
is, before each completion's sampled tokens, the very context it was sampled in. A reply that was cut (finish reason
``length``, or no end-of-turn id at its end) is not continued: the harness sent it back as text, which the template
re-rendered and closed. The one exception is a tokens-mode prompt that spliced that cut reply in as its exact ids
(a ``spliced`` prompt span of it, right after its prompt).

``prompt_prefix`` (the paper's rule, looser): a completion joins when, for the chain's last completion ``L``:

1. ``L``'s prompt is a strict token prefix of the new prompt;
2. the extension holds an end-of-turn token, so ``L``'s turn was closed in the re-rendered history;
3. the history does not demonstrably continue a sibling instead: when the extension does not start with ``L``'s
   sampled tokens and another completion had ``L``'s exact prompt (a parallel sample), the new request must not
   replay that sibling's tokens or response message unless it also replays ``L``'s (``evidence.continues``). The
   paper's rule alone would append a call that continues one parallel sample to another sample's chain.

The trace then holds ``L``'s sampled ids where the new prompt held the template's re-rendering of them, which can
differ: ``prefix_merging`` records which completions sit in a context other than their prompt (``context_exact``).

Under either rule, when several chains qualify the longest match wins (ties: see ``_break_tie``). Otherwise the
completion starts a new chain, so no completion is ever dropped: sub-agents, parallel branches, compaction and chat
templates that rewrite history simply yield more chains, and each break records its cause and where the new prompt
departs from the closest chain's last prompt and sampled ids.

Cost is linear in prompt tokens: each prompt is serialized once (orjson, a few ns per token) and each prefix check is
then one ``bytes.startswith`` (memcmp) on those serializations, which is exact for lists of ints (see ``prefix_key``).
The end-of-turn search scans only the extension, and the slower diagnostics (break causes, tie-breaks) run only when
a chain starts or a tie occurs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from polar_cli.builders.config import MergeRule
from polar_cli.builders.evidence import continues, first_message, messages_extend
from polar_cli.models import Completion

# Why a completion could not continue the chain closest to it.
SAME_PROMPT = "same_prompt"  # a prompt the chain already had: parallel samples, retries
NO_END_OF_TURN = "no_end_of_turn"  # strict prefix, but the extension never closes the previous turn
OTHER_BRANCH = "other_branch"  # strict prefix, but the history continues another response than the chain's last
TRUNCATED_REPLY = "truncated_reply"  # the previous reply was cut (max_tokens): sent back as text, not as sampled
REASONING_DROPPED = "reasoning_dropped"  # tokens mode: earlier reasoning left out of the prompt, as the template does
HISTORY_RERENDERED = "history_rerendered"  # same messages, different tokens: the template rewrote earlier turns
HISTORY_REWRITTEN = "history_rewritten"  # messages changed: compaction, truncation, edited history
NEW_CONTEXT = "new_context"  # nothing in common with any chain: a sub-agent or an unrelated conversation
BREAK_CAUSES = (SAME_PROMPT, NO_END_OF_TURN, OTHER_BRANCH, TRUNCATED_REPLY, REASONING_DROPPED, HISTORY_RERENDERED,
                HISTORY_REWRITTEN, NEW_CONTEXT)  # fmt: skip
RUN_WINDOW = 32
"""How many tokens of each run a break records from where the new prompt departs (``PrefixBreak.expected_ids``)."""


@dataclass
class Chain:
    """Positions (into the ordered completions) of one chain's members, and where the trace resumes each joiner's
    prompt."""

    members: list[int] = field(default_factory=list)
    # resume[k]: the index in members[k + 1]'s prompt where its interstitial starts, after members[k]'s sampled ids.
    # exact: right after members[k]'s prompt and sampled ids; prompt_prefix: after the first end-of-turn token that
    # follows members[k]'s prompt (at it, when members[k]'s reply did not end with one: the template's closing).
    resume: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PrefixBreak:
    """A completion that started a new chain (other than the session's first), and why.

    ``first_difference`` indexes the new prompt where it departs from the closest chain's last prompt followed by the
    ids that last completion sampled; ``expected_ids`` and ``found_ids`` are the two runs from there (at most
    ``RUN_WINDOW`` tokens each; ``found_ids`` empty where the new prompt ends first)."""

    completion_index: int
    completion_id: str
    chain: int
    cause: str
    closest_chain: int | None
    common_prefix: int
    closest_prompt_tokens: int
    first_difference: int
    expected_ids: list[int]
    found_ids: list[int]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Partition:
    chains: list[Chain]
    breaks: list[PrefixBreak]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by halving slice comparisons (C speed, about 2n element checks)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def prefix_key(ids: Sequence[int]) -> bytes:
    """Bytes such that ``serialized(p).startswith(prefix_key(q))`` iff ``q`` is a prefix of ``p`` and, when ``q`` is not
    empty, ``p`` is longer: ``serialized`` is ``orjson.dumps``, whose ints are canonical decimals between commas, so a
    match covers whole tokens only. (``[1, 2]`` gives ``b"[1,2,"``; ``[]`` gives ``b"["``.)"""
    return _key_of(orjson.dumps(ids), len(ids))


def first_end_of_turn(prompt: list[int], start: int, eot_ids: frozenset[int]) -> int:
    """Index of the first end-of-turn token at or after ``start``, or -1. Scans only ``prompt[start:]``."""
    best = -1
    stop = len(prompt)
    for eot in eot_ids:
        try:
            pos = prompt.index(eot, start, stop)
        except ValueError:
            continue
        best = pos
        stop = pos  # a later id only needs to look before the best match so far
    return best


def cut_reply(completion: Completion, eot_ids: frozenset[int]) -> bool:
    """The reply was cut: finish reason ``length``, or its sampled ids do not end with an end-of-turn id (with no
    end-of-turn id known, only ``length`` says so)."""
    if completion.finish_reason == "length":
        return True
    sampled = completion.response_ids
    return bool(eot_ids) and not (sampled and sampled[-1] in eot_ids)


def splices(new: Completion, last: Completion) -> bool:
    """``new`` is a tokens-mode prompt that spliced ``last``'s sampled ids in right after ``last``'s prompt."""
    if new.token_mode != "tokens" or not new.prompt_spans:
        return False
    start = len(last.prompt_ids)
    return any(s.source == "spliced" and s.completion_id == last.completion_id and s.start == start
               for s in new.prompt_spans)  # fmt: skip


def partition(completions: Sequence[Completion], eot_ids: frozenset[int], merge: MergeRule = "exact") -> Partition:
    """Assign each completion, in order, to a chain under ``merge``; record a PrefixBreak for each chain after the
    first."""
    if merge == "prompt_prefix":
        return _partition_prompt_prefix(completions, eot_ids)
    return _partition_exact(completions, eot_ids)


def _partition_exact(completions: Sequence[Completion], eot_ids: frozenset[int]) -> Partition:
    chains: list[Chain] = []
    # per chain, hot in the loop: its last completion, the length of that one's prompt + sampled ids, and their key
    last_of: list[Completion] = []
    expected_len: list[int] = []
    expected_key: list[bytes] = []
    breaks: list[PrefixBreak] = []
    for pos, completion in enumerate(completions):
        prompt = completion.prompt_ids
        size = len(prompt)
        serialized = orjson.dumps(prompt)
        matches: list[tuple[int, int]] = []  # (chain, where the interstitial starts)
        best_len = -1
        for ci, last in enumerate(last_of):
            n = expected_len[ci]
            if n > size or n < best_len:
                continue
            if n == size:  # no extension at all: only equality continues
                if prompt != last.prompt_ids + last.response_ids:
                    continue
            elif not serialized.startswith(expected_key[ci]):
                continue
            if cut_reply(last, eot_ids) and not splices(completion, last):
                continue
            if n > best_len:
                best_len, matches = n, []
            matches.append((ci, n))
        key = _extended_key(serialized, size, completion.response_ids)
        if matches:
            ci, at = matches[0] if len(matches) == 1 else _break_tie(matches, chains, completions, completion)
            chains[ci].members.append(pos)
            chains[ci].resume.append(at)
            last_of[ci], expected_len[ci], expected_key[ci] = completion, size + len(completion.response_ids), key
            continue
        if chains:
            breaks.append(_diagnose_exact(completion, len(chains), chains, last_of, completions, eot_ids))
        chains.append(Chain(members=[pos]))
        last_of.append(completion)
        expected_len.append(size + len(completion.response_ids))
        expected_key.append(key)
    return Partition(chains=chains, breaks=breaks)


def _partition_prompt_prefix(completions: Sequence[Completion], eot_ids: frozenset[int]) -> Partition:
    chains: list[Chain] = []
    last_prompt: list[list[int]] = []  # per chain, hot in the loop
    last_key: list[bytes] = []  # per chain, prefix_key(last_prompt[ci])
    breaks: list[PrefixBreak] = []
    by_length: dict[int, list[int]] = {}  # prompt length -> positions seen so far, to find parallel siblings

    def siblings(of: int) -> Callable[[], Iterator[Completion]]:
        prompt = completions[of].prompt_ids
        return lambda: (completions[q] for q in by_length.get(len(prompt), ()) if completions[q].prompt_ids == prompt)

    for pos, completion in enumerate(completions):
        prompt = completion.prompt_ids
        size = len(prompt)
        serialized = orjson.dumps(prompt)
        matches: list[tuple[int, int]] = []  # (chain, where the interstitial starts)
        best_len = -1
        for ci, prev in enumerate(last_prompt):
            n = len(prev)
            if n >= size or n < best_len:
                continue
            # Cheap rejections before the full comparison; the ends differ first when histories diverge.
            if n and (prompt[n - 1] != prev[n - 1] or prompt[0] != prev[0]):
                continue
            if not serialized.startswith(last_key[ci]):  # == (prompt[:n] == prev), given n < size
                continue
            eot = first_end_of_turn(prompt, n, eot_ids)
            last = completions[chains[ci].members[-1]]
            if eot < 0 or not continues(last, completion, eot_ids, siblings(chains[ci].members[-1])):
                continue
            if n > best_len:
                best_len, matches = n, []
            closed = bool(last.response_ids) and last.response_ids[-1] in eot_ids
            matches.append((ci, eot + 1 if closed else eot))  # a cut reply: the template's closing stays, untrained
        by_length.setdefault(size, []).append(pos)
        if matches:
            ci, at = matches[0] if len(matches) == 1 else _break_tie(matches, chains, completions, completion)
            chains[ci].members.append(pos)
            chains[ci].resume.append(at)
            last_prompt[ci] = prompt
            last_key[ci] = _key_of(serialized, size)
            continue
        if chains:
            breaks.append(_diagnose(completion, len(chains), chains, last_prompt, completions, eot_ids))
        chains.append(Chain(members=[pos]))
        last_prompt.append(prompt)
        last_key.append(_key_of(serialized, size))
    return Partition(chains=chains, breaks=breaks)


def _key_of(serialized: bytes, size: int) -> bytes:
    """``prefix_key`` of a list from its ``orjson.dumps`` bytes, without serializing it again."""
    return serialized[:-1] + b"," if size else serialized[:-1]


def _extended_key(serialized: bytes, size: int, sampled: list[int]) -> bytes:
    """``prefix_key(prompt + sampled)`` from ``serialized`` (``orjson.dumps(prompt)``, ``size`` its length)."""
    if not sampled:
        return _key_of(serialized, size)
    tail = orjson.dumps(sampled)[1:-1] + b","
    return (serialized[:-1] + b"," + tail) if size else b"[" + tail


def _break_tie(
    matches: list[tuple[int, int]], chains: list[Chain], completions: Sequence[Completion], new: Completion
) -> tuple[int, int]:
    """Several chains end in the same prompt and all pass (identical sibling responses, or no evidence either way):
    prefer more of the chain's sampled tokens at the start of the extension, then recency."""

    def score(match: tuple[int, int]) -> tuple[int, int]:
        last_pos = chains[match[0]].members[-1]
        last = completions[last_pos]
        return common_prefix_len(last.response_ids, new.prompt_ids[len(last.prompt_ids) :]), last_pos

    return max(matches, key=score)


def _diagnose_exact(
    completion: Completion,
    new_chain: int,
    chains: list[Chain],
    last_of: list[Completion],
    completions: Sequence[Completion],
    eot_ids: frozenset[int],
) -> PrefixBreak:
    """Why ``completion`` continues no chain under the exact rule, judged against the chain whose last prompt and
    sampled ids share the most tokens with its prompt."""
    prompt = completion.prompt_ids
    dropped = _dropped_from(completion, last_of)
    if dropped is not None:
        last = last_of[dropped]
        common = common_prefix_len(last.prompt_ids, prompt)
        return _break(completion, new_chain, REASONING_DROPPED, dropped, last, common)
    expected = [last.prompt_ids + last.response_ids for last in last_of]
    common, closest = max((common_prefix_len(exp, prompt), ci) for ci, exp in enumerate(expected))  # ties: recent
    last = last_of[closest]
    n = len(last.prompt_ids)
    if common == 0:
        cause = NEW_CONTEXT
    elif common == len(prompt) and _seen_in(prompt, chains[closest], completions):
        cause = SAME_PROMPT
    elif common >= n and len(prompt) > n:  # it extends the last prompt, not with the ids sampled after it
        if first_end_of_turn(prompt, n, eot_ids) < 0:
            cause = NO_END_OF_TURN
        elif cut_reply(last, eot_ids):
            cause = TRUNCATED_REPLY
        elif not continues(last, completion, eot_ids, lambda: _same_prompt(last, completions, before=completion)):
            cause = OTHER_BRANCH
        else:
            cause = _by_messages(last, completion)
    else:
        cause = _by_messages(last, completion)
    return _break(completion, new_chain, cause, closest, last, common_prefix_len(last.prompt_ids, prompt))


def _diagnose(
    completion: Completion,
    new_chain: int,
    chains: list[Chain],
    last_prompt: list[list[int]],
    completions: Sequence[Completion],
    eot_ids: frozenset[int],
) -> PrefixBreak:
    """Why ``completion`` continues no chain under the prompt-prefix rule, judged against the chain sharing the most
    prompt tokens with it."""
    prompt = completion.prompt_ids
    dropped = _dropped_from(completion, [completions[chain.members[-1]] for chain in chains])
    if dropped is not None:
        common = common_prefix_len(last_prompt[dropped], prompt)
        last = completions[chains[dropped].members[-1]]
        return _break(completion, new_chain, REASONING_DROPPED, dropped, last, common)
    shared = [(common_prefix_len(prev, prompt), ci) for ci, prev in enumerate(last_prompt)]
    common, closest = max(shared)  # ties: the most recent chain
    prev = last_prompt[closest]
    last = completions[chains[closest].members[-1]]
    if common == 0:
        cause = NEW_CONTEXT
    elif common == len(prompt) and _seen_in(prompt, chains[closest], completions):
        cause = SAME_PROMPT
    elif common == len(prev) and len(prompt) > len(prev):
        cause = NO_END_OF_TURN if first_end_of_turn(prompt, len(prev), eot_ids) < 0 else OTHER_BRANCH
    else:
        cause = _by_messages(last, completion)
    return _break(completion, new_chain, cause, closest, last, common)


def _dropped_from(completion: Completion, last_of: Sequence[Completion]) -> int | None:
    """The chain whose last completion's reasoning a tokens-mode prompt left out on purpose (``keep_reasoning:
    false``: the proxy rendered the whole prompt instead of splicing that answer, ``metadata.token_prompt`` says
    ``reasoning_dropped`` and names it as ``base``), or None."""
    if completion.token_mode != "tokens":
        return None
    built = completion.metadata.get("token_prompt")
    if not isinstance(built, dict) or built.get("reasoning_dropped") is not True:
        return None
    base = built.get("base")
    return next((ci for ci, last in enumerate(last_of) if last.completion_id == base), None)


def _by_messages(last: Completion, completion: Completion) -> str:
    """The cause when the tokens do not continue ``last``: the messages say whether the template re-rendered the
    same history, the history changed, or it is another conversation."""
    if messages_extend(last, completion):
        return HISTORY_RERENDERED
    if first_message(last) != first_message(completion):
        return NEW_CONTEXT
    return HISTORY_REWRITTEN


def _break(
    completion: Completion, new_chain: int, cause: str, closest: int, last: Completion, common: int
) -> PrefixBreak:
    """The record of a break against chain ``closest`` (whose last completion is ``last``; ``common``: the prompt
    tokens the two share), with the runs from where the new prompt departs from ``last``'s prompt + sampled ids."""
    prompt = completion.prompt_ids
    expected = last.prompt_ids + last.response_ids
    at = common_prefix_len(expected, prompt)
    return PrefixBreak(
        completion_index=completion.index,
        completion_id=completion.completion_id,
        chain=new_chain,
        cause=cause,
        closest_chain=closest,
        common_prefix=common,
        closest_prompt_tokens=len(last.prompt_ids),
        first_difference=at,
        expected_ids=expected[at : at + RUN_WINDOW],
        found_ids=prompt[at : at + RUN_WINDOW],
    )


def _seen_in(prompt: list[int], chain: Chain, completions: Sequence[Completion]) -> bool:
    return any(len(p := completions[pos].prompt_ids) == len(prompt) and p == prompt for pos in chain.members)


def _same_prompt(completion: Completion, completions: Sequence[Completion], before: Completion) -> Iterator[Completion]:
    """The completions captured before ``before`` with ``completion``'s exact prompt (its parallel samples, itself
    included)."""
    prompt = completion.prompt_ids
    return (c for c in completions
            if c.index < before.index and len(c.prompt_ids) == len(prompt) and c.prompt_ids == prompt)  # fmt: skip
