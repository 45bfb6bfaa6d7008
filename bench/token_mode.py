"""Token mode against messages mode on real vLLM: what a trainer processes, how much of it is context-exact, and what
token mode adds to each call (issue 31; docs/token-mode.md).

    python bench/token_mode.py [--sessions 8] [--model DIR] [--templates reserialize drop_think] [--keep DIR]

vLLM's CPU build (the venv of .ci/setup_vllm.sh, $POLAR_VLLM_VENV) serves the tuned tiny tool-calling model of
examples/tiny_agent (``tiny_agent.cached_model()``, or ``--model``) with ``--enable-scale-out`` (the token-in routes),
one server at a time, with two chat templates in turn:

- ``reserialize``: the model's template writing earlier tool calls compactly (``{"name":"bash"`` where the model
  samples ``{"name": "bash"``), as tests/examples/test_token_mode_vllm.py serves it;
- ``drop_think``: the model's template dropping the ``<think>`` block of every assistant turn before the last user
  message (as Qwen3's does), served with ``--reasoning-parser qwen3``. The tiny model never opens a ``<think>`` by
  itself, so on this template every call asks for one with structured outputs: a regex (a short think, then a bash
  call or a short answer), applied from the first token (``enable_in_reasoning``), and a logit bias on the two tags
  (else the model spells them in bytes, which the template then writes as the one added token). The proxy passes no
  ``structured_outputs`` or ``logit_bias`` of a harness upstream, so its backend adds them to every upstream request
  (``backend_options.extra_body``), and the direct calls below send them too.

A Polar proxy (its own process, ``serve_proxy`` as ``polar proxy`` runs it) sits in front of the server. An emulated
harness (the official ``openai`` SDK, Chat Completions, not streamed) runs N sessions per template and mode: a system
prompt and one ``bash`` tool; the user gives a tiny_agent instruction, and after the model's final answer a second
one (so that, on ``drop_think``, the first instruction's turns come before the last user message). Whenever the model
calls the tool, the harness echoes the assistant turn back as pi does (arguments parsed and dumped again compactly,
reasoning in the field it came in) with a tool result, up to 3 model calls per instruction. Modes: ``messages`` and
``tokens`` (``token_mode`` on ``POST /sessions``), alternating session by session (A B A B ...), after one warm-up
session each that is not counted. Both modes draw the same seeds.

From the journals it builds each session with ``per_request`` and ``prefix_merging`` (``merge: exact``, the default,
and ``merge: prompt_prefix``) and prints one table, per template and mode/merge:

- tokens a trainer processes (prompt + response of every trace) with per_request and prefix_merging, and the ratio;
- the share of context-exact completions: a completion is context-exact when the trace's tokens before its sampled
  run are its prompt_ids, computed here for every build (and checked against ``metadata["context_exact"]``);
- latency per call (p50, ms): the harness's wall time through the proxy (``call``); the same call made to vLLM's chat
  route directly (``chat``, the machine's ceiling) and, in tokens mode, to its render, generate and derender routes as
  the proxy makes it (``routes``). Both twins go right after the proxied call, with the same messages, tools,
  temperature and seed, what the proxy asks upstream (logprobs, token ids) and ``ignore_eos`` with ``max_tokens`` = the
  proxied call's sampled tokens, so they decode as many tokens. ``added``: the p50 of call - chat per call; ``vs
  msgs``: tokens mode's added minus messages mode's; ``polar``: the p50 of call - the twin that makes the same
  upstream calls (chat in messages mode, routes in tokens mode), Polar's own share. Prefix caching is off, so a call
  and its twins do the same prefill whichever runs first.

Goals (issue 31): tokens mode keeps the merge ratio of prompt_prefix with 100% context-exact, and adds <= 2 ms p50.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from procs import free_port, stop, vllm_python

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "tiny_agent"))

MODEL_NAME = "polar-demo"
MODES = ("messages", "tokens")
MAX_CALLS = 3  # model calls per instruction
MAX_TOKENS = 128
TEMPERATURE = 0.7
SYSTEM = "You are a coding agent. Use the bash tool to work in the current directory. Be concise."
# pi's bash tool (polar_cli/harnesses/pi.py sessions record it), the one tool the tiny model was taught to call
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command in the current working directory. Returns stdout and stderr. Output is "
        "truncated to last 2000 lines or 50KB (whichever is hit first). If truncated, full output is saved to a temp "
        "file. Optionally provide a timeout in seconds.",
        "parameters": {
            "type": "object",
            "required": ["command"],
            "properties": {
                "command": {"type": "string", "description": "Bash command to execute"},
                "timeout": {"type": "number", "description": "Timeout in seconds (optional, no default timeout)"},
            },
        },
    },
}
# what the proxy's vllm backend adds to every chat request upstream (polar_cli/proxy/backends/vllm.py): the direct
# twins ask for the same, so that they do the same work
UPSTREAM_SWITCHES = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
TOOL_RESULT = "(no output)"  # what pi sends back for a command that printed nothing
REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_text")  # pi reads the first non-empty one
# drop_think: a short <think> block as the template renders one, then a bash call as the model was taught, or a short
# final answer
THINK_REGEX = (
    r"<think>\n[a-z ]{1,24}\n</think>\n\n"
    r'(<tool_call>\n\{"name": "bash", "arguments": \{"command": "[^"\\\n<]{1,60}"\}\}\n</tool_call>|[A-Z][a-z.!]{0,20})'
)
# the model's template, and what each served template puts in its place
SAMPLED_CALL = """'<tool_call>\\n{"name": ' + (fn['name'] | tojson) + ', "arguments": '"""
COMPACT_CALL = """'<tool_call>\\n{"name":' + (fn['name'] | tojson) + ',"arguments":'"""
SAMPLED_ARGS = "{{- fn['arguments'] | tojson -}}"
COMPACT_ARGS = "{{- fn['arguments'] | tojson | replace('\": ', '\":') | replace(', \"', ',\"') -}}"
NAMESPACE = "{%- set ns = namespace(system='', start=0) -%}"
LAST_USER = (
    "{%- set ns = namespace(system='', start=0, last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
)
KEEP_THINK = "{%- if reasoning -%}"
DROP_THINK = "{%- if reasoning and loop.index0 + ns.start > ns.last_user -%}"


# ---- templates and servers --------------------------------------------------------------------------------------


def replaced(template: str, old: str, new: str) -> str:
    if old not in template:
        raise SystemExit(f"the tiny model's chat template changed: {old!r} is not in it; update bench/token_mode.py")
    return template.replace(old, new)


@dataclass(frozen=True)
class Served:
    """One chat template the server runs with, and what its sessions ask for."""

    name: str
    template: str
    server_args: tuple[str, ...] = ()
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Merged into every upstream request (the proxy's backend ``extra_body``) and every direct call."""


