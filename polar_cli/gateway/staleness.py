"""Which running sessions sample under weights too old (issue 20): the rule, apart from the node that applies it.

A session's age is the policy version of its oldest completion (the version its first-sampled token came from; the
proxy keeps it per session as calls are recorded); a session with no completion yet is never stale. Two rules
cancel a running session with status ``stale``:

- its task's ``max_staleness``: after the gateway's version changes (resume, load_weights, a register that takes on
  the server's version), a session more than ``max_staleness`` versions behind;
- ``cancel_stale(older_than)``: a session whose oldest completion's version is below ``older_than`` (default: the
  current version), whatever its task says.
"""

from __future__ import annotations


def over_max_staleness(oldest: int | None, current: int, max_staleness: int | None) -> str | None:
    """Why a session whose oldest completion has version ``oldest`` is stale under its task's ``max_staleness``, or
    None when it is not."""
    if oldest is None or max_staleness is None or current - oldest <= max_staleness:
        return None
    return (
        f"stale: its oldest completion was sampled under policy version {oldest}, {current - oldest} behind the "
        f"current {current} (the task's max_staleness is {max_staleness})"
    )


def older_than(oldest: int | None, threshold: int) -> str | None:
    """Why a session is stale for ``cancel_stale(older_than=threshold)``, or None when it is not."""
    if oldest is None or oldest >= threshold:
        return None
    return f"stale: its oldest completion was sampled under policy version {oldest}, older than {threshold}"
