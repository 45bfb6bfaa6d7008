"""``recompute``: the logprob of every sampled (mask-1) token, recomputed under given weights and compared with the
logprob recorded at sampling (TRAINERS.md, "Fidelity").

For each trace and each policy version its tokens were sampled under, ``prompt_ids + response_ids`` go through the
causal LM (on ``device``, in ``dtype``, ``chunk_size`` tokens a pass with the KV cache, float32 ``log_softmax``, no
temperature: vLLM records raw logprobs by default); the logprob of token ``t`` comes from the logits at ``t - 1``.
Per token, Δ = recorded - recomputed. The KL estimate is the k3 estimator over the sampled tokens,
``mean(exp(r) - 1 - r)`` with ``r = recomputed - recorded``: an unbiased estimate of KL(behaviour ‖ recomputed) from
samples of the behaviour policy. A trace fails when its mean |Δ| is above the tolerance (by default the dtype's,
``logprobs.TOLERANCES``), or when it cannot be compared token for token (e.g. ``response_logprobs`` not aligned with
``response_ids``: the ids were rebuilt from text). A failed trace that says ``context_exact: false`` (built with
``merge: prompt_prefix``) has its reason say so: its tokens were scored in a context they were not sampled in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from polar_cli.errors import ConfigError
from polar_cli.models.trace import TokenVersion, token_versions
from polar_cli.proxy import reshaping
from polar_cli.recompute.inputs import LoadedTrace
from polar_cli.recompute.logprobs import CHUNK_SIZE
from polar_cli.recompute.structure import StructuralReport, check_structure

KL_ESTIMATOR = "k3: mean(exp(r) - 1 - r), r = recomputed - recorded logprob over the sampled tokens"
WORST = 10
SCRIPTED_BACKEND = "scripted"
SCRIPTED = ("sampled by the scripted backend, whose logprobs are synthetic (a deterministic stand-in, not any "
            "model's): they cannot be recomputed, so the trace is skipped")  # fmt: skip
INEXACT = ("context_exact: false (built with merge: prompt_prefix: its context is not the one its tokens were "
           "sampled in)")  # fmt: skip


class DeltaStats(BaseModel):
    """|Δlogprob| and the KL estimate over a set of tokens."""

    traces: int = 0
    tokens: int = 0
    max_abs_dlogprob: float = 0.0
    mean_abs_dlogprob: float = 0.0
    kl: float = 0.0


class TraceDelta(BaseModel):
    """One trace's figures; ``reason`` says why it failed (None when it passed)."""

    ref: str
    harness: str | None = None
    role: str | None = None
    tokens: int = 0
    mean_abs_dlogprob: float | None = None
    max_abs_dlogprob: float | None = None
    kl: float | None = None
    worst_position: int | None = Field(default=None, description="index into response_ids of the largest |Δ|")
    context_exact: bool = Field(default=True, description="the trace's flag (false: built with merge: prompt_prefix)")
    reason: str | None = None


class Compute(BaseModel):
    """Where and how fast the models ran: the tokens they went through (each trace's up to its last scored one, per
    model), the seconds that took (loading excluded), and on GPUs the most memory torch held on one of them."""

    device: str = Field(description="each model's placement: cpu, cuda:N, or device_map auto across N GPUs")
    dtype: str
    chunk_size: int = Field(description="tokens per forward pass (0: a whole sequence in one)")
    forward_tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    peak_gpu_memory_gib: float | None = Field(default=None, description="torch.cuda.max_memory_allocated, GiB")


