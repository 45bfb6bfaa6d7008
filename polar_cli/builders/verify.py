"""An independent checker of the token-faithfulness contract, for tests and for users' CI.

It knows nothing about how a builder works. Given a trajectory and the completions it came from, it checks:

* every run of loss-mask-1 tokens is the sampled tokens of one or more completions, each whole and in order, with
  each token's sampled logprob (and token text, where both sides have it);
* every completion's sampled tokens appear exactly once across all traces;
* every mask-0 token is context, not a sample: it carries a placeholder logprob entry, and each mask-0 segment is a
  suffix of the prompt of the completion whose tokens follow it (the model read those tokens, it did not sample
  them);
* the context is the one the tokens were sampled in: a trace's ``prompt_ids`` start every prompt of the completions
  placed in it, and consecutive completions in a trace are in capture order with strictly extending prompts, the
  later one's history not demonstrably holding a sibling branch's response instead of the earlier one's
  (``evidence.continues``); and the trace's tokens before each completion's sampled tokens are exactly its prompt,
  unless the trace says they are not (``context_exact`` false on the trace, and false for that completion in its
  ``metadata["context_exact"]`` where it has one: built with ``merge: prompt_prefix``, they are then a note);
* a trace's ``policy_versions`` cover the version of every completion placed in it (none where they recorded none).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, Field

from polar_cli.builders.common import completion_versions, gc_paused
from polar_cli.builders.evidence import continues
from polar_cli.errors import VerificationError
from polar_cli.models import Completion, Trace, Trajectory


class Violation(BaseModel):
    """One broken rule; ``position`` indexes the trace's ``response_ids``."""

    code: str
    message: str
    trace: int | None = None
    completion_id: str | None = None
    position: int | None = None


class VerificationReport(BaseModel):
    """What ``verify`` found. ``ok`` is true when there is no violation."""

    ok: bool
    traces: int
    completions: int
    placed_completions: int
    sampled_tokens: int
    trainable_tokens: int
    interstitial_tokens: int
    logprobs_checked: bool
    violation_count: int
    violations: list[Violation] = Field(default_factory=list, description="the first max_violations of them")
    notes: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        head = f"{self.violation_count} violation(s) in {self.traces} trace(s) of {self.completions} completion(s)"
        return head + ("" if self.ok else ": " + "; ".join(v.message for v in self.violations[:3]))


_REPORTED = -1  # _match found only already-placed completions and said so


