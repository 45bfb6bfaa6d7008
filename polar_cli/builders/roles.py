"""Chain roles and who gets a session's reward (docs/builders.md, "Chain roles").

Each chain of a session (see ``chains.partition``) gets a role from its first completion, in this order:

1. the harness adapter knows the call by its shape (``Harness.chain_role``: by default a system prompt among its
   ``side_prompts``, such as Qwen Code's memory extraction agent or a title call): its verdict, usually ``side``;
2. the first chain the adapter left alone is ``main``: a harness starts its own conversation for the task before
   anything it delegates, so the first call it does not call its own is the main agent's;
3. a chain that broke off another chain for any cause but ``new_context`` (a retry or parallel sample of the same
   prompt, compaction, a re-rendered history, a cut reply, another branch) continues that chain's conversation: its
   role;
4. any other new context is ``subagent``: a conversation the agent started to do part of the task (Claude Code's
   Agent tool, Qwen Code's agent tool). The safe default: under the default rule it is rewarded as before roles
   existed, and a real sub-agent taken for a side call would silently lose its training signal, while a side call
   the adapter does not know yet stays visible (``role_reason`` says no adapter recognised it).

:func:`assign_rewards` then gives the session's reward to the roles ``EvaluatorSpec.reward_to`` names and marks the
others not trainable.
"""

from __future__ import annotations

from collections.abc import Sequence

from polar_cli.builders.chains import NEW_CONTEXT, Partition
from polar_cli.errors import UnknownComponentError
from polar_cli.interfaces.harness import Harness, RoleVerdict
from polar_cli.models import ChainRole, Completion, RewardAssignment, Trajectory

REWARDED: dict[RewardAssignment, frozenset[ChainRole]] = {
    "main": frozenset({"main"}),
    "main+subagents": frozenset({"main", "subagent"}),
    "all": frozenset({"main", "subagent", "side"}),
}
"""The roles each ``reward_to`` rule rewards (and trains on)."""

DEFAULT_REWARD_TO: RewardAssignment = "main+subagents"


def harness_adapter(name: str | None) -> Harness | None:
    """The registered adapter of harness ``name``; None without a name or when none is registered under it (loose
    completions built through the Python API), so the builder's own evidence decides alone."""
    if not name:
        return None
    from polar_cli.registry import get_harness  # the registry imports plugins, which import the builders

    try:
        return get_harness(name)
    except UnknownComponentError:
        return None


def chain_roles(parts: Partition, ordered: Sequence[Completion], harness: Harness | None) -> list[RoleVerdict]:
    """The role of each chain of ``parts`` (``ordered``: the completions the partition indexes), by the rules of this
    module's docstring."""
    breaks = {b.chain: b for b in parts.breaks}
    verdicts: list[RoleVerdict] = []
    main: int | None = None
    for number, chain in enumerate(parts.chains):
        first = ordered[chain.members[0]]
        verdict = harness.chain_role(first) if harness is not None else None
        cut = breaks.get(number)
        if verdict is None and main is None:
            verdict = RoleVerdict("main", "the session's first chain" if number == 0 else
                                  "the first chain the harness adapter did not call its own")  # fmt: skip
        elif verdict is None and cut is not None and cut.cause != NEW_CONTEXT and cut.closest_chain is not None:
            role = verdicts[cut.closest_chain].role
            verdict = RoleVerdict(role, f"continues chain {cut.closest_chain} ({role}) after a {cut.cause} break")
        elif verdict is None:
            verdict = RoleVerdict("subagent", "a new context beside the main chain that the harness adapter does not "
                                  "call its own (a sub-agent)")  # fmt: skip
        if verdict.role == "main" and main is None:
            main = number
        verdicts.append(verdict)
    return verdicts


def completion_roles(parts: Partition, ordered: Sequence[Completion], harness: Harness | None) -> list[RoleVerdict]:
    """The role of each completion of ``ordered``: its chain's (for builders that make one trace per completion)."""
    roles: list[RoleVerdict | None] = [None] * len(ordered)
    for chain, verdict in zip(parts.chains, chain_roles(parts, ordered, harness), strict=True):
        for pos in chain.members:
            roles[pos] = verdict
    assert all(r is not None for r in roles)  # a partition places every completion
    return [r for r in roles if r is not None]


def rewarded(role: ChainRole | None, reward_to: RewardAssignment) -> bool:
    """Whether a trace of ``role`` gets the session's reward under ``reward_to``; a trace without a role (built
    before roles existed) always does, as it did then."""
    return role is None or role in REWARDED[reward_to]


def assign_rewards(trajectory: Trajectory, reward: float | None, reward_to: RewardAssignment) -> Trajectory:
    """A copy of ``trajectory`` whose traces the rule ``reward_to`` includes have a reward (one the evaluator gave the
    trace itself, else ``reward``, the session's) and ``trainable`` True, and whose other traces have reward None and
    ``trainable`` False. Pure: ``trajectory`` is not changed."""
    traces = []
    for trace in trajectory.traces:
        if rewarded(trace.role, reward_to):
            update = {"reward": trace.reward if trace.reward is not None else reward, "trainable": True}
        else:
            update = {"reward": None, "trainable": False}
        traces.append(trace.model_copy(update=update))
    return trajectory.model_copy(update={"traces": traces})
