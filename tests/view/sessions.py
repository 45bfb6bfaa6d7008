"""SessionResults for the view's tests: real models, built as a builder would (two chains, a prefix break, an
evaluator report), with hostile text where asked."""

from __future__ import annotations

from polar_cli.models import SessionResult, Trace, Trajectory

HOSTILE = '</script><script>window.__pwned=1</script><img id="pwned" src="x" onerror="window.__pwned=2">&amp;'


def trace(prompt: int, turns: int, *, sampled: int = 3, interstitial: int = 2, text: str = "tok", role: str = "main",
          messages: list[dict[str, object]] | None = None) -> Trace:  # fmt: skip
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[dict[str, object]] = []
    for turn in range(turns):
        for k in range(sampled):
            token_id = 100 + (turn * 7 + k) % 50
            ids.append(token_id)
            mask.append(1)
            text_k = f"{text}{k}" if k else "Ġhello"
            logprobs.append({"token": text_k, "token_id": token_id, "logprob": -0.05 * (k + 1)})
        if turn < turns - 1:
            for k in range(interstitial):
                ids.append(900 + k)
                mask.append(0)
                logprobs.append({"token": None, "token_id": 900 + k, "logprob": 0.0})
    return Trace(prompt_ids=list(range(1, prompt + 1)), response_ids=ids, loss_mask=mask, response_logprobs=logprobs,
                 prompt_messages=messages or [{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "write hello.txt"}],
                 response_messages=[
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "bash", "arguments": '{"command": "echo hi > hello.txt"}'}}]},
                     {"role": "tool", "content": "hi\n", "tool_call_id": "call_1"},
                     {"role": "assistant", "content": "done"}],
                 finish_reason="stop", role=role, role_reason="the session's first chain" if role == "main" else "x",
                 metadata={"harness": "pi"})  # fmt: skip


def session(session_id: str = "s-0", *, hostile: bool = False, reward: float = 1.0,
            status: str = "completed", inexact: bool = False) -> SessionResult:  # fmt: skip
    """Two chains: the main one, and a sub-agent after a ``new_context`` break; ``hostile``: HTML/script in every
    text field; ``inexact``: the main trace says ``context_exact: false`` (built with ``merge: prompt_prefix``)."""
    bad = HOSTILE if hostile else ""
    main = trace(12, 3, text="tok" + bad, messages=[{"role": "user", "content": "write hello.txt" + bad}])
    main.context_exact = not inexact
    sub = trace(5, 2, role="subagent")
    breaks = [{"completion_index": 3, "completion_id": f"{session_id}-3", "chain": 1, "cause": "new_context",
               "closest_chain": 0, "common_prefix": 0, "closest_prompt_tokens": 12, "first_difference": 0,
               "expected_ids": [1, 2, 3], "found_ids": [1, 2, 3, 4, 5][::-1]}]  # fmt: skip
    trajectory = Trajectory(session_id=session_id, status=status, traces=[main, sub], reward=reward,
                            metadata={"builder": "prefix_merging", "chains": 2, "breaks": breaks})  # fmt: skip
    evaluation = {"exit_code": 0, "tests": [{"name": "test_hello" + bad, "status": "passed"},
                                            {"name": "test_other", "status": "failed"}], "stdout_tail": "ok\n" + bad}
    return SessionResult(session_id=session_id, task_id="task" + bad, status=status, trajectory=trajectory,
                         reward=reward, num_completions=5, error=("boom" + bad) if hostile else None,
                         harness_stderr=bad or None, metadata={"evaluation": evaluation})  # fmt: skip


def results_file(path: object, sessions: list[SessionResult]) -> None:
    from pathlib import Path

    Path(str(path)).write_text("".join(s.model_dump_json() + "\n" for s in sessions), encoding="utf-8")