def served_templates(model_dir: Path) -> list[Served]:
    own = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    reserialize = replaced(replaced(own, SAMPLED_CALL, COMPACT_CALL), SAMPLED_ARGS, COMPACT_ARGS)
    drop_think = replaced(replaced(own, NAMESPACE, LAST_USER), KEEP_THINK, DROP_THINK)
    added = {t["content"]: t["id"] for t in json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]}
    # the model never learnt <think>: under the regex alone it spells the tag in bytes, which the template then
    # renders as the one added token; the bias makes it sample the tags as the template writes them
    bias = {str(added[tag]): 100 for tag in ("<think>", "</think>")}
    return [
        Served("reserialize", reserialize),
        Served(
            "drop_think",
            drop_think,
            ("--reasoning-parser", "qwen3", "--structured-outputs-config", '{"enable_in_reasoning": true}'),
            {"structured_outputs": {"regex": THINK_REGEX}, "logit_bias": bias},
        ),
    ]


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


@contextmanager
def vllm_server(model_dir: Path, served: Served, work: Path, max_model_len: int) -> Iterator[str]:
    """vLLM serving ``model_dir`` as tests/support/vllm.py's VllmServer does, with the template's flags, the token-in
    routes and no prefix caching; its base URL."""
    template = work / f"{served.name}.jinja"
    template.write_text(served.template)
    port, log = free_port(), work / f"vllm-{served.name}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    argv = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(max_model_len), "--dtype", "float32", "--seed", "0", "--enforce-eager",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enable-scale-out",
            "--no-enable-prefix-caching", "--chat-template", str(template), *served.server_args]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=model_dir,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/v1/models", proc, log, timeout_s=float(os.environ.get("POLAR_VLLM_STARTUP_S", "300")))
        yield url
    finally:
        stop(proc)


