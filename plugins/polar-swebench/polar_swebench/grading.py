"""Polar's SWE grading rule, applied to the test statuses parsed from an eval log.

Resolved iff every FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes (an empty list passes). A
FAIL_TO_PASS test passes when its status is PASSED or XFAIL; a FAILED, ERROR, SKIPPED or missing one does not (as in
``swebench`` 5.x; 4.1 and SWE-Gym's fork count a skipped one as neither and may call such an instance resolved, and
4.1 counts a missing one as passing for its fail-only repos). A PASS_TO_PASS test still passes when PASSED, XFAIL or
SKIPPED (a skipped test is no regression, as in both ``swebench`` versions); a FAILED, ERROR or missing one does not. A
run that errored or timed out is never resolved, whatever the log says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PASSING = frozenset({"PASSED", "XFAIL"})
MAINTAINED = PASSING | {"SKIPPED"}  # a PASS_TO_PASS test that is skipped is no regression
MISSING = "MISSING"
START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
# the harness scripts print these when the run itself went wrong (SWE-bench's markers)
ERROR_MARKERS = {
    ">>>>> Patch Apply Failed": "the eval script could not apply a patch",
    ">>>>> Reset Failed": "the eval script could not reset the repository",
    ">>>>> Tests Errored": "the test run errored",
    ">>>>> Tests Timed Out": "the test run timed out",
}
_EXIT_CODE = re.compile(r">>>>> Test Exit Code: (-?\d+)")
LIST_LIMIT = 500  # tests listed per group in a report


def output_section(log: str) -> str:
    """The part of ``log`` between the start and end markers (the whole log when they are not both there)."""
    start = log.find(START_MARKER)
    end = log.find(END_MARKER, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return log
    return log[log.find("\n", start) + 1 : end]


def log_error(log: str) -> str | None:
    """Why the log shows a run that went wrong (an error marker), or None."""
    for marker, reason in ERROR_MARKERS.items():
        if marker in log:
            return reason
    return None


def _forged(log: str, statuses: Mapping[str, str]) -> str | None:
    """A non-zero ``Test Exit Code`` with no failing test means the output cannot be trusted."""
    codes = _EXIT_CODE.findall(log)
    if codes and int(codes[-1]) != 0 and not any(s in ("FAILED", "ERROR") for s in statuses.values()):
        return f"the tests exited with {codes[-1]} but no test failed in the log"
    return None


@dataclass
class GradeReport:
    """The outcome of one graded run: resolved, why not, and each FAIL_TO_PASS / PASS_TO_PASS test's status."""

    resolved: bool
    reason: str | None
    fail_to_pass: dict[str, str] = field(default_factory=dict)
    pass_to_pass: dict[str, str] = field(default_factory=dict)

    def as_details(self) -> dict[str, Any]:
        def failing(tests: dict[str, str], ok: frozenset[str]) -> list[str]:
            return [t for t, s in tests.items() if s not in ok]

        return {
            "resolved": self.resolved,
            "reason": self.reason,
            "tests": {
                "FAIL_TO_PASS": dict(list(self.fail_to_pass.items())[:LIST_LIMIT]),
                "PASS_TO_PASS": dict(list(self.pass_to_pass.items())[:LIST_LIMIT]),
            },
            "fail_to_pass_failing": failing(self.fail_to_pass, PASSING)[:LIST_LIMIT],
            "pass_to_pass_failing": failing(self.pass_to_pass, MAINTAINED)[:LIST_LIMIT],
        }


def grade(
    statuses: Mapping[str, str],
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    *,
    log: str = "",
    run_error: str | None = None,
) -> GradeReport:
    """Apply the rule to parsed ``statuses``; ``run_error`` (e.g. a timeout) or an error marker in ``log`` fails."""
    f2p = {t: statuses.get(t, MISSING) for t in dict.fromkeys(fail_to_pass)}
    p2p = {t: statuses.get(t, MISSING) for t in dict.fromkeys(pass_to_pass)}
    reason = run_error or log_error(log) or _forged(log, statuses)
    if reason is None and not statuses:
        reason = "no test results found in the eval log"
    if reason is None:
        bad_f2p = [t for t, s in f2p.items() if s not in PASSING]
        bad_p2p = [t for t, s in p2p.items() if s not in MAINTAINED]
        if bad_f2p:
            first = bad_f2p[0]
            reason = f"{len(bad_f2p)} of {len(f2p)} FAIL_TO_PASS tests do not pass (e.g. {first}: {f2p[first]})"
        elif bad_p2p:
            first = bad_p2p[0]
            reason = f"{len(bad_p2p)} of {len(p2p)} PASS_TO_PASS tests no longer pass (e.g. {first}: {p2p[first]})"
    return GradeReport(resolved=reason is None, reason=reason, fail_to_pass=f2p, pass_to_pass=p2p)
