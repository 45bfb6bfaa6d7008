"""Small hand-made traces and session results for the adapter tests."""

from __future__ import annotations

from typing import Any

from polar_cli.models import ChainRole, SessionResult, Trace, Trajectory, TrajectoryStatus


def make_trace(
    mask: list[int],
    *,
    logprobs: list[float] | None = None,
    prompt: list[int] | None = None,
    first_id: int = 100,
    role: ChainRole | None = "main",
    trainable: bool = True,
    reward: float | None = 1.0,
    finish: str | None = "stop",
    metadata: dict[str, Any] | None = None,
) -> Trace:
    """A trace with response ids ``first_id, first_id+1, ...`` and, unless ``logprobs`` says otherwise, logprob
    ``-0.1 * (i + 1)`` for mask-1 token i and 0.0 for mask-0 ones."""
    ids = list(range(first_id, first_id + len(mask)))
    values = logprobs if logprobs is not None else [-0.1 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
    return Trace(
        prompt_ids=prompt if prompt is not None else [1, 2, 3],
        response_ids=ids,
        loss_mask=mask,
        response_logprobs=[{"token": None, "token_id": t, "logprob": v} for t, v in zip(ids, values, strict=True)],
        prompt_messages=[{"role": "user", "content": "do it"}],
        response_messages=[{"role": "assistant", "content": "done"}],
        finish_reason=finish,
        reward=reward,
        metadata={"group_id": "g-1", "task_id": "task-1"} | (metadata or {}),
        role=role,
        trainable=trainable,
    )


def make_result(
    traces: list[Trace],
    *,
    status: TrajectoryStatus = "completed",
    session_id: str = "s-0",
    sample_index: int = 0,
    task_id: str = "task-1",
    reward: float | None = 1.0,
) -> SessionResult:
    return SessionResult(
        session_id=session_id,
        task_id=task_id,
        sample_index=sample_index,
        status=status,
        trajectory=Trajectory(session_id=session_id, status=status, traces=traces, reward=reward),
        reward=reward,
        num_completions=len(traces),
    )