@dataclass
class Proxy:
    url: str
    control_token: str
    journal: Path

    def new_session(self, session_id: str, mode: str) -> dict[str, Any]:
        body = {"session_id": session_id, "token_mode": mode}
        resp = httpx.post(f"{self.url}/sessions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {self.control_token}"})  # fmt: skip
        if resp.status_code != 201:
            raise SystemExit(f"POST /sessions: HTTP {resp.status_code}: {resp.text[:500]}")
        info: dict[str, Any] = resp.json()
        return info


@contextmanager
def polar_proxy(backend_url: str, served: Served, work: Path) -> Iterator[Proxy]:
    """A Polar proxy in its own process (this script's ``--serve-proxy``: ``serve_proxy``, as ``polar proxy``)."""
    port, token = free_port(), secrets.token_urlsafe(24)
    journal, log = work / f"journal-{served.name}", work / f"proxy-{served.name}.log"
    config = {"backend": "vllm", "backend_url": backend_url, "model": MODEL_NAME, "host": "127.0.0.1", "port": port,
              "journal_dir": str(journal), "control_token": token,
              "backend_options": {"extra_body": served.extra_body} if served.extra_body else {}}  # fmt: skip
    env = {**os.environ, "POLAR_LOAD_PLUGINS": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--serve-proxy", json.dumps(config)], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/healthz", proc, log, timeout_s=60)
        yield Proxy(url, token, journal)
    finally:
        stop(proc)


def serve_proxy_process(config_json: str) -> None:
    import logging

    from polar_cli.commands.interrupt import Interrupted, run_until_stopped
    from polar_cli.proxy import ProxyConfig, serve_proxy

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with suppress(Interrupted):  # SIGTERM: the app was cleaned up (journals flushed)
        run_until_stopped(serve_proxy(ProxyConfig(**json.loads(config_json))))


# ---- the emulated harness ---------------------------------------------------------------------------------------


@dataclass
class Call:
    """One model call of a session: the harness's wall time through the proxy and its direct twins'."""

    proxied_s: float
    direct_s: float
    """The same call on vLLM's chat route."""
    routes_s: float | None
    """Tokens mode: the same call on vLLM's token routes (render, generate, derender), as the proxy makes it."""
    sampled: int
    reasoning: bool


@dataclass
class SessionRun:
    session_id: str
    calls: list[Call] = field(default_factory=list)
    error: str | None = None


def reasoning_of(message: Any) -> tuple[str, str] | None:
    """(field, text) of the answer's reasoning, the first non-empty field as pi reads it."""
    extra = message.model_extra or {}
    for name in REASONING_FIELDS:
        text = extra.get(name)
        if isinstance(text, str) and text.strip():
            return name, text
    return None


def echoed(message: Any) -> dict[str, Any]:
    """The assistant turn as pi sends it back: whitespace-only text dropped, reasoning in the field it came in,
    arguments parsed and dumped again compactly (``{}`` when they do not parse)."""
    text = message.content if (message.content or "").strip() else None
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    reasoning = reasoning_of(message)
    if reasoning is not None:
        turn[reasoning[0]] = reasoning[1]
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            try:
                arguments = json.dumps(json.loads(call.function.arguments), separators=(",", ":"), ensure_ascii=False)
            except (json.JSONDecodeError, TypeError):
                arguments = "{}"
            calls.append({"id": call.id, "type": "function",
                          "function": {"name": call.function.name, "arguments": arguments}})  # fmt: skip
        turn["tool_calls"] = calls
    return turn


