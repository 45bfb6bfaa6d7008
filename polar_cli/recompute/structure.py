"""The structural check of loaded traces: ``polar_cli.builders.verify`` on each session whose journal is known,
its violations named by trace ``ref``; sessions without a journal are listed, never silently passed."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from polar_cli.builders.verify import verify
from polar_cli.models import Trajectory
from polar_cli.recompute.inputs import LoadedTrace


class StructuralViolation(BaseModel):
    ref: str
    """The trace it is in (or the session, for a completion that appears in no trace)."""
    code: str
    message: str


class StructuralReport(BaseModel):
    """``ok``: no violation in any session checked (True when none could be checked: see ``without_journal``)."""

    ok: bool
    checked: int = Field(description="traces checked against their session's journal")
    sessions: int = Field(description="sessions checked")
    without_journal: list[str] = Field(default_factory=list, description="sessions whose journal is unknown")
    violations: list[StructuralViolation] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def check_structure(traces: Sequence[LoadedTrace], *, max_violations: int = 100) -> StructuralReport:
    """Run the structural ``verify`` on every session of ``traces`` that carries its completions."""
    sessions: dict[str, list[LoadedTrace]] = {}
    for loaded in traces:
        sessions.setdefault(loaded.session_id or "?", []).append(loaded)
    report = StructuralReport(ok=True, checked=0, sessions=0)
    for session_id, members in sessions.items():
        completions = members[0].completions
        if completions is None:
            report.without_journal.append(session_id)
            continue
        members = sorted(members, key=lambda t: t.index)
        # model_construct: a trace that did not validate goes to verify as it is (verify reports it, by rule)
        trajectory = Trajectory.model_construct(session_id=session_id, status="completed",
                                                traces=[t.trace for t in members])  # fmt: skip
        found = verify(trajectory, completions, max_violations=max_violations)
        report.sessions += 1
        report.checked += len(members)
        for v in found.violations:
            ref = members[v.trace].ref if v.trace is not None else f"session {session_id}"
            report.violations.append(StructuralViolation(ref=ref, code=v.code, message=f"{ref}: {v.message}"))
        report.notes += [f"session {session_id}: {note}" for note in found.notes]
        report.ok = report.ok and found.ok
    return report
