"""``polar status [TASK_ID] --server URL [--watch] [--json]``: a rollout server's tasks, sessions by stage, nodes
(load, heartbeat age), inference pools and throughput; or one task's sessions. ``--watch`` refreshes it every
``--interval`` seconds (a live view on a terminal, one view per refresh otherwise) until Ctrl-C, and keeps trying,
showing the error, while the server cannot be reached."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Annotated, get_args

import orjson
import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from polar_cli.client import PolarClient
from polar_cli.commands.flags import positive_seconds
from polar_cli.commands.inference import pools_table
from polar_cli.commands.interrupt import Interrupted, stop_on_signals
from polar_cli.commands.output import JsonOption, emit_json, stdout_console
from polar_cli.commands.reward_tables import reward_table, task_reward_table
from polar_cli.commands.run import add_result_columns, result_cells, styled
from polar_cli.commands.submit import ServerOption, TokenOption
from polar_cli.errors import PolarError
from polar_cli.models import RecentRewards, ServiceStatus, SessionState, StatusReport, TaskStatus
from polar_cli.server.retention import format_size

WATCH_TIMEOUT_S = 10.0
"""Each request of ``--watch``: a server that hangs shows up as an error within this, and the next refresh tries
again."""


RECENT_TASKS_SHOWN = 5
"""Rows of the service view's table of the last ended tasks (``--json`` has every task the server sent)."""

NODE_CAPTION = (
    "where: its host, and its Slurm job.step when Slurm started it; assigned: sessions the server sent the "
    "node and has not seen finish; running and queued: as the node reported them in its last heartbeat "
    "(its age in the last column)"
)


def _ago(timestamp: float | None) -> str:
    return "-" if timestamp is None else f"{max(0.0, time.time() - timestamp):.1f}s ago"