def run_session(
    proxy: Proxy, vllm_url: str, served: Served, session_id: str, mode: str, number: int, instructions: list[str]
) -> SessionRun:
    from openai import APIError, OpenAI

    info = proxy.new_session(session_id, mode)
    through = OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0, timeout=300)
    direct = OpenAI(base_url=f"{vllm_url}/v1", api_key="none", max_retries=0, timeout=300)
    http = httpx.Client(timeout=300)
    run = SessionRun(session_id)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    seed = 1000 * (number + 2)  # the warm-up is number -1; vLLM takes no negative seed
    try:
        for instruction in instructions:
            messages.append({"role": "user", "content": instruction})
            for _ in range(MAX_CALLS):
                seed += 1
                request: dict[str, Any] = {"model": MODEL_NAME, "messages": messages, "tools": [BASH_TOOL],
                                           "temperature": TEMPERATURE, "seed": seed}  # fmt: skip
                started = time.perf_counter()
                answer = through.chat.completions.create(**request, max_tokens=MAX_TOKENS)
                proxied = time.perf_counter() - started
                sampled = answer.usage.completion_tokens if answer.usage else 0
                # the machine's ceiling: the same call to vLLM itself, decoding as many tokens
                upstream = {**served.extra_body, **UPSTREAM_SWITCHES, "ignore_eos": True}
                started = time.perf_counter()
                twin = direct.chat.completions.create(**request, max_tokens=max(1, sampled), extra_body=upstream)
                direct_s = time.perf_counter() - started
                if twin.usage and twin.usage.completion_tokens != sampled:
                    raise RuntimeError(f"the direct twin decoded {twin.usage.completion_tokens}, not {sampled} tokens")
                routes_s = None
                if mode == "tokens":
                    body = {**request, "max_tokens": max(1, sampled), **upstream}
                    routes_s = token_routes(http, vllm_url, body, sampled)
                message = answer.choices[0].message
                run.calls.append(Call(proxied, direct_s, routes_s, sampled, reasoning_of(message) is not None))
                messages.append(echoed(message))
                for call in message.tool_calls or []:
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT})
                if not message.tool_calls:
                    break
    except (APIError, RuntimeError, httpx.HTTPError) as exc:
        run.error = f"{type(exc).__name__}: {str(exc)[:400]}"
    finally:
        http.close()
    return run


def token_routes(http: httpx.Client, vllm_url: str, body: dict[str, Any], sampled: int) -> float:
    """Wall time of one call made as the proxy makes it in tokens mode, straight to vLLM (polar_cli/proxy/backends/
    vllm_tokens.py): render the messages, generate from the ids, derender the answer."""

    def post(route: str, payload: dict[str, Any]) -> Any:
        resp = http.post(f"{vllm_url}{route}", json=payload)
        if resp.status_code != 200:
            raise RuntimeError(f"{route}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    started = time.perf_counter()
    rendered = post("/v1/chat/completions/render", body)
    generate = {k: v for k, v in rendered.items() if k != "request_id"}
    generate["sampling_params"] = {**rendered["sampling_params"], "logprobs": 0}
    generate["stream"] = False
    out = post("/inference/v1/generate", generate)
    post("/v1/chat/completions/derender", {"generate_response": out, "chat_request": body})
    seconds = time.perf_counter() - started
    if len(out["choices"][0]["token_ids"]) != sampled:
        raise RuntimeError(f"the token-routes twin decoded {len(out['choices'][0]['token_ids'])}, not {sampled} tokens")
    return seconds


# ---- building and counting --------------------------------------------------------------------------------------


@dataclass
class Built:
    """One (template, mode, merge) over all sessions."""

    completions: int = 0
    per_request_tokens: int = 0
    merged_tokens: int = 0
    chains: int = 0
    exact: int = 0
    flagged_inexact: int = 0
    """Completions ``metadata["context_exact"]`` marks False."""
    disagree: int = 0
    """Completions where this script's check and the trace's own flag differ."""
    causes: Counter[str] = field(default_factory=Counter)


def trace_tokens(trajectory: Any) -> int:
    return sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectory.traces)


