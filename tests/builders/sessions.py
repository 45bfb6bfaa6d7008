"""A harness simulator: renders prompts with a real HF tokenizer and chat template, "samples" responses as the
tokens a model would emit, and records Completions the way the proxy does.

Sampled tokens are the model's own text (``<think>`` block, content, ``<tool_call>`` JSON in the model's own spacing)
plus ``<|im_end|>``; the next prompt holds the template's re-rendering of the parsed message, which differs when
arguments are re-serialized, reasoning is dropped, or a truncated response is closed by the template. That is the
situation prefix merging must handle.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any

from polar_cli.demo_model import CHAT_TEMPLATE
from polar_cli.models import Completion

# Qwen3-style: reasoning of assistant turns before the last user message is not rendered, which rewrites history.
DROP_REASONING_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- set ns = namespace(system='', start=0) -%}",
    "{%- set ns = namespace(system='', start=0, last_user=-1) -%}\n"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}",
).replace("{%- if reasoning -%}", "{%- if reasoning and loop.index0 + ns.start > ns.last_user -%}")
assert DROP_REASONING_TEMPLATE.count("ns.last_user") == 2

WORDS = [
    "alpha", "beta", "gamma", "delta", "file", "test", "patch", "error", "value", "config", "server", "module",
    "function", "result", "check", "update", "read", "write", "build", "run", "parse", "token", "model", "request",
    "response", "fix", "issue", "line", "path", "list", "data", "item", "cache", "index", "query",
]

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "run", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "task", "description": "Start a sub-agent.",
                                      "parameters": {"type": "object", "properties": {"goal": {"type": "string"}}}}},
]


@dataclass
class Turn:
    """What the model emits in one call."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    compact_json: bool = False  # the model's own argument spacing; the proxy re-serializes with spaces
    truncate: float | None = None  # keep this fraction of the sampled tokens (finish_reason "length")