def _window(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def service_tables(status: ServiceStatus) -> Group:
    """Tasks and sessions by state, one row per node (health, draining, load, heartbeat age), throughput over the
    last minutes, the pending sessions; and the inference pools when ``status`` is a StatusReport."""
    tasks = Table(title="tasks")
    tasks.add_column("state")
    tasks.add_column("tasks", justify="right")
    for state, count in sorted(status.tasks.items()):
        tasks.add_row(styled(state), str(count))
    sessions = Table(title="sessions")
    sessions.add_column("stage")
    sessions.add_column("sessions", justify="right")
    for stage in get_args(SessionState):
        sessions.add_row(stage, str(status.sessions.get(stage, 0)))
    # running/queued are the node's own figures from its last heartbeat (they lag the sessions table above by up to
    # the heartbeat's age); assigned is the server's own count: the labels say which is which.
    nodes = Table(title="nodes", caption=NODE_CAPTION)
    counts = ("run slots", "assigned", "running at heartbeat", "queued at heartbeat")
    for column in ("node", "url", "where", "health", "draining", *counts, "heartbeat"):
        nodes.add_column(column, justify="right" if column in counts else "left")
    for node in status.nodes:
        heartbeat = _ago(node.last_heartbeat) if node.heartbeat_age_s is None else f"{node.heartbeat_age_s:.1f}s ago"
        nodes.add_row(
            node.node_id,
            node.url,
            escape(node.placement.describe()) if node.placement is not None else "-",
            "[green]healthy[/green]" if node.healthy else "[red]unhealthy[/red]",
            "[yellow]draining[/yellow]" if node.draining else "no",
            str(node.load.run_slots),
            "-" if node.load.assigned is None else str(node.load.assigned),
            str(node.load.running),
            str(node.load.queued),
            heartbeat,
        )
    counts_row = Table.grid(padding=(0, 2))  # side by side: the view fits a terminal's height under --watch
    row: list[RenderableType] = [tasks, sessions]
    if status.throughput:
        throughput = Table(title="throughput")
        for column in ("last", "finished", "per minute", "sampled tokens", "tokens/s"):
            throughput.add_column(column, justify="left" if column == "last" else "right")
        for w in status.throughput:
            rate = w.sampled_tokens / w.window_s
            throughput.add_row(_window(w.window_s), str(w.finished), f"{w.per_minute:g}", str(w.sampled_tokens),
                               f"{rate:.1f}")  # fmt: skip
        row.append(throughput)
    counts_row.add_row(*row)
    parts: list[RenderableType] = [counts_row, nodes]
    pending = f"pending sessions: {status.pending_sessions}"
    if status.pending_callbacks is not None:
        pending += f"   trainer callbacks not yet delivered: {status.pending_callbacks}"
    parts.append(pending)
    if status.disk is not None or status.retention is not None:
        parts.append(disk_table(status))
    if status.rewards is not None and status.rewards.tasks:
        parts.extend(recent_reward_tables(status.rewards))
    if isinstance(status, StatusReport):
        if status.inference is not None:
            parts.append(pools_table(status.inference))
        elif status.inference_error is not None:
            parts.append(f"[red]inference pools: {escape(status.inference_error)}[/red]")
    return Group(*parts)


def disk_table(status: ServiceStatus) -> Table:
    """The data dir's size as the server last measured it, and what retention is set to do and has done."""
    table = Table(title="disk (the server's data dir)", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    disk = status.disk
    if disk is not None:
        table.add_row("database", f"{format_size(disk.db_bytes)} ({format_size(disk.db_free_bytes)} free inside)")
        table.add_row("results", format_size(disk.results_bytes))
        table.add_row("journals", format_size(disk.journal_bytes))
        table.add_row("total", f"{format_size(disk.total_bytes)}, measured {_ago(disk.measured_at)}")
        table.add_row("kept (what max_bytes weighs)", format_size(disk.kept_bytes))
    retention = status.retention
    if retention is not None:
        table.add_row("retention", retention.settings)
        table.add_row("removed by retention", f"{retention.removed_tasks} tasks")
        table.add_row("compacted by retention", f"{retention.compacted_tasks} tasks")
        table.add_row("freed by retention", format_size(retention.freed_bytes))
        if retention.note:
            table.add_row("[yellow]note[/yellow]", f"[yellow]{escape(retention.note)}[/yellow]")
    return table


def recent_reward_tables(rewards: RecentRewards) -> list[Table]:
    """The rewards of the last tasks that ended: per harness, and the newest tasks one by one."""
    count = len(rewards.tasks)
    harnesses = [([h.harness, str(h.tasks)], h.stats) for h in rewards.harnesses]
    per_harness = reward_table(f"rewards by harness (the last {count} tasks that ended)", harnesses,
                               ["harness", "tasks"])  # fmt: skip
    shown = rewards.tasks[-RECENT_TASKS_SHOWN:]
    per_task = reward_table(f"rewards of the last {len(shown)} tasks that ended",
                            [([t.task_id, t.harness or "-"], t.stats) for t in shown], ["task", "harness"])  # fmt: skip
    return [per_harness, per_task]


def task_view(status: TaskStatus) -> RenderableType:
    """The task's sessions and its reward statistics."""
    rewards = task_reward_table(status)
    return task_table(status) if rewards is None else Group(task_table(status), rewards)


def task_table(status: TaskStatus) -> Table:
    """One row per session: its state, and its result's columns once it has finished."""
    finished = {r.session_id: r for r in status.results}
    compacted = " (compacted by retention: traces dropped)" if status.retention == "compacted" else ""
    table = Table(
        title=f"task {status.task_id}: {styled(status.state)}, {status.completed} completed, {status.failed} failed "
        f"of {status.num_samples}{compacted}"
    )
    table.add_column("session")
    table.add_column("state")
    add_result_columns(table)
    for session_id, state in sorted(status.sessions.items()):
        result = finished.get(session_id)
        cells = result_cells(result) if result is not None else ["-"] * len(table.columns[2:])
        table.add_row(session_id, state, *cells)
    return table


def status_report(client: PolarClient) -> StatusReport:
    """The server's status and its inference pools (a failed ``GET /inference`` is kept as ``inference_error``)."""
    report = StatusReport.model_validate(client.service_status().model_dump())
    try:
        report.inference = client.inference()
    except PolarError as exc:
        report.inference_error = str(exc)
    return report


def _view(answer: TaskStatus | StatusReport) -> RenderableType:
    return task_view(answer) if isinstance(answer, TaskStatus) else service_tables(answer)


def watch(fetch: Callable[[], TaskStatus | StatusReport], interval: float, count: int | None, as_json: bool) -> None:
    """Show ``fetch()`` every ``interval`` seconds, ``count`` times (None: until Ctrl-C or SIGTERM, which end it
    cleanly); a failed fetch shows its error under the last view, and the next refresh tries again."""
    console = stdout_console()
    live = Live(console=console, auto_refresh=False) if console.is_terminal and not as_json else None
    last: RenderableType = "waiting for the server"
    shown = 0
    try:
        with stop_on_signals(), live if live is not None else contextlib.nullcontext():
            while count is None or shown < count:
                when = time.strftime("%H:%M:%S")
                try:
                    answer = fetch()
                except PolarError as exc:
                    if as_json:
                        _json_line({"error": str(exc), "at": time.time()})
                    view: RenderableType = Group(last, f"[red]{when}: {escape(str(exc))}; retrying every "
                                                       f"{interval:g}s[/red]")  # fmt: skip
                else:
                    if as_json:
                        _json_line(answer.model_dump(mode="json"))
                    last = view = Group(f"[bold]{when}[/bold] every {interval:g}s (Ctrl-C stops)", _view(answer))
                shown += 1
                if live is not None:
                    live.update(view, refresh=True)
                elif not as_json:
                    console.print(view)
                if count is None or shown < count:
                    time.sleep(interval)
    except (Interrupted, KeyboardInterrupt):
        pass


def _json_line(document: object) -> None:
    print(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS).decode(), flush=True)


def status(
    task_id: Annotated[str | None, typer.Argument(help="Show this task's sessions.", show_default=False)] = None,
    server: ServerOption = None,
    token: TokenOption = None,
    as_json: bool = JsonOption,
    watch_: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C (--json: one JSON line each)."),
    interval: Annotated[
        float, typer.Option("--interval", callback=positive_seconds, help="Seconds between refreshes of --watch.")
    ] = 2.0,
    count: int | None = typer.Option(
        None, "--count", min=1, help="With --watch: stop after this many refreshes.", show_default=False
    ),
) -> None:
    """Show a rollout server's tasks and sessions by state, its nodes (load, health, heartbeat age), the inference
    pools and the throughput of the last minutes; or, with a TASK_ID, that task's sessions. --watch keeps it live."""
    with PolarClient(server, token, timeout=WATCH_TIMEOUT_S if watch_ else 30.0) as client:

        def fetch() -> TaskStatus | StatusReport:
            return client.status(task_id) if task_id else status_report(client)

        if watch_:
            watch(fetch, interval, count, as_json)
            return
        answer = fetch()
    if as_json:
        emit_json(answer)
    else:
        stdout_console().print(_view(answer))


def register(app: typer.Typer) -> None:
    app.command("status")(status)