def context_exact(trace: Any, by_id: dict[str, Any]) -> list[bool]:
    """Per completion of the trace: whether the trace's tokens before its sampled run are its prompt_ids."""
    out: list[bool] = []
    mask, response = trace.loss_mask, trace.response_ids
    pos = 0
    for completion_id in trace.metadata.get("completion_ids") or []:
        completion = by_id[completion_id]
        start = next((i for i in range(pos, len(mask)) if mask[i] == 1), len(mask))
        n = len(completion.response_ids)
        if response[start : start + n] != completion.response_ids:
            raise SystemExit(f"trace of {completion_id}: its sampled run is not where this script looks for it")
        out.append([*trace.prompt_ids, *response[:start]] == completion.prompt_ids)
        pos = start + n
    return out


def build(journals: list[Path], eos: int | list[int]) -> dict[str, Built]:
    """Per build rule ("exact", "prompt_prefix"): what the sessions' journals give."""
    from polar_cli.builders import build_trajectory
    from polar_cli.proxy import read_journal

    out = {"exact": Built(), "prompt_prefix": Built()}
    for path in journals:
        completions = read_journal(path)
        if not completions:
            continue
        by_id = {c.completion_id: c for c in completions}
        per_request = trace_tokens(build_trajectory("per_request", completions))
        for merge, built in out.items():
            trajectory = build_trajectory("prefix_merging", completions, eos_token_id=eos, merge=merge)
            built.completions += len(completions)
            built.per_request_tokens += per_request
            built.merged_tokens += trace_tokens(trajectory)
            built.chains += int(trajectory.metadata["chains"])
            built.causes.update(trajectory.metadata.get("prefix_break_causes") or {})
            for trace in trajectory.traces:
                mine = context_exact(trace, by_id)
                flags = trace.metadata.get("context_exact") or [True] * len(mine)
                built.exact += sum(mine)
                built.flagged_inexact += flags.count(False)
                built.disagree += sum(a != b for a, b in zip(mine, flags, strict=True))
    return out


LEGEND = """
tokens: prompt + response of every trace. ctx-exact: completions whose trace tokens before their sampled run are their
prompt_ids. Latency: p50 in ms per call, client wall time. call: through the proxy; chat: the same call on vLLM's chat
route; routes: on vLLM's render + generate + derender routes, as tokens mode makes it (both decode as many tokens as
the proxied call); added: p50 of call - chat; vs msgs: tokens mode's added minus messages mode's; polar: p50 of call -
the same upstream calls made directly (chat or routes). The two messages rows are the same sessions built two ways."""

# ---- the table --------------------------------------------------------------------------------------------------


@dataclass
class Row:
    template: str
    label: str
    sessions: int
    built: Built
    calls: list[Call]


def p50(values: list[float]) -> float:
    return statistics.median(values) * 1e3 if values else float("nan")


def median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the median (order statistics), in ms."""
    ordered, n = sorted(values), len(values)
    if n < 6:
        return float("nan"), float("nan")
    low = max(0, int(n / 2 - 1.96 * n**0.5 / 2) - 1)  # rank j = floor(n/2 - 1.96 sqrt(n)/2), and n + 1 - j
    return ordered[low] * 1e3, ordered[n - 1 - low] * 1e3


def over_chat(calls: list[Call]) -> list[float]:
    """Per call: the wall time through the proxy minus the same call on vLLM's chat route."""
    return [c.proxied_s - c.direct_s for c in calls]


def over_upstream(calls: list[Call]) -> list[float]:
    """Per call: the wall time through the proxy minus the same upstream calls made directly (Polar's own share)."""
    return [c.proxied_s - (c.direct_s if c.routes_s is None else c.routes_s) for c in calls]