class _Checker:
    def __init__(self, completions: Sequence[Completion], max_violations: int) -> None:
        self.completions = sorted(completions, key=lambda c: c.index)
        self.max_violations = max_violations
        self.violations: list[Violation] = []
        self.count = 0
        self.notes: list[str] = []
        self.logprobs_checked = True
        self.placed: dict[int, tuple[int, int]] = {}  # completion position -> (trace, response offset)
        self.in_context: dict[int, bool] = {}  # completion position -> the trace before it is exactly its prompt
        self.by_first: dict[int, list[int]] = defaultdict(list)
        for pos, c in enumerate(self.completions):
            if c.response_ids:
                self.by_first[c.response_ids[0]].append(pos)

    def fail(
        self,
        code: str,
        message: str,
        *,
        trace: int | None = None,
        completion_id: str | None = None,
        position: int | None = None,
    ) -> None:
        self.count += 1
        if len(self.violations) < self.max_violations:
            self.violations.append(
                Violation(code=code, message=message, trace=trace, completion_id=completion_id, position=position)
            )

    def trace(self, ti: int, trace: Trace) -> None:
        ids, mask, entries = trace.response_ids, trace.loss_mask, trace.response_logprobs
        if not self._aligned(ti, trace):
            return
        prev: int | None = None  # last completion placed in this trace
        zero: tuple[int, int] | None = None  # the mask-0 segment right before the current position
        for start, end, bit in _segments(mask):
            if bit == 0:
                if entries is not None:
                    bad = next((j for j in range(start, end) if entries[j]["logprob"] != 0.0), None)
                    if bad is not None:
                        self.fail(
                            "sampled_interstitial",
                            f"trace {ti}: mask-0 token at {bad} carries logprob "
                            f"{entries[bad]['logprob']}, not a placeholder",
                            trace=ti,
                            position=bad,
                        )
                zero = (start, end)
                continue
            offset = start
            while offset < end:
                pos = self._match(trace, offset, end, prev, zero)
                if pos == _REPORTED:
                    break
                if pos is None:
                    self.fail(
                        "unsampled_trainable",
                        f"trace {ti}: mask-1 tokens {offset}..{end - 1} are not the "
                        "sampled tokens of any completion not placed elsewhere",
                        trace=ti,
                        position=offset,
                    )
                    break
                self._place(ti, trace, offset, pos, prev, zero)
                prev, zero = pos, None
                offset += len(self.completions[pos].response_ids)
        if zero is not None and prev is not None and zero[1] == len(ids):
            # Harmless (trains nothing, conditions nothing) and the paper's own example ends this way: a note only.
            self.notes.append(f"trace {ti} ends with {zero[1] - zero[0]} mask-0 token(s) after its last sampled turn")

    def _aligned(self, ti: int, trace: Trace) -> bool:
        ids, mask, entries = trace.response_ids, trace.loss_mask, trace.response_logprobs
        problem = None
        if len(mask) != len(ids):
            problem = f"loss_mask has {len(mask)} entries for {len(ids)} response_ids"
        elif any(m not in (0, 1) for m in mask):
            problem = "loss_mask holds values other than 0 and 1"
        elif entries is not None and [e["token_id"] for e in entries] != ids:
            problem = "response_logprobs are not aligned with response_ids"
        if problem:
            self.fail("misaligned", f"trace {ti}: {problem}", trace=ti)
        return problem is None

    def _match(self, trace: Trace, offset: int, end: int, prev: int | None, zero: tuple[int, int] | None) -> int | None:
        """The completion whose sampled tokens start at ``offset``: unused, context-consistent ones first."""
        ids = trace.response_ids
        fitting = [
            pos
            for pos in self.by_first.get(ids[offset], ())
            if offset + len(r := self.completions[pos].response_ids) <= end and ids[offset : offset + len(r)] == r
        ]
        unused = [pos for pos in fitting if pos not in self.placed]
        if not unused:
            if fitting:
                c = self.completions[fitting[0]]
                where = self.placed[fitting[0]]
                self.fail(
                    "duplicated",
                    f"sampled tokens of completion {c.completion_id!r} (placed in trace "
                    f"{where[0]}) appear again at {offset}",
                    completion_id=c.completion_id,
                    position=offset,
                )
                return _REPORTED
            return None
        consistent = [pos for pos in unused if not self._context_problems(trace, pos, prev, zero, offset)[0]]
        return (consistent or unused)[0]

    def _context_problems(
        self, trace: Trace, pos: int, prev: int | None, zero: tuple[int, int] | None, offset: int
    ) -> tuple[list[str], bool]:
        """What is wrong with the context of completion ``pos`` placed at ``offset``, and whether the trace before it
        is exactly its prompt."""
        c = self.completions[pos]
        prompt = c.prompt_ids
        problems = []
        if prompt[: len(trace.prompt_ids)] != trace.prompt_ids:
            problems.append("the trace's prompt_ids are not a prefix of its prompt")
        base = len(trace.prompt_ids)
        if prev is not None:
            before = self.completions[prev]
            base = len(before.prompt_ids)
            if before.index >= c.index:
                problems.append(f"it follows completion {before.completion_id!r}, captured later")
            if not (len(before.prompt_ids) < len(prompt) and prompt[: len(before.prompt_ids)] == before.prompt_ids):
                problems.append(f"its prompt does not strictly extend that of {before.completion_id!r}")
            # Not knowing end-of-turn ids, treat the earlier response's last token as one (only ever stripped).
            elif not continues(before, c, frozenset(before.response_ids[-1:]), lambda: self._same_prompt(before)):
                problems.append(f"its history continues another response than that of {before.completion_id!r}")
        if zero is not None:
            segment = trace.response_ids[zero[0] : zero[1]]
            if len(segment) > len(prompt) - base or prompt[len(prompt) - len(segment) :] != segment:
                problems.append(f"the mask-0 tokens {zero[0]}..{zero[1] - 1} before it are not the end of its prompt")
        exact = not problems and self._in_context(trace, offset, pos, prev)
        if not problems and not exact and _claims_exact(trace, c):
            problems.append(
                f"the trace's {len(trace.prompt_ids) + offset} tokens before its sampled tokens are not "
                f"its prompt of {len(prompt)} tokens, and the trace does not say so (context_exact)"
            )
        return problems, exact

    def _in_context(self, trace: Trace, offset: int, pos: int, prev: int | None) -> bool:
        """The trace's tokens before response position ``offset`` are exactly the prompt of completion ``pos``, given
        that the trace's ``prompt_ids`` start it and that it extends the prompt of ``prev`` (the completion placed
        before it): then only the tokens since ``prev``'s need comparing (linear, not quadratic)."""
        prompt = self.completions[pos].prompt_ids
        base = len(trace.prompt_ids)
        if base + offset != len(prompt):
            return False
        if prev is None:
            return trace.response_ids[:offset] == prompt[base:]
        if not self.in_context.get(prev, False):
            return False  # the trace departed from the prompts before prev's tokens already
        since = self.placed[prev][1]
        return trace.response_ids[since:offset] == prompt[base + since :]

    def _same_prompt(self, completion: Completion) -> list[Completion]:
        prompt = completion.prompt_ids
        return [c for c in self.completions if len(c.prompt_ids) == len(prompt) and c.prompt_ids == prompt]

    def _place(
        self, ti: int, trace: Trace, offset: int, pos: int, prev: int | None, zero: tuple[int, int] | None
    ) -> None:
        c = self.completions[pos]
        self.placed[pos] = (ti, offset)
        problems, self.in_context[pos] = self._context_problems(trace, pos, prev, zero, offset)
        if not problems and not self.in_context[pos]:
            self.notes.append(
                f"trace {ti}: completion {c.completion_id!r} sits in a context other than its prompt, "
                "as the trace says (context_exact: false)"
            )
        for problem in problems:
            self.fail(
                "context",
                f"trace {ti}: completion {c.completion_id!r} at {offset}: {problem}",
                trace=ti,
                completion_id=c.completion_id,
                position=offset,
            )
        self._versions(ti, trace, c, offset)
        entries = trace.response_logprobs
        n = len(c.response_ids)
        if entries is None:
            if c.response_logprobs is not None:
                self.logprobs_checked = False
                self.notes.append(f"trace {ti} has no response_logprobs; completion {c.completion_id!r} had them")
            return
        got = [e["logprob"] for e in entries[offset : offset + n]]
        if c.response_logprobs is None:
            self.fail(
                "logprob_mismatch",
                f"trace {ti}: logprobs at {offset}.. for completion {c.completion_id!r}, which recorded none",
                trace=ti,
                completion_id=c.completion_id,
                position=offset,
            )
        elif got != c.response_logprobs:
            pairs = zip(got, c.response_logprobs, strict=True)
            j = next((j for j, (a, b) in enumerate(pairs) if not _same(a, b)), None)
            if j is not None:
                self.fail(
                    "logprob_mismatch",
                    f"trace {ti}: logprob {got[j]} at {offset + j} but completion "
                    f"{c.completion_id!r} sampled it with {c.response_logprobs[j]}",
                    trace=ti,
                    completion_id=c.completion_id,
                    position=offset + j,
                )
        if c.response_tokens is not None:
            for j, e in enumerate(entries[offset : offset + n]):
                text = e.get("token")
                if text is not None and text != c.response_tokens[j]:
                    self.fail(
                        "token_text_mismatch",
                        f"trace {ti}: token text {text!r} at {offset + j}, sampled {c.response_tokens[j]!r}",
                        trace=ti,
                        completion_id=c.completion_id,
                        position=offset + j,
                    )
                    break

    def _versions(self, ti: int, trace: Trace, c: Completion, offset: int) -> None:
        """The trace's ``policy_versions`` must hold the versions ``c`` was sampled under."""
        sampled = sorted({span.version for span in completion_versions(c)})
        recorded = trace.policy_versions
        if not sampled:
            return
        if recorded is None:
            problem = "the trace records no policy_versions"
        elif not recorded.oldest <= sampled[0] <= sampled[-1] <= recorded.newest:
            problem = f"outside the trace's policy_versions {recorded.oldest}..{recorded.newest}"
        elif c.policy_version not in recorded.per_completion:
            problem = "not in the trace's policy_versions.per_completion"
        else:
            return
        self.fail(
            "policy_version",
            f"trace {ti}: completion {c.completion_id!r} at {offset} was sampled under version(s) "
            f"{', '.join(map(str, sampled))}: {problem}",
            trace=ti,
            completion_id=c.completion_id,
            position=offset,
        )

    def missing(self) -> None:
        for pos, c in enumerate(self.completions):
            if c.response_ids and pos not in self.placed:
                self.fail(
                    "missing",
                    f"the {len(c.response_ids)} sampled tokens of completion {c.completion_id!r} "
                    f"(index {c.index}) appear in no trace as trainable tokens",
                    completion_id=c.completion_id,
                )