class RecomputeReport(BaseModel):
    """What ``recompute`` found: ``ok`` when every trace's mean |Δ| is within ``tolerance``, every trace could be
    compared and the structural check (where a journal is known) found nothing."""

    ok: bool
    traces: int = Field(description="traces compared")
    tokens: int = Field(description="sampled tokens compared")
    max_abs_dlogprob: float
    mean_abs_dlogprob: float
    kl: float
    kl_estimator: str = KL_ESTIMATOR
    tolerance: float
    by_harness: dict[str, DeltaStats]
    by_role: dict[str, DeltaStats]
    by_version: dict[str, DeltaStats] = Field(description="by policy version ('-': none recorded)")
    worst: list[TraceDelta] = Field(description="failed traces first, then the largest mean |Δ| (at most 10)")
    failed: list[str] = Field(default_factory=list, description="refs of every failed trace")
    failed_context_inexact: list[str] = Field(
        default_factory=list, description="refs of the failed traces that say context_exact: false"
    )
    structural: StructuralReport
    skipped: list[str] = Field(default_factory=list, description="traces with nothing to compare, and why")
    scripted: int = Field(default=0, description="traces skipped because the scripted backend sampled them")
    warnings: list[str] = Field(default_factory=list)
    models: dict[str, str] = Field(default_factory=dict, description="policy version ('*': any) -> model folder")
    compute: Compute


@dataclass
class _Sums:
    traces: int = 0
    tokens: int = 0
    abs_sum: float = 0.0
    k3_sum: float = 0.0
    max_abs: float = 0.0

    def add(self, deltas: Sequence[float]) -> None:
        self.tokens += len(deltas)
        for d in deltas:  # d = recorded - recomputed, so r = -d
            self.abs_sum += abs(d)
            self.k3_sum += math.expm1(-d) + d
            self.max_abs = max(self.max_abs, abs(d))

    def stats(self) -> DeltaStats:
        n = self.tokens
        mean, kl = (self.abs_sum / n, self.k3_sum / n) if n else (0.0, 0.0)
        return DeltaStats(traces=self.traces, tokens=n, max_abs_dlogprob=self.max_abs, mean_abs_dlogprob=mean, kl=kl)


@dataclass
class _Plan:
    """Which response positions of one trace each model scores."""

    loaded: LoadedTrace
    by_model: dict[Path, list[int]] = field(default_factory=dict)
    versions: dict[int, int | None] = field(default_factory=dict)
    recomputed: dict[int, float] = field(default_factory=dict)
    reason: str | None = None


def _model_for(version: TokenVersion, models: Mapping[int | None, Path], ref: str) -> tuple[Path | None, int | None]:
    """The model folder scoring tokens of ``version`` (None, the tokens then skipped, when an unknown boundary's
    candidate versions map to different models), and the version to report them under."""
    if isinstance(version, tuple):
        paths = {_model_for(v, models, ref)[0] for v in version}
        return (paths.pop() if len(paths) == 1 else None), version[0]
    if version in models:
        return models[version], version
    if None in models:
        return models[None], version
    given = ", ".join(str(v) for v in models if v is not None)
    what = f"policy version {version}" if version is not None else "no recorded policy version"
    raise ConfigError(f"{ref} has tokens sampled under {what}, and no --model for it (given: {given or 'none'}; "
                      "a plain --model DIR applies to every version)")  # fmt: skip


def scripted(loaded: LoadedTrace) -> bool:
    """Whether the trace's session was sampled by the scripted backend: its journal says so (each completion's
    ``backend``), or the trace's metadata does."""
    if loaded.trace.metadata.get("backend") == SCRIPTED_BACKEND:
        return True
    return any(c.backend == SCRIPTED_BACKEND for c in loaded.completions or ())


def _plan(loaded: LoadedTrace, models: Mapping[int | None, Path], skipped: list[str], warnings: list[str]) -> _Plan:
    plan = _Plan(loaded)
    trace = loaded.trace
    if loaded.problems:
        plan.reason = "cannot be compared token for token: " + "; ".join(loaded.problems)
        return plan
    if trace.response_logprobs is None:
        skipped.append(f"{loaded.ref}: no response_logprobs recorded")
        return plan
    if scripted(loaded):
        skipped.append(f"{loaded.ref}: {SCRIPTED}")
        return plan
    versions = token_versions(trace)
    unscored = 0
    for i, bit in enumerate(trace.loss_mask):
        if bit != 1:
            continue
        if not trace.prompt_ids and i == 0:
            unscored += 1  # nothing before it to predict it from
            continue
        path, version = _model_for(versions[i], models, loaded.ref)
        if path is None:
            unscored += 1
            continue
        plan.by_model.setdefault(path, []).append(i)
        plan.versions[i] = version
    if unscored:
        warnings.append(
            f"{loaded.ref}: {unscored} sampled token(s) not compared (no context before them, or sampled across a "
            "weight update at an unknown token, under versions with different models)"
        )
    if not plan.by_model:
        skipped.append(f"{loaded.ref}: no sampled (mask-1) token to compare")
    return plan