def ratio(built: Built) -> float:
    return built.per_request_tokens / built.merged_tokens if built.merged_tokens else float("nan")


def check_merge_option() -> None:
    from polar_cli.builders import BuilderConfig

    if "merge" not in BuilderConfig.model_fields:
        raise SystemExit(
            "this Polar's prefix_merging has no `merge` option (exact / prompt_prefix, issue 31): nothing to compare"
        )


def print_table(rows: list[Row], failures: list[str], reasoning: dict[str, tuple[int, int]]) -> None:
    header = (
        f"{'template':<11} {'mode/merge':<22} {'sess':>4} {'calls':>5} {'chains':>6} | {'per_request':>11} "
        f"{'prefix_merg':>11} {'ratio':>5} | {'ctx-exact':>9} | {'call':>6} {'chat':>6} {'routes':>6} | "
        f"{'added':>6} {'vs msgs':>7} {'polar':>6}"
    )
    print(header)
    print("-" * len(header))
    base: dict[str, float] = {}
    for row in rows:
        b, calls = row.built, row.calls
        share = 100 * b.exact / b.completions if b.completions else float("nan")
        extra = p50(over_chat(calls))
        in_tokens = row.label.startswith("tokens")
        if not in_tokens:
            base[row.template] = extra
        versus = f"{extra - base[row.template]:+7.1f}" if in_tokens and row.template in base else ""
        routes = f"{p50([c.routes_s for c in calls if c.routes_s is not None]):6.1f}" if in_tokens else ""
        print(
            f"{row.template:<11} {row.label:<22} {row.sessions:>4} {b.completions:>5} {b.chains:>6} | "
            f"{b.per_request_tokens:>11,} {b.merged_tokens:>11,} {ratio(b):>5.2f} | {share:>8.1f}% | "
            f"{p50([c.proxied_s for c in calls]):>6.1f} {p50([c.direct_s for c in calls]):>6.1f} {routes:>6} | "
            f"{extra:>6.1f} {versus:>7} {p50(over_upstream(calls)):>6.1f}"
        )
    print(LEGEND)
    for row in rows:
        b = row.built
        causes = ", ".join(f"{k} {v}" for k, v in sorted(b.causes.items())) or "none"
        low, high = median_ci(over_chat(row.calls))
        notes = [f"breaks: {causes}", f"added p50 95% CI [{low:.1f}, {high:.1f}] ms"]
        if b.flagged_inexact:
            notes.append(f"metadata context_exact false on {b.flagged_inexact}")
        if b.disagree:
            notes.append(f"DISAGREES with metadata context_exact on {b.disagree}")
        print(f"  {row.template} {row.label}: " + "; ".join(notes))
    for name, (with_reasoning, total) in reasoning.items():
        print(f"  {name}: reasoning sampled in {with_reasoning} of {total} calls")
    rows_by = {(r.template, r.label): r for r in rows}
    for template in dict.fromkeys(r.template for r in rows):
        loose = rows_by.get((template, "messages/prompt_prefix"))
        tokens = rows_by.get((template, "tokens/exact"))
        messages = rows_by.get((template, "messages/exact"))
        if loose is None or tokens is None or messages is None:
            continue
        kept = ratio(tokens.built) >= ratio(loose.built) - 0.005
        exact = tokens.built.exact == tokens.built.completions
        more = p50(over_chat(tokens.calls)) - p50(over_chat(messages.calls))
        ci = {
            name: "[{:.1f}, {:.1f}]".format(*median_ci(over_chat(r.calls)))
            for name, r in (("messages", messages), ("tokens", tokens))
        }
        print(
            f"goals, {template}: tokens mode's merge ratio {ratio(tokens.built):.2f} vs prompt_prefix's "
            f"{ratio(loose.built):.2f} ({'kept' if kept else 'NOT kept'}), context-exact "
            f"{'100%' if exact else 'NOT 100%'}; it adds {more:+.1f} ms p50 per call "
            f"({'within' if more <= 2.0 else 'OVER'} the 2 ms goal; 95% CIs of added: messages {ci['messages']}, "
            f"tokens {ci['tokens']})"
        )
    for failure in failures:
        print(f"  FAILED {failure}")


