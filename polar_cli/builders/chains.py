"""Partition a session's completions into prefix chains (paper section 3.4.2).

A completion joins a chain when three things hold for the chain's last completion ``L``:

1. ``L``'s prompt is a strict token prefix of the new prompt (the rule of the paper);
2. the extension holds an end-of-turn token, so ``L``'s turn was closed in the re-rendered history;
3. the history does not demonstrably continue a sibling instead: when the extension does not start with ``L``'s
   sampled tokens and another completion had ``L``'s exact prompt (a parallel sample), the new request must not
   replay that sibling's tokens or response message unless it also replays ``L``'s (``evidence.continues``). The
   paper's rule alone would append a call that continues one parallel sample to another sample's chain.

When several chains qualify the longest last prompt wins (ties: see ``_break_tie``). Otherwise the completion starts
a new chain, so no completion is ever dropped: sub-agents, parallel branches, compaction and chat templates that
rewrite history simply yield more chains.

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

from polar_cli.builders.evidence import continues, first_message, messages_extend
from polar_cli.models import Completion

# Why a completion could not continue the chain closest to it.
SAME_PROMPT = "same_prompt"  # a prompt the chain already had: parallel samples, retries
NO_END_OF_TURN = "no_end_of_turn"  # strict prefix, but the extension never closes the previous turn
OTHER_BRANCH = "other_branch"  # strict prefix, but the history continues another response than the chain's last
HISTORY_RERENDERED = "history_rerendered"  # same messages, different tokens: the template rewrote earlier turns
HISTORY_REWRITTEN = "history_rewritten"  # messages changed: compaction, truncation, edited history
NEW_CONTEXT = "new_context"  # nothing in common with any chain: a sub-agent or an unrelated conversation
BREAK_CAUSES = (SAME_PROMPT, NO_END_OF_TURN, OTHER_BRANCH, HISTORY_RERENDERED, HISTORY_REWRITTEN, NEW_CONTEXT)


@dataclass
class Chain:
    """Positions (into the ordered completions) of one chain's members, and where each joiner's turn closed."""

    members: list[int] = field(default_factory=list)
    # eot_positions[k]: in members[k + 1]'s prompt, the index of the first end-of-turn token after members[k]'s prompt.
    eot_positions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PrefixBreak:
    """A completion that started a new chain (other than the session's first), and why."""

    completion_index: int
    completion_id: str
    chain: int
    cause: str
    closest_chain: int | None
    common_prefix: int
    closest_prompt_tokens: int

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


def partition(completions: Sequence[Completion], eot_ids: frozenset[int]) -> Partition:
    """Assign each completion, in order, to a chain; record a PrefixBreak for each chain after the first."""
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
        matches: list[tuple[int, int]] = []  # (chain, end-of-turn position)
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
            last = chains[ci].members[-1]
            if eot < 0 or not continues(completions[last], completion, eot_ids, siblings(last)):
                continue
            if n > best_len:
                best_len, matches = n, []
            matches.append((ci, eot))
        by_length.setdefault(size, []).append(pos)
        if matches:
            ci, eot = matches[0] if len(matches) == 1 else _break_tie(matches, chains, completions, completion)
            chains[ci].members.append(pos)
            chains[ci].eot_positions.append(eot)
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


def _break_tie(
    matches: list[tuple[int, int]], chains: list[Chain], completions: Sequence[Completion], new: Completion
) -> tuple[int, int]:
    """Several chains end in the same prompt and all pass ``continues`` (identical sibling responses, or no evidence
    either way): prefer more of the chain's sampled tokens at the start of the extension, then recency."""

    def score(match: tuple[int, int]) -> tuple[int, int]:
        last_pos = chains[match[0]].members[-1]
        last = completions[last_pos]
        return common_prefix_len(last.response_ids, new.prompt_ids[len(last.prompt_ids) :]), last_pos

    return max(matches, key=score)


def _diagnose(
    completion: Completion,
    new_chain: int,
    chains: list[Chain],
    last_prompt: list[list[int]],
    completions: Sequence[Completion],
    eot_ids: frozenset[int],
) -> PrefixBreak:
    """Why ``completion`` continues no chain, judged against the chain sharing the most prompt tokens with it."""
    prompt = completion.prompt_ids
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
    elif messages_extend(last, completion):
        cause = HISTORY_RERENDERED
    elif first_message(last) != first_message(completion):
        cause = NEW_CONTEXT
    else:
        cause = HISTORY_REWRITTEN
    return PrefixBreak(
        completion_index=completion.index,
        completion_id=completion.completion_id,
        chain=new_chain,
        cause=cause,
        closest_chain=closest,
        common_prefix=common,
        closest_prompt_tokens=len(prev),
    )


def _seen_in(prompt: list[int], chain: Chain, completions: Sequence[Completion]) -> bool:
    return any(len(p := completions[pos].prompt_ids) == len(prompt) and p == prompt for pos in chain.members)