class Simulator:
    """Records one session's completions; ``render_text`` is the oracle's view of each prompt."""

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None, seed: int = 0, session_id: str = "s1"):
        self.tok = tokenizer
        self.template = chat_template
        self.rng = random.Random(seed)
        self.session_id = session_id
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.completions: list[Completion] = []
        self.prompt_text: dict[str, str] = {}
        self.parent: dict[str, str | None] = {}
        self._calls = 0

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, tokenize: bool) -> Any:
        return self.tok.apply_chat_template(
            messages, tools=tools, chat_template=self.template, add_generation_prompt=True, tokenize=tokenize,
            return_dict=False,
        )

    def call(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, turn: Turn, *,
        parent: Completion | None, agent: str,
    ) -> tuple[Completion, dict[str, Any]]:
        """One model call; returns the completion and the assistant message the harness appends to its history."""
        index = len(self.completions)
        text = ""
        if turn.reasoning:
            text += "<think>\n" + turn.reasoning + "\n</think>\n\n"
        text += turn.content
        calls = []
        for i, (name, args) in enumerate(turn.tool_calls):
            if turn.content or i:
                text += "\n"
            emitted = json.dumps(args, separators=(",", ":")) if turn.compact_json else json.dumps(args)
            text += '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": ' + emitted + "}\n</tool_call>"
            calls.append({"id": f"call_{index}_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args)}})
        ids = [*self.tok.encode(text, add_special_tokens=False), self.eot]
        finish = "tool_calls" if calls else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": turn.content or None}
        if turn.reasoning:
            message["reasoning_content"] = turn.reasoning
        if calls:
            message["tool_calls"] = calls
        if turn.truncate is not None and len(ids) > 2:
            ids = ids[: max(1, min(len(ids) - 2, int(len(ids) * turn.truncate)))]
            finish = "length"
            # The proxy parses nothing out of a cut-off response: it is plain text.
            message = {"role": "assistant", "content": self.tok.decode(ids)}
        completion = Completion(
            completion_id=f"c{index}",
            session_id=self.session_id,
            index=index,
            provider="openai_chat",
            model="demo",
            request={"messages": copy.deepcopy(messages), "tools": tools},
            request_messages=copy.deepcopy(messages),
            request_tools=tools,
            response_message=message,
            prompt_ids=self.render(messages, tools, tokenize=True),
            response_ids=ids,
            response_logprobs=[round(-self.rng.random() * 4, 4) for _ in ids],
            response_tokens=self.tok.convert_ids_to_tokens(ids),
            finish_reason=finish,
            started_at=float(index),
            finished_at=index + 0.5,
            metadata={"agent": agent},
        )
        self.completions.append(completion)
        self.prompt_text[completion.completion_id] = self.render(messages, tools, tokenize=False)
        self.parent[completion.completion_id] = parent.completion_id if parent else None
        return completion, message

    def expected_chains(self, *, exact: bool = False) -> list[list[str]]:
        """The oracle: a call continues its parent's chain when the parent still ends that chain and the rendered
        prompt *text* strictly extends the parent's (ties between parallel branches resolved by ground truth); with
        ``exact``, when instead the parent's reply was not cut and the prompt ids start with the parent's prompt and
        sampled ids."""
        chains: list[list[str]] = []
        chain_of: dict[str, int] = {}
        by_id = {c.completion_id: c for c in self.completions}
        for c in self.completions:
            cid = c.completion_id
            parent = self.parent[cid]
            text, before = self.prompt_text[cid], self.prompt_text.get(parent or "", "")
            if exact and parent is not None:
                p = by_id[parent]
                head = p.prompt_ids + p.response_ids
                continued = p.finish_reason != "length" and c.prompt_ids[: len(head)] == head
            else:
                continued = len(text) > len(before) and text.startswith(before)
            if parent is not None and chains[chain_of[parent]][-1] == parent and continued:
                chain_of[cid] = chain_of[parent]
                chains[chain_of[cid]].append(cid)
            else:
                chain_of[cid] = len(chains)
                chains.append([cid])
        return chains


def tool_result(call: dict[str, Any], text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call["id"], "content": text}


# A session plan is a list of steps, each a tuple whose first item names it:
#   ("text",) ("tools", n, compact) ("reasoning_tools", compact) ("reasoning_text",) ("truncated", fraction)
#   ("branch", n, chosen) ("subagents", k, turns, same_prompt) ("compaction",)
Step = tuple[Any, ...]


def play(sim: Simulator, steps: list[Step]) -> list[Completion]:
    """Run a main agent through ``steps`` (then a final answer), recording every model call in ``sim``."""
    system = {"role": "system", "content": "You are a coding agent."}
    task = {"role": "user", "content": "Fix the failing test in the repository."}
    history: list[dict[str, Any]] = [system, task]
    prev: Completion | None = None
    counter = iter(range(10_000))

    def content(prefix: str = "Step") -> str:
        return f"{prefix} {next(counter)} {sim.words(sim.rng.randint(1, 12))}"

    def follow(message: dict[str, Any]) -> None:
        history.append(message)
        for call in message.get("tool_calls") or []:
            history.append(tool_result(call, content("Output")))
        if not message.get("tool_calls"):
            history.append({"role": "user", "content": content("Next")})

    def tool_calls(n: int) -> list[tuple[str, dict[str, Any]]]:
        return [("read_file", {"path": f"src/{sim.rng.choice(WORDS)}.py", "n": next(counter)}) for _ in range(n)]

    for step in steps:
        kind = step[0]
        if kind == "branch":
            _, n, chosen = step
            turns = [Turn(content=content("Option")) for _ in range(n)]
            sampled = [sim.call(history, TOOLS, t, parent=prev, agent=f"branch{i}") for i, t in enumerate(turns)]
            prev, message = sampled[chosen % n]
            follow(message)
        elif kind == "subagents":
            _, k, turns, same_prompt = step
            goals = [("Investigate " + (sim.words(3) if not same_prompt or i == 0 else "")) for i in range(k)]
            if same_prompt:
                goals = [goals[0]] * k
            prev, message = sim.call(
                history, TOOLS, Turn(tool_calls=[("task", {"goal": g}) for g in goals]), parent=prev, agent="main"
            )
            history.append(message)
            subs: list[list[dict[str, Any]]] = [
                [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": g}] for g in goals
            ]
            parents: list[Completion | None] = [None] * k
            for t in range(turns):  # round robin: their calls interleave in capture order
                for j, sub in enumerate(subs):
                    last = t == turns - 1
                    turn = Turn(content=content("Report")) if last else Turn(tool_calls=tool_calls(1))
                    parents[j], sub_message = sim.call(sub, TOOLS[:2], turn, parent=parents[j], agent=f"sub{j}")
                    sub.append(sub_message)
                    for call in sub_message.get("tool_calls") or []:
                        sub.append(tool_result(call, content("Output")))
            for call in message["tool_calls"]:
                history.append(tool_result(call, content("Sub-agent report")))
        elif kind == "compaction":
            request = [*history, {"role": "user", "content": "Summarize the conversation so far."}]
            prev, message = sim.call(request, TOOLS, Turn(content=content("Summary")), parent=prev, agent="main")
            summary = {"role": "user", "content": f"{task['content']}\n\nSummary so far: {message['content']}"}
            history[:] = [system, summary]
        else:
            if kind == "text":
                turn = Turn(content=content())
            elif kind == "tools":
                turn = Turn(content=content() if sim.rng.random() < 0.5 else "", tool_calls=tool_calls(step[1]),
                            compact_json=step[2])
            elif kind == "reasoning_tools":
                turn = Turn(reasoning=content("Thinking"), tool_calls=tool_calls(1), compact_json=step[1])
            elif kind == "reasoning_text":
                turn = Turn(reasoning=content("Thinking"), content=content())
            elif kind == "truncated":
                turn = Turn(content=content(), tool_calls=tool_calls(1), truncate=step[1])
            else:
                raise ValueError(f"unknown step {step!r}")
            prev, message = sim.call(history, TOOLS, turn, parent=prev, agent="main")
            follow(message)
    sim.call(history, TOOLS, Turn(content=content("Done")), parent=prev, agent="main")
    return sim.completions