# ---- main -------------------------------------------------------------------------------------------------------


def run_template(
    model_dir: Path, served: Served, work: Path, sessions: int, max_model_len: int
) -> tuple[list[Row], list[str], tuple[int, int]]:
    import tiny_agent

    eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    tasks = tiny_agent.TASKS
    runs: dict[str, list[SessionRun]] = {mode: [] for mode in MODES}
    failures: list[str] = []
    with vllm_server(model_dir, served, work, max_model_len) as url, polar_proxy(url, served, work) as proxy:
        for number in range(-1, sessions):  # -1: the warm-up pair, not counted
            first, second = tasks[number % len(tasks)], tasks[(number + 1) % len(tasks)]
            instructions = [tiny_agent.instruction(*first), tiny_agent.instruction(*second)]
            order = MODES if number % 2 == 0 else MODES[::-1]
            for mode in order:
                sid = f"{served.name}-{mode}-{'warmup' if number < 0 else number}"
                run = run_session(proxy, url, served, sid, mode, number, instructions)
                if run.error:
                    failures.append(f"{sid} (after {len(run.calls)} calls): {run.error}")
                if number >= 0:
                    runs[mode].append(run)
        journal = proxy.journal
    rows = []
    for mode in MODES:
        paths = [journal / f"{r.session_id}.jsonl" for r in runs[mode]]
        built = build(paths, eos)
        calls = [c for r in runs[mode] for c in r.calls]
        merges = ("exact", "prompt_prefix") if mode == "messages" else ("exact",)
        rows += [Row(served.name, f"{mode}/{merge}", len(runs[mode]), built[merge], calls) for merge in merges]
    every = [c for mode in MODES for r in runs[mode] for c in r.calls]
    return rows, failures, (sum(c.reasoning for c in every), len(every))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8, help="sessions per template and mode (default 8)")
    parser.add_argument("--model", type=Path, help="the tiny_agent model folder (default: tiny_agent.cached_model())")
    parser.add_argument("--templates", nargs="+", choices=("reserialize", "drop_think"), default=None)
    parser.add_argument("--keep", type=Path, help="keep logs and journals in this folder (default: a temp folder)")
    parser.add_argument("--nice", type=int, default=10, help="run at least this nice (default 10)")
    parser.add_argument("--serve-proxy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        serve_proxy_process(args.serve_proxy)
        return
    check_merge_option()
    os.nice(max(0, args.nice - os.nice(0)))  # at least that nice (the servers inherit it): the machine is shared
    import tiny_agent

    model_dir = (args.model or tiny_agent.cached_model()).resolve()
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="polar-bench-token-mode-"))
    work.mkdir(parents=True, exist_ok=True)
    templates = [s for s in served_templates(model_dir) if args.templates is None or s.name in args.templates]
    rows: list[Row] = []
    failures: list[str] = []
    reasoning: dict[str, tuple[int, int]] = {}
    started = time.monotonic()
    try:
        for served in templates:
            got, failed, sampled = run_template(model_dir, served, work, args.sessions, tiny_agent.MAX_MODEL_LEN)
            rows += got
            failures += failed
            if served.name == "drop_think":
                reasoning[served.name] = sampled
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"model {model_dir} on vLLM {vllm_version()}; {os.cpu_count()} CPUs, load average {load}; {args.sessions} "
          f"sessions per template and mode (+1 warm-up each); {time.monotonic() - started:.0f} s")  # fmt: skip
    print_table(rows, failures, reasoning)


def vllm_version() -> str:
    python = vllm_python()
    site = next(python.parent.parent.glob("lib/python*/site-packages"), None)
    found = sorted(site.glob("vllm*.dist-info")) if site else []
    match = re.search(r"-(\d[^-]*)\.dist-info$", found[0].name) if found else None
    return match.group(1) if match else "?"


if __name__ == "__main__":
    main()