def _claims_exact(trace: Trace, completion: Completion) -> bool:
    """Whether ``trace`` says ``completion`` sits in its own prompt: the trace's ``context_exact``, else the entry for
    it in ``metadata["context_exact"]`` (aligned with ``metadata["completion_ids"]``)."""
    if trace.context_exact:
        return True
    ids, flags = trace.metadata.get("completion_ids"), trace.metadata.get("context_exact")
    if not (isinstance(ids, list) and isinstance(flags, list) and len(ids) == len(flags)):
        return False
    return completion.completion_id in ids and flags[ids.index(completion.completion_id)] is True


def _segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values as (start, end, value)."""
    out = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def verify(
    trajectory: Trajectory,
    completions: Sequence[Completion],
    *,
    raise_on_violation: bool = False,
    max_violations: int = 100,
) -> VerificationReport:
    """Check ``trajectory`` against the ``completions`` it was built from; see the module docstring for the rules.

    Returns a report; with ``raise_on_violation`` a violation raises :class:`VerificationError` instead.
    """
    checker = _Checker(completions, max_violations)
    with gc_paused():
        for ti, trace in enumerate(trajectory.traces):
            checker.trace(ti, trace)
        checker.missing()
    masks = [t.loss_mask for t in trajectory.traces]
    report = VerificationReport(
        ok=checker.count == 0,
        traces=len(trajectory.traces),
        completions=len(checker.completions),
        placed_completions=len(checker.placed),
        sampled_tokens=sum(len(c.response_ids) for c in checker.completions),
        trainable_tokens=sum(sum(m) for m in masks),
        interstitial_tokens=sum(len(m) - sum(m) for m in masks),
        logprobs_checked=checker.logprobs_checked,
        violation_count=checker.count,
        violations=checker.violations,
        notes=checker.notes,
    )
    if raise_on_violation and not report.ok:
        raise VerificationError(f"trajectory violates the token-faithfulness contract: {report.summary()}")
    return report
