"""A trace records the policy versions of the completions it was built from (issue 20): both builders fill
``Trace.policy_versions``, ``verify`` checks it, a trace without it still loads, and ``polar export`` writes it."""

from __future__ import annotations

from pathlib import Path

from polar_cli.builders import build_trajectory, verify
from polar_cli.models import Completion, PolicyVersions, SessionResult, TaskRequest, Trace, Trajectory
from polar_cli.models.inference import VersionSpan
from tests.builders.helpers import IM_END, exact_session, three_turn_session


def versioned(versions: list[int | None], *, crossed: int | None = None) -> list[Completion]:
    """The exact three-turn session (one chain), completion k sampled under ``versions[k]``; with ``crossed``, that
    completion's last token came from the next version (a call that crossed an update)."""
    comps = []
    for k, c in enumerate(exact_session()):
        update: dict[str, object] = {"policy_version": versions[k]}
        if k == crossed:
            version = versions[k]
            assert version is not None
            spans = [VersionSpan(start=0, version=version), VersionSpan(start=len(c.response_ids) - 1,
                                                                         version=version + 1)]  # fmt: skip
            update["version_spans"] = spans
        comps.append(c.model_copy(update=update))
    return comps


def test_prefix_merging_records_oldest_newest_each_completion_and_spans() -> None:
    comps = versioned([1, 1, 2])
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    trace = traj.traces[0]
    third = len(trace.response_ids) - len(comps[2].response_ids)  # where the third completion's tokens start
    assert trace.response_ids[third:] == comps[2].response_ids
    assert trace.policy_versions == PolicyVersions(
        oldest=1, newest=2, per_completion=[1, 1, 2],
        spans=[VersionSpan(start=0, version=1), VersionSpan(start=third, version=2)],
    )  # fmt: skip
    assert verify(traj, comps).ok


def test_one_version_needs_no_spans_and_a_crossed_call_counts_both_versions() -> None:
    same = build_trajectory("prefix_merging", versioned([3, 3, 3]), eos_token_id=IM_END).traces[0]
    assert same.policy_versions == PolicyVersions(oldest=3, newest=3, per_completion=[3, 3, 3])
    comps = versioned([1, 1, 1], crossed=2)
    trace = build_trajectory("prefix_merging", comps, eos_token_id=IM_END).traces[0]
    assert trace.policy_versions is not None
    assert (trace.policy_versions.oldest, trace.policy_versions.newest) == (1, 2)
    assert trace.policy_versions.per_completion == [1, 1, 1]
    assert trace.policy_versions.spans == [VersionSpan(start=0, version=1),
                                           VersionSpan(start=len(trace.response_ids) - 1, version=2)]  # fmt: skip


def test_an_update_whose_place_is_unknown_keeps_its_span_without_a_start() -> None:
    comps = versioned([1, 1, 2])
    frozen = [VersionSpan(start=0, version=1), VersionSpan(start=None, version=2)]  # a call frozen by a keep pause
    comps[1] = comps[1].model_copy(update={"version_spans": frozen})
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    assert traj.traces[0].policy_versions == PolicyVersions(
        oldest=1, newest=2, per_completion=[1, 1, 2],
        spans=[VersionSpan(start=0, version=1), VersionSpan(start=None, version=2)],  # the third call's 2 goes on
    )  # fmt: skip
    assert verify(traj, comps).ok


def test_per_request_gives_each_trace_its_completion_version() -> None:
    comps = versioned([1, 2, 2], crossed=1)
    traj = build_trajectory("per_request", comps)
    got = [t.policy_versions for t in traj.traces]
    assert got[0] == PolicyVersions(oldest=1, newest=1, per_completion=[1])
    assert got[1] == PolicyVersions(oldest=2, newest=3, per_completion=[2], spans=[VersionSpan(start=0, version=2),
                                    VersionSpan(start=len(comps[1].response_ids) - 1, version=3)])  # fmt: skip
    assert got[2] == PolicyVersions(oldest=2, newest=2, per_completion=[2])
    assert verify(traj, comps).ok


def test_completions_without_versions_give_none_and_a_partial_record_gives_no_spans() -> None:
    unversioned = build_trajectory("prefix_merging", three_turn_session(), eos_token_id=IM_END)
    assert unversioned.traces[0].policy_versions is None
    assert verify(unversioned, three_turn_session()).ok
    mixed = build_trajectory("prefix_merging", versioned([None, 1, 2]), eos_token_id=IM_END).traces[0]
    assert mixed.policy_versions == PolicyVersions(oldest=1, newest=2, per_completion=[None, 1, 2])


def test_verify_catches_versions_that_do_not_cover_the_completions() -> None:
    comps = versioned([1, 1, 2])
    traj = build_trajectory("prefix_merging", comps, eos_token_id=IM_END)
    trace = traj.traces[0]
    wrong = trace.model_copy(update={"policy_versions": PolicyVersions(oldest=1, newest=1, per_completion=[1, 1, 1])})
    report = verify(traj.model_copy(update={"traces": [wrong]}), comps)
    assert {v.code for v in report.violations} == {"policy_version"}
    assert "sampled under version(s) 2: outside the trace's policy_versions 1..1" in report.violations[0].message
    dropped = trace.model_copy(update={"policy_versions": None})
    report = verify(traj.model_copy(update={"traces": [dropped]}), comps)
    assert report.violation_count == 3 and "records no policy_versions" in report.violations[0].message


def test_a_trace_round_trips_and_an_older_trace_without_versions_loads() -> None:
    trace = build_trajectory("per_request", versioned([4, 4, 5])).traces[2]
    again = Trace.model_validate_json(trace.model_dump_json())
    assert again.policy_versions == PolicyVersions(oldest=5, newest=5, per_completion=[5])
    older = trace.model_dump(mode="json")
    del older["policy_versions"]
    assert Trace.model_validate(older).policy_versions is None


def test_export_writes_policy_versions_per_trace(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from polar_cli.export import ExportOptions, export
    from polar_cli.generate.ledger import Ledger, ResultRow

    traces = build_trajectory("per_request", versioned([1, 2, 2], crossed=1)).traces
    old = Trace(prompt_ids=[1], response_ids=[2], loss_mask=[1])  # a trace of an older Polar: no versions
    with Ledger(tmp_path / "gen") as ledger:
        task = TaskRequest(task_id="t0", instruction="x", agent={"harness": "pi"}, metadata={"policy_version": 7})
        ledger.remember_task(0, "r", task)
        result = SessionResult(session_id="s0", task_id="t0", status="completed", reward=1.0, num_completions=3,
                               trajectory=Trajectory(status="completed", traces=[*traces, old]))  # fmt: skip
        assert ledger.finish(ResultRow("t0", 0, "s0", "r", 1, "completed", 1.0, True, 3, 4, 3, 4), result)
    export(tmp_path / "gen", tmp_path / "ds", ExportOptions())
    table = pq.read_table(tmp_path / "ds" / "traces" / "train-00000.parquet")
    rows = table.to_pylist()
    assert [r["policy_version"] for r in rows] == ["7"] * 4  # the task's own label stays as it was
    assert rows[0]["policy_versions"] == {"oldest": 1, "newest": 1, "per_completion": [1], "spans": None}
    spans = [{"start": 0, "version": 2}, {"start": 2, "version": 3}]  # the crossed call's last (third) token
    assert rows[1]["policy_versions"] == {"oldest": 2, "newest": 3, "per_completion": [2], "spans": spans}
    assert rows[3]["policy_versions"] is None
