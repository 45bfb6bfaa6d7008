"""The ``preferences`` config: an accepted and a rejected session of the same task (instance), for DPO, in TRL's
conversational preference format (``prompt``, ``chosen``, ``rejected``: lists of messages).

- **Pairs.** Per task, its accepted sessions and its rejected ones (completed and graded, not accepted; a session that
  errored, timed out or was cancelled is not a fair "rejected") are each shuffled with ``random.Random(f"{seed}:{task
  id}")`` and zipped: ``min(accepted, rejected)`` pairs, each session in one pair at most. The same ledger and seed
  give the same pairs. A task run once (``--samples 1``) has no pair.
- **Rows.** ``prompt`` is the chosen session's messages before its first assistant message (system prompt and
  instruction); ``chosen`` the rest of it, ``rejected`` the rejected session's messages after its own leading
  non-assistant ones. ``tools`` (JSON text) is the chosen session's.
- **Filters and split.** A pair goes to its chosen session's split (train or test); a pair whose chosen session the
  export's filters drop is not written. Rejected sessions are paired whatever the filters (``--accepted-only`` drops
  them from ``traces`` and ``messages``, not from here).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from polar_cli.generate.ledger import ResultRow

Key = tuple[str, int]
"""A session: (task_id, sample_index)."""


@dataclass(frozen=True)
class Pair:
    chosen: Key
    rejected: Key


def is_rejected(row: ResultRow) -> bool:
    """A session that ran to the end and was graded, and is not accepted."""
    return not row.accepted and row.status == "completed" and row.reward is not None and row.turns > 0


def pair_sessions(rows: Iterable[ResultRow], seed: int) -> list[Pair]:
    """The pairs of ``rows`` (see the module docstring), task by task in the rows' order."""
    sides: dict[str, tuple[list[int], list[int]]] = {}
    for row in rows:
        accepted, rejected = sides.setdefault(row.task_id, ([], []))
        if row.accepted:
            accepted.append(row.sample_index)
        elif is_rejected(row):
            rejected.append(row.sample_index)
    pairs: list[Pair] = []
    for task_id, (accepted, rejected) in sides.items():
        rng = random.Random(f"{seed}:{task_id}")
        accepted, rejected = sorted(accepted), sorted(rejected)
        rng.shuffle(accepted)
        rng.shuffle(rejected)
        pairs += [Pair((task_id, a), (task_id, r)) for a, r in zip(accepted, rejected, strict=False)]
    return pairs


def _prompt_length(messages: list[dict[str, Any]]) -> int:
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))


def preference_row(chosen: Mapping[str, Any], rejected: Mapping[str, Any]) -> dict[str, Any]:
    """The ``preferences`` row of two ``messages`` rows of the same task."""
    chosen_messages, rejected_messages = list(chosen["messages"]), list(rejected["messages"])
    n = _prompt_length(chosen_messages)
    return {
        "instance_id": chosen["instance_id"], "task_id": chosen["task_id"], "group": chosen["group"],
        "repo": chosen["repo"], "prompt": chosen_messages[:n], "chosen": chosen_messages[n:],
        "rejected": rejected_messages[_prompt_length(rejected_messages):], "tools": chosen["tools"],
        "chosen_session_id": chosen["session_id"], "rejected_session_id": rejected["session_id"],
        "chosen_reward": chosen["reward"], "rejected_reward": rejected["reward"], "metadata": chosen["metadata"],
    }  # fmt: skip
