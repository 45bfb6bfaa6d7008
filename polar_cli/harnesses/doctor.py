"""``polar doctor``: drive the real harness through a proxy session with the scripted backend, step by step.

The adapter supplies the script (:meth:`Harness.doctor_script`): one call of the harness's own shell tool that writes
a file, then a final answer. A proxy runs in this process on 127.0.0.1 (port 0); the harness runs in the chosen
runtime exactly as in a real session (:func:`polar_cli.harnesses.run.run_harness`). The instruction it is given is
hostile on purpose (quotes, ``$(...)``, backticks, newlines, a leading ``--``): it must arrive verbatim and run nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from aiohttp import web

from polar_cli.errors import PolarError
from polar_cli.harnesses import fixtures
from polar_cli.harnesses.run import context_for, failure_report, run_harness
from polar_cli.interfaces.harness import Harness, HarnessRun
from polar_cli.interfaces.runtime import RuntimeContext, RuntimeHandle
from polar_cli.models.task import RuntimeSpec
from polar_cli.web.listen import listen

DOCTOR_MODEL = "polar-doctor"
DOCTOR_FILE = "polar-doctor.txt"
DEFAULT_IMAGE = "polar-test-base:latest"
# Hostile on purpose: if any of this reached a shell, a polar-pwned-* file would appear.
DOCTOR_INSTRUCTION = (
    '--help "Polar doctor": run the one shell command you are given, then answer briefly.\n'
    "Quoting check, plain text only: 'single' \"double\" $(touch polar-pwned-1) `touch polar-pwned-2`; "
    "touch polar-pwned-3 && echo $HOME \\\n"
    "last line"
)
STEPS = (
    "installed",
    "configured",
    "first request",
    "instruction verbatim",
    "tool executed",
    "file written",
    "nothing injected",
    "second request",
    "exit status",
    "completions recorded",
)
PROTOCOLS = {"openai": ("openai_chat", "openai_responses"), "anthropic": ("anthropic",), "google": ("google",)}

Status = Literal["pass", "fail", "skip"]


@dataclass
class DoctorStep:
    name: str
    status: Status = "skip"
    detail: str = "not reached"


@dataclass
class DoctorReport:
    harness: str
    runtime: str
    steps: list[DoctorStep] = field(default_factory=lambda: [DoctorStep(name) for name in STEPS])
    seconds: float = 0.0
    run: HarnessRun | None = None
    completions: list[dict[str, Any]] = field(default_factory=list)
    requests: list[SeenRequest] = field(default_factory=list)
    """Every request the harness made to its session, in order."""

    @property
    def ok(self) -> bool:
        return all(step.status == "pass" for step in self.steps)

    def step(self, name: str) -> DoctorStep:
        return next(step for step in self.steps if step.name == name)

    def mark(self, name: str, ok: bool, detail: str) -> bool:
        step = self.step(name)
        step.status, step.detail = ("pass" if ok else "fail"), detail
        return ok

    def as_dict(self) -> dict[str, Any]:
        return {
            "harness": self.harness,
            "runtime": self.runtime,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "steps": [{"name": s.name, "status": s.status, "detail": s.detail} for s in self.steps],
            "requests": [
                {"method": r.method, "path": r.path, "kind": r.kind, "status": r.status} for r in self.requests
            ],
        }


@dataclass
class SeenRequest:
    """One request the harness made to its session (the raw body kept for generation calls)."""

    method: str
    path: str
    """After the session prefix, with the query string."""
    kind: str
    provider: str
    status: int = 0
    body: dict[str, Any] | None = None


@dataclass
class DoctorProxy:
    """An in-process proxy with the scripted backend, watching every request the harness makes."""

    url: str
    client: httpx.AsyncClient
    requests: dict[str, list[SeenRequest]]

    async def create_session(self, script: list[dict[str, Any]]) -> dict[str, Any]:
        response = await self.client.post(f"{self.url}/sessions", json={"script": script})
        if response.status_code != 201:
            raise PolarError(f"the doctor's proxy refused the session: {response.status_code} {response.text}")
        info: dict[str, Any] = response.json()
        return info

    async def completions(self, session_id: str) -> list[dict[str, Any]]:
        response = await self.client.get(f"{self.url}/sessions/{session_id}/completions")
        response.raise_for_status()
        data: list[dict[str, Any]] = response.json()
        return data


@contextlib.asynccontextmanager
async def doctor_proxy(journal_dir: Path) -> AsyncIterator[DoctorProxy]:
    from polar_cli.proxy import ProxyConfig, ProxyState, create_proxy_app, detect

    config = ProxyConfig(backend="scripted", host="127.0.0.1", port=0, journal_dir=journal_dir)
    state = ProxyState(config)
    app = create_proxy_app(config, state)
    seen: dict[str, list[SeenRequest]] = {}

    @web.middleware
    async def watch(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        session_id = request.match_info.get("session_id")
        if session_id and request.path.startswith("/s/"):  # the harness's calls, not the doctor's control calls
            tail = request.match_info.get("tail") or "/"
            shown = f"{tail}?{request.query_string}" if request.query_string else tail
            headers = {k.lower(): v for k, v in request.headers.items()}
            found = detect(request.method, tail, headers, request.query)
            entry = SeenRequest(request.method, shown, found.kind, found.provider)
            if found.kind == "generate":
                with contextlib.suppress(ValueError):
                    entry.body = json.loads(await request.read())  # aiohttp keeps the body for the handler
            seen.setdefault(session_id, []).append(entry)
            response = await handler(request)
            entry.status = response.status
            return response
        return await handler(request)

    app.middlewares.append(watch)
    listener = await listen(app, "127.0.0.1", 0)
    try:
        state.base_url = listener.url
        control = {"Authorization": f"Bearer {config.control_token}"}  # its control routes need the token too
        async with httpx.AsyncClient(timeout=30.0, headers=control) as client:
            yield DoctorProxy(listener.url, client, seen)
    finally:
        await listener.close()


def _text(messages: list[dict[str, Any]], roles: tuple[str, ...]) -> str:
    return "\n".join(json.dumps(m.get("content"), ensure_ascii=False) for m in messages if m.get("role") in roles)


def _user_text(messages: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


async def _start_runtime(harness: Harness, runtime: str, image: str | None, session_id: str) -> RuntimeHandle:
    from polar_cli.runtimes import start_session

    spec = RuntimeSpec(backend=runtime, image=(image or DEFAULT_IMAGE) if runtime != "local" else image)
    return await start_session(spec, RuntimeContext(session_id, tools_dir=harness.tools_dir()))


async def run_doctor(
    harness: Harness,
    *,
    runtime: str = "local",
    image: str | None = None,
    timeout: float = 300.0,
    install: bool = True,
    config: dict[str, Any] | None = None,
    save_requests: Path | None = None,
) -> DoctorReport:
    """Drive ``harness`` through one scripted session and report each step; never raises for a harness failure.

    ``save_requests``: write the request bodies the harness sent, shortened, as ``DIR/<harness>/turn<N>.json``.
    """
    report = DoctorReport(harness=harness.name, runtime=runtime)
    started = time.monotonic()
    try:
        await _doctor(report, harness, runtime, image, timeout, install, config or {})
    finally:
        report.seconds = time.monotonic() - started
    if save_requests is not None:
        generations = [r for r in report.requests if r.kind == "generate" and r.body is not None]
        fixtures.save_requests(save_requests, harness.name, harness.version, generations)
    return report


async def _doctor(
    report: DoctorReport,
    harness: Harness,
    runtime: str,
    image: str | None,
    timeout: float,
    install: bool,
    config: dict[str, Any],
) -> None:
    version = f" {harness.version}" if harness.version else ""
    if harness.is_installed():
        report.mark("installed", True, f"{harness.name}{version} at {harness.tools_dir() or 'PATH'}")
    elif not install:
        report.mark(
            "installed", False, f"{harness.name}{version} is not installed: polar harness install {harness.name}"
        )
        return
    else:
        began = time.monotonic()
        try:
            await asyncio.to_thread(harness.install)
        except PolarError as exc:
            report.mark("installed", False, str(exc))
            return
        report.mark("installed", True, f"installed {harness.name}{version} now ({time.monotonic() - began:.0f} s)")

    left, right = secrets.token_hex(4), secrets.token_hex(4)
    command = f"printf '%s%s\\n' {left} {right} > {DOCTOR_FILE} && cat {DOCTOR_FILE}"
    expected = left + right  # the tool's output; not a substring of the command itself
    script = harness.doctor_script(command)
    with tempfile.TemporaryDirectory(prefix="polar-doctor-") as journal_dir:
        async with doctor_proxy(Path(journal_dir)) as proxy:
            session = await proxy.create_session(script)
            session_id = session["session_id"]
            try:
                handle = await _start_runtime(harness, runtime, image, session_id)
            except PolarError as exc:
                report.mark("configured", False, f"runtime {runtime!r} did not start: {exc}")
                return
            try:
                await _drive(report, harness, handle, proxy, session, config, timeout, expected, len(script))
            finally:
                await handle.stop()


async def _drive(
    report: DoctorReport,
    harness: Harness,
    handle: RuntimeHandle,
    proxy: DoctorProxy,
    session: dict[str, Any],
    config: dict[str, Any],
    timeout: float,
    expected: str,
    turns: int,
) -> None:
    session_id = session["session_id"]
    context = context_for(
        handle,
        instruction=DOCTOR_INSTRUCTION,
        model=DOCTOR_MODEL,
        api_key=session["api_key"],
        base_urls=session["base_urls"],
        config={**harness.doctor_config(), **config},
    )
    try:
        launch = harness.launch(context)
    except PolarError as exc:
        report.mark("configured", False, str(exc))
        return
    files = ", ".join(sorted(launch.files)) or "none"
    via = "stdin" if launch.stdin is not None else "argv/env/file"
    report.mark("configured", True, f"argv[0]={launch.argv[0]}; home files: {files}; instruction via {via}")

    run = await run_harness(harness, handle, context, timeout=timeout)
    report.run = run
    completions = await proxy.completions(session_id)
    report.completions = completions
    report.requests = list(proxy.requests.get(session_id, []))

    first = completions[0] if completions else None
    if first is None:
        report.mark("first request", False, "the harness made no model call")
    else:
        expected_protocols = PROTOCOLS.get(harness.provider, ())
        tools = len(first.get("request_tools") or [])
        report.mark(
            "first request",
            first["provider"] in expected_protocols,
            f"{first['provider']} (expected {' or '.join(expected_protocols)}), {tools} tools",
        )
        user_text = _user_text(first.get("request_messages") or [])
        verbatim = DOCTOR_INSTRUCTION.strip() in user_text
        report.mark("instruction verbatim", verbatim, "arrived unchanged" if verbatim else f"got: {user_text[-400:]!r}")

    second = completions[1] if len(completions) > 1 else None
    if second is not None:
        results = _text(second.get("request_messages") or [], ("tool", "user"))
        report.mark("tool executed", expected in results, "its output came back in the next request"
                    if expected in results else "the next request carries no output of the tool")  # fmt: skip
        report.mark(
            "second request", True, f"{second['provider']}, {len(second.get('request_messages') or [])} messages"
        )
    else:
        report.mark("second request", False, "the harness made no second model call")
        report.mark("tool executed", False, "no request after the tool call")

    written = handle.session_dir / DOCTOR_FILE
    content = written.read_text(errors="replace").strip() if written.is_file() else None
    report.mark("file written", content == expected, f"{DOCTOR_FILE}: {content!r}" if content is not None else
                f"{DOCTOR_FILE} is missing")  # fmt: skip
    pwned = sorted(p.name for p in handle.session_dir.rglob("polar-pwned*"))
    pwned += sorted(p.name for p in Path(handle.home_path).rglob("polar-pwned*")) if runtime_is_local(handle) else []
    report.mark("nothing injected", not pwned, "no polar-pwned-* file" if not pwned else f"found {pwned}")

    report.mark("exit status", run.ok, f"exit {run.exit_code} in {run.seconds:.1f} s" if run.ok
                else failure_report(harness, run))  # fmt: skip
    generations = [r for r in report.requests if r.kind == "generate"]
    side = [f"{r.method} {r.path}" for r in report.requests if r.kind != "generate"]
    refused = [f"{r.path} -> {r.status}" for r in generations if r.status != 200]
    if refused:
        report.mark("completions recorded", False, f"the proxy refused generation calls: {refused}")
        return
    exact = len(completions) == len(generations) == turns
    detail = f"{len(completions)} completions for {len(generations)} generation calls (script: {turns} turns)"
    report.mark("completions recorded", exact, detail + (f"; side requests not recorded: {side}" if side else ""))


def runtime_is_local(handle: RuntimeHandle) -> bool:
    return Path(handle.home_path).is_dir()