def _sampling_warnings(traces: Sequence[LoadedTrace]) -> list[str]:
    """A session whose completions recorded processed logprobs of a reshaped distribution: recomputing without
    temperature cannot match them."""
    out, seen = [], set()
    for loaded in traces:
        if loaded.completions is None or loaded.session_id in seen:
            continue
        seen.add(loaded.session_id)
        for c in loaded.completions:
            settings = reshaping(c.request_params)
            if c.logprobs_mode == "processed" and settings:
                out.append(f"session {loaded.session_id}: completion {c.completion_id!r} recorded processed logprobs "
                           f"sampled with {', '.join(settings)}; the recompute is of the raw distribution, so expect "
                           "large Δ there")  # fmt: skip
                break
    return out


def _score(plans: Sequence[_Plan], dtype: str, device: str, chunk_size: int) -> Compute:
    from polar_cli.recompute.logprobs import CausalLM

    paths = sorted({p for plan in plans for p in plan.by_model}, key=str)
    compute, places, peak = Compute(device="", dtype=dtype, chunk_size=chunk_size), [], None
    for path in paths:
        model = CausalLM(path, dtype, device, chunk_size)
        places.append(str(model.placement))
        gpus = [f"cuda:{i}" for i in range(model.placement.gpus)] if model.placement.device_map else (
            [model.placement.device] if model.placement.gpus else [])  # fmt: skip
        for gpu in gpus:
            model.torch.cuda.reset_peak_memory_stats(gpu)
        began = time.perf_counter()
        for plan in plans:
            positions = plan.by_model.get(path)
            if not positions or plan.reason:
                continue
            trace = plan.loaded.trace
            ids = [*trace.prompt_ids, *trace.response_ids]
            bad = next((t for t in ids if not 0 <= t < model.vocab_size), None)
            if bad is not None:
                plan.reason = f"token id {bad} is outside the vocabulary of {path} ({model.vocab_size} ids)"
                continue
            base = len(trace.prompt_ids)
            scores = model.logprobs(ids, [base + i for i in positions])
            plan.recomputed.update(zip(positions, scores, strict=True))
            compute.forward_tokens += base + max(positions)
        for gpu in gpus:
            model.torch.cuda.synchronize(gpu)
            peak = max(peak or 0, model.torch.cuda.max_memory_allocated(gpu))
        compute.seconds += time.perf_counter() - began
        del model
    compute.device = ", ".join(dict.fromkeys(places)) or "-"
    compute.tokens_per_second = compute.forward_tokens / compute.seconds if compute.seconds else 0.0
    compute.peak_gpu_memory_gib = None if peak is None else peak / (1 << 30)
    return compute


