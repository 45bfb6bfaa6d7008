"""Running counts of the rollout server's database, kept by SQLite triggers in the transaction of each change.

``GET /rollout/status``, the metrics, a task's state and dispatch read these few rows instead of counting sessions,
so their cost does not grow with the sessions stored (100,000 in flight). Being triggers, they change in the same
transaction (and savepoint) as the rows they count: a rolled-back call, or a crash, never leaves them off.
"""

from __future__ import annotations

import sqlite3

COUNTERS = """
CREATE TABLE IF NOT EXISTS counters (kind TEXT NOT NULL, key TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (kind, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS task_counters (task_id TEXT NOT NULL, state TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (task_id, state)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS sessions_counted AFTER INSERT ON sessions BEGIN
    INSERT INTO counters VALUES ('session', NEW.state, 1) ON CONFLICT DO UPDATE SET n = n + 1;
    INSERT INTO task_counters VALUES (NEW.task_id, NEW.state, 1) ON CONFLICT DO UPDATE SET n = n + 1;
    INSERT INTO counters SELECT 'node', NEW.node_id, 1 WHERE NEW.node_id IS NOT NULL
        AND NEW.state IN ('dispatched', 'running') ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS sessions_recounted AFTER UPDATE OF state, node_id ON sessions
WHEN OLD.state IS NOT NEW.state OR OLD.node_id IS NOT NEW.node_id BEGIN
    UPDATE counters SET n = n - 1 WHERE kind = 'session' AND key = OLD.state;
    INSERT INTO counters VALUES ('session', NEW.state, 1) ON CONFLICT DO UPDATE SET n = n + 1;
    UPDATE task_counters SET n = n - 1 WHERE task_id = OLD.task_id AND state = OLD.state;
    INSERT INTO task_counters VALUES (NEW.task_id, NEW.state, 1) ON CONFLICT DO UPDATE SET n = n + 1;
    UPDATE counters SET n = n - 1 WHERE kind = 'node' AND key = OLD.node_id AND OLD.state IN ('dispatched', 'running');
    INSERT INTO counters SELECT 'node', NEW.node_id, 1 WHERE NEW.node_id IS NOT NULL
        AND NEW.state IN ('dispatched', 'running') ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS tasks_counted AFTER INSERT ON tasks BEGIN
    INSERT INTO counters VALUES ('task', NEW.state, 1) ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS tasks_recounted AFTER UPDATE OF state ON tasks WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE counters SET n = n - 1 WHERE kind = 'task' AND key = OLD.state;
    INSERT INTO counters VALUES ('task', NEW.state, 1) ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS outbox_counted AFTER INSERT ON outbox WHEN NEW.delivered_at IS NULL BEGIN
    INSERT INTO counters VALUES ('outbox', 'undelivered', 1) ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS outbox_recounted AFTER UPDATE OF delivered_at ON outbox
WHEN OLD.delivered_at IS NULL AND NEW.delivered_at IS NOT NULL BEGIN
    UPDATE counters SET n = n - 1 WHERE kind = 'outbox' AND key = 'undelivered';
END;
CREATE TRIGGER IF NOT EXISTS results_sized AFTER UPDATE OF result ON sessions BEGIN
    INSERT INTO counters VALUES ('data', 'bytes', COALESCE(LENGTH(CAST(NEW.result AS BLOB)), 0)
        - COALESCE(LENGTH(CAST(OLD.result AS BLOB)), 0)) ON CONFLICT DO UPDATE SET n = n + excluded.n;
END;
CREATE TRIGGER IF NOT EXISTS bodies_sized AFTER INSERT ON tasks BEGIN
    INSERT INTO counters VALUES ('data', 'bytes', LENGTH(CAST(NEW.body AS BLOB)))
        ON CONFLICT DO UPDATE SET n = n + excluded.n;
END;
CREATE TRIGGER IF NOT EXISTS bodies_resized AFTER UPDATE OF body ON tasks BEGIN
    INSERT INTO counters VALUES ('data', 'bytes', LENGTH(CAST(NEW.body AS BLOB)) - LENGTH(CAST(OLD.body AS BLOB)))
        ON CONFLICT DO UPDATE SET n = n + excluded.n;
END;
"""
"""Running counts, kept by triggers in the transaction of each change (so a savepoint rolled back, or a crash, never
leaves them off): sessions by state (``session``), tasks by state (``task``), each node's assigned sessions
(``node``: dispatched or running there), undelivered callbacks (``outbox``), the bytes of the task bodies and
results stored (``data``: what retention's ``max_bytes`` weighs; a session is inserted without a result), and each
task's sessions by state (``task_counters``). ``GET /rollout/status``, a task's state and dispatch read these instead
of scanning sessions."""

_RECOUNT = """
DELETE FROM counters;
DELETE FROM task_counters;
INSERT INTO counters SELECT 'session', state, COUNT(*) FROM sessions GROUP BY state;
INSERT INTO counters SELECT 'task', state, COUNT(*) FROM tasks GROUP BY state;
INSERT INTO counters SELECT 'node', node_id, COUNT(*) FROM sessions
    WHERE state IN ('dispatched', 'running') AND node_id IS NOT NULL GROUP BY node_id;
INSERT INTO counters SELECT 'outbox', 'undelivered', COUNT(*) FROM outbox WHERE delivered_at IS NULL;
INSERT INTO task_counters SELECT task_id, state, COUNT(*) FROM sessions GROUP BY task_id, state;
INSERT INTO counters SELECT 'data', 'bytes', (SELECT COALESCE(SUM(LENGTH(CAST(body AS BLOB))), 0) FROM tasks)
    + (SELECT COALESCE(SUM(LENGTH(CAST(result AS BLOB))), 0) FROM sessions);
"""
"""The counters computed from scratch: once, when a database made before them is first opened."""
COUNTERS_VERSION = "2"
"""Raised when a counter is added: a database counted by an older version is counted again when it opens."""


def install_counters(db: sqlite3.Connection) -> None:
    """Create the counters and their triggers (inside the caller's write transaction); fill them from the tables the
    first time (a database made before them)."""
    for statement in _statements(COUNTERS):
        db.execute(statement)
    row = db.execute("SELECT value FROM meta WHERE key = 'counters'").fetchone()
    if row is not None and row[0] == COUNTERS_VERSION:
        return
    for statement in _statements(_RECOUNT):
        db.execute(statement)
    db.execute(
        "INSERT INTO meta VALUES ('counters', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (COUNTERS_VERSION,),
    )


def _statements(script: str) -> list[str]:
    """``script``'s statements (a trigger's body, with its own semicolons, stays one statement)."""
    out: list[str] = []
    current = ""
    for line in script.strip().splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    return out