def recompute(
    traces: Sequence[LoadedTrace],
    models: Mapping[int | None, Path],
    *,
    tolerance: float | None = None,
    dtype: str = "float32",
    device: str = "auto",
    chunk_size: int = CHUNK_SIZE,
) -> RecomputeReport:
    """Recompute every sampled token's logprob of ``traces`` under ``models`` (policy version -> model folder;
    the key None serves every version without its own) and compare; see the module docstring. The structural check
    runs too, on the sessions whose journal is known. ConfigError before any model loads when a trace's version has
    no model; MissingDependencyError without torch/transformers (``pip install 'polar-rl[train]'``)."""
    if not models:
        raise ConfigError("recompute needs a model: --model DIR, or --model VERSION=DIR per policy version")
    models = {v: Path(p) for v, p in models.items()}
    from polar_cli.recompute.logprobs import TOLERANCES, check_dtype, check_model_dir, placement

    check_dtype(dtype)
    tolerance = TOLERANCES[dtype] if tolerance is None else tolerance
    for path in models.values():
        check_model_dir(path)
        placement(path, dtype, device)  # a device that is not there, before any trace is planned
    skipped: list[str] = []
    warnings = _sampling_warnings(traces)
    plans = [_plan(loaded, models, skipped, warnings) for loaded in traces]
    structural = check_structure(traces)
    compute = _score(plans, dtype, device, chunk_size)

    total, by_harness, by_role, by_version = _Sums(), {}, {}, {}  # type: ignore[var-annotated]
    results: list[TraceDelta] = []
    for plan in plans:
        loaded = plan.loaded
        row = TraceDelta(ref=loaded.ref, harness=loaded.harness, role=loaded.role, reason=plan.reason,
                         context_exact=loaded.trace.context_exact)  # fmt: skip
        if plan.reason is None and plan.recomputed:
            entries = loaded.trace.response_logprobs or []
            deltas = {i: entries[i]["logprob"] - r for i, r in plan.recomputed.items()}
            finite = {i: d for i, d in deltas.items() if math.isfinite(d)}
            if len(finite) < len(deltas):
                row.reason = f"{len(deltas) - len(finite)} sampled token(s) with a non-finite recorded logprob"
            sums = _Sums()
            sums.add(list(finite.values()))
            stats = sums.stats()
            row.tokens, row.mean_abs_dlogprob, row.max_abs_dlogprob, row.kl = (
                stats.tokens, stats.mean_abs_dlogprob, stats.max_abs_dlogprob, stats.kl)  # fmt: skip
            row.worst_position = max(finite, key=lambda i: abs(finite[i]), default=None)
            if row.reason is None and stats.mean_abs_dlogprob > tolerance:
                row.reason = f"mean |Δlogprob| {stats.mean_abs_dlogprob:.3g} above the tolerance {tolerance:g}"
            total.traces += 1
            total.add(list(finite.values()))
            for key, table in ((loaded.harness or "-", by_harness), (loaded.role or "-", by_role)):
                table.setdefault(key, _Sums()).traces += 1
                table[key].add(list(finite.values()))
            for version in sorted({plan.versions[i] for i in finite}, key=lambda v: (v is None, v or 0)):
                key = "-" if version is None else str(version)
                by_version.setdefault(key, _Sums()).traces += 1
                by_version[key].add([d for i, d in finite.items() if plan.versions[i] == version])
        if row.reason is not None and not row.context_exact:
            row.reason += f"; {INEXACT}"
        if row.reason is not None or row.tokens:
            results.append(row)
    failed = [r for r in results if r.reason is not None]
    passed = sorted((r for r in results if r.reason is None), key=lambda r: -(r.mean_abs_dlogprob or 0.0))
    failed.sort(key=lambda r: -(r.mean_abs_dlogprob if r.mean_abs_dlogprob is not None else math.inf))
    stats = total.stats()
    return RecomputeReport(
        ok=not failed and structural.ok, traces=stats.traces, tokens=stats.tokens,
        max_abs_dlogprob=stats.max_abs_dlogprob, mean_abs_dlogprob=stats.mean_abs_dlogprob, kl=stats.kl,
        tolerance=tolerance, by_harness={k: s.stats() for k, s in sorted(by_harness.items())},
        by_role={k: s.stats() for k, s in sorted(by_role.items())}, by_version={k: s.stats() for k, s in
        by_version.items()}, worst=[*failed, *passed][:WORST], failed=[r.ref for r in failed],
        failed_context_inexact=[r.ref for r in failed if not r.context_exact],
        structural=structural, skipped=skipped, warnings=warnings, scripted=sum(map(scripted, traces)),
        models={"*" if v is None else str(v): str(p) for v, p in models.items()}, compute=compute,
    )  # fmt: skip
