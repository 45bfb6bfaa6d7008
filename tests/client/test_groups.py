"""Groups for GRPO (polar_cli/groups.py): the rules as pure functions, then ``client.groups`` against a real ``polar
serve`` (scripted backend) whose shell agent plays a plan per session, so each session's outcome and reward is
chosen by the test: the sessions of a task claim an ordinal each (a directory under ``$CLAIMS``) and act by
``$PLAN[ordinal]``; the ``test_on_output`` evaluator gives 1.0 when the agent wrote ``passed``, else 0.0."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from polar_cli.client import AsyncPolarClient, PolarClient
from polar_cli.errors import ConfigError, PolarError
from polar_cli.groups import (
    DroppedGroup,
    Group,
    GroupConfig,
    GroupRun,
    GroupStats,
    ReuseBuffer,
    ReusedGroup,
    judge_group,
)
from polar_cli.models import PolicyVersions, SessionResult, TaskRequest, TaskStatus, Trace, Trajectory
from tests.client.conftest import Served
from tests.gateway.test_node import SCRIPT
from tests.support.docs import ROOT, code_blocks
from tests.support.planned import called, gate, planned

# ---- the rules, pure ------------------------------------------------------------------------------------------------


def request(task_id: str = "t", num_samples: int = 4, **metadata: Any) -> TaskRequest:
    data = {"task_id": task_id, "instruction": "x", "num_samples": num_samples, "agent": {"harness": "shell"}}
    return TaskRequest.model_validate({**data, "metadata": {"script": SCRIPT, **metadata}})


def session(
    index: int,
    status: str = "completed",
    reward: float | None = 1.0,
    mask: list[int] | None = None,
    versions: tuple[int, int] | None = (3, 3),
    calls: int = 1,
) -> SessionResult:
    """A session's result: one trace with ``mask`` (default [1, 0, 1]) unless ``calls`` is 0 (no trace at all)."""
    traces = []
    if calls:
        mask = [1, 0, 1] if mask is None else mask
        policy = None if versions is None else PolicyVersions(oldest=versions[0], newest=versions[1], per_completion=[])
        traces = [Trace(prompt_ids=[1, 2], response_ids=[7] * len(mask), loss_mask=mask, reward=reward,
                        policy_versions=policy)]  # fmt: skip
    return SessionResult.model_validate({
        "session_id": f"t-{index}", "task_id": "t", "sample_index": index, "status": status, "reward": reward,
        "num_completions": calls, "trajectory": Trajectory.model_validate({"status": status, "traces": traces}),
        "error": "boom" if status == "error" else None,
    })  # fmt: skip


def usable(verdict: Group | DroppedGroup) -> Group:
    assert isinstance(verdict, Group), verdict
    return verdict


def dropped(verdict: Group | DroppedGroup) -> DroppedGroup:
    assert isinstance(verdict, DroppedGroup), verdict
    return verdict


def test_which_sessions_are_usable_and_why_the_others_are_not() -> None:
    results = [
        session(0, reward=0.0),
        session(1, status="timeout"),
        session(2, calls=0, reward=0.0),  # completed without a model call
        session(3, mask=[0, 0]),
        session(4, reward=None),
        session(5, reward=1.0),
    ]
    task = request(num_samples=6, group_id="g7", rollout_step=4, policy_version=3)
    group = usable(judge_group(task, results, GroupConfig(min_usable_fraction=0.3)))
    assert [r.sample_index for r in group.results] == [0, 5] and group.rewards == [0.0, 1.0]
    assert [(d.sample_index, d.cause) for d in group.dropped] == [
        (1, "not_completed"), (2, "no_model_call"), (3, "no_trainable_token"), (4, "no_reward"),
    ]  # fmt: skip
    assert group.dropped[1].detail == "completed without a single model call through the proxy"
    assert (group.task_id, group.group_id, group.rollout_step, group.num_samples) == ("t", "g7", 4, 6)
    assert group.metadata == {"group_id": "g7", "rollout_step": 4, "policy_version": 3}  # the script left out
    assert len(group.traces) == 2 and group.usable_fraction == pytest.approx(2 / 6)
    assert (group.oldest_version, group.newest_version, group.staleness) == (3, 3, None)
    assert usable(judge_group(task, list(reversed(results)), GroupConfig(min_usable_fraction=0.3))) == group


def test_too_few_usable_sessions_drop_the_group() -> None:
    three_of_five = [session(i, status="error" if i >= 3 else "completed") for i in range(5)]
    assert len(usable(judge_group(request(num_samples=5), three_of_five, GroupConfig())).results) == 3  # 60%
    two_of_four = [session(i, status="error" if i >= 2 else "completed") for i in range(4)]
    drop = dropped(judge_group(request(), two_of_four, GroupConfig()))
    assert drop.reason == "too_few_usable"
    assert drop.detail == "task t: 2 of 4 sessions usable, below 60% (2 not_completed)"
    assert usable(judge_group(request(), two_of_four, GroupConfig(min_usable_fraction=0.5))).rewards == [1.0, 1.0]
    cancelled = [session(i, status="cancelled", calls=0) for i in range(2)]  # nothing ran: not the harness's fault
    assert dropped(judge_group(request(num_samples=2), cancelled, GroupConfig())).reason == "too_few_usable"
    none = [session(0, status="error"), session(1, status="timeout")]  # at least one usable session, always
    assert dropped(judge_group(request(num_samples=2), none, GroupConfig(min_usable_fraction=0.01))).group.dropped
    assert usable(judge_group(request(num_samples=1), [session(0)], GroupConfig())).rewards == [1.0]


def test_a_task_none_of_whose_sessions_called_the_model_is_an_error() -> None:
    nothing = [session(0, calls=0), session(1, calls=0, status="error"), session(2, calls=0, status="cancelled")]
    expected = (
        r"task t: not one of its 3 sessions captured a model call \(1 completed, 1 error, 1 cancelled\): "
        r".*bypassed it.*base URL is misconfigured.*; first error: boom"
    )
    with pytest.raises(PolarError, match=expected):
        judge_group(request(num_samples=3), nothing, GroupConfig())


def test_staleness_against_the_servers_version() -> None:
    results = [session(0, versions=(2, 4)), session(1, versions=(3, 3)), session(2, versions=None)]
    task = request(num_samples=3)
    group = usable(judge_group(task, results, GroupConfig(max_staleness=2), policy_version=4))
    assert (group.oldest_version, group.newest_version, group.policy_version, group.staleness) == (2, 4, 4, 2)
    drop = dropped(judge_group(task, results, GroupConfig(max_staleness=1), policy_version=4))
    assert drop.reason == "stale"
    assert drop.detail == "task t: sampled from policy version 2 on, 2 behind the current 4 (max_staleness 1)"
    unversioned = [session(i, versions=None) for i in range(3)]  # traces of an older Polar: staleness unknown
    assert usable(judge_group(task, unversioned, GroupConfig(max_staleness=0), policy_version=9)).staleness is None


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal() -> None:
    same = [session(0, reward=1.0), session(1, reward=1.0), session(2, status="error", reward=0.0)]
    task = request(num_samples=3)
    assert usable(judge_group(task, same, GroupConfig())).rewards == [1.0, 1.0]
    drop = dropped(judge_group(task, same, GroupConfig(dynamic_sampling=True)))
    assert drop.reason == "all_equal" and drop.detail.startswith("task t: every usable session has reward 1.0")
    mixed = [session(0, reward=1.0), session(1, reward=0.5), session(2, reward=1.0)]
    assert usable(judge_group(task, mixed, GroupConfig(dynamic_sampling=True))).rewards == [1.0, 0.5, 1.0]


def test_the_config_is_strict() -> None:
    with pytest.raises(ValueError, match="max_stalenes"):
        GroupConfig.model_validate({"max_stalenes": 1})
    with pytest.raises(ValueError, match="min_usable_fraction"):
        GroupConfig(min_usable_fraction=0)


def ended(task: TaskRequest, *results: SessionResult) -> TaskStatus:
    return TaskStatus(task_id=task.task_id, state="completed", num_samples=task.num_samples, results=list(results))


def test_a_run_submits_within_its_bounds_and_stops_at_the_batch_size() -> None:
    run = GroupRun(GroupConfig(batch_size=1, max_in_flight=2, dynamic_sampling=True))
    a, b, c = (request(name, num_samples=2) for name in "abc")
    for task in (a, b):
        assert run.wants_task()
        run.submitted(run.admit(task))
    assert not run.wants_task() and not run.finished
    assert run.polls(1.5) == [("a", 1.5), ("b", None)]
    with pytest.raises(ConfigError, match="task 'a' came twice"):
        run.admit(a)
    run.take(TaskStatus(task_id="a", state="running", num_samples=2))  # not ended: still polled
    run.take(ended(a, session(0), session(1)))  # all equal: dropped, and replaced
    assert not run.needs_policy_version and run.judge() == [] and run.wants_task()
    run.submitted(run.admit(c))
    run.take(ended(c, session(0, reward=0.0), session(1)))
    run.take(ended(b, session(0, reward=0.0), session(1)))
    assert [group.task_id for group in run.judge()] == ["c"]  # the batch is full: b is not judged
    assert run.batch_full and run.finished and not run.wants_task()
    assert run.stop_running() == []
    stats = run.stats
    assert (stats.submitted, stats.usable, stats.unused, stats.cancelled) == (["a", "b", "c"], 1, ["b"], [])
    assert stats.dropped_by_reason() == {"all_equal": 1}
    # judged: a (1, 1; dropped) and c (0, 1); b ended past the full batch and is not counted
    assert (stats.rewards.groups, stats.rewards.sessions, stats.rewards.mean) == (2, 4, 0.75)
    assert stats.rewards.zero_variance == 1 and stats.rewards.pass_at_k == {1: 0.75, 2: 1.0}


def test_a_run_without_a_batch_size_takes_the_whole_source() -> None:
    run = GroupRun(GroupConfig(max_staleness=0))
    for name in "ab":
        run.submitted(run.admit(request(name, num_samples=1)))
    assert run.wants_task()
    run.source_ended()
    assert not run.wants_task() and not run.finished
    run.take(ended(request("a", num_samples=1), session(0)))
    assert run.needs_policy_version
    assert [group.staleness for group in run.judge(policy_version=3)] == [0]
    assert run.stop_running() == ["b"] and run.stats.cancelled == ["b"] and run.finished
    with pytest.raises(ConfigError, match=r"metadata\.rollout_step must be an integer"):
        run.admit(request("c", rollout_step="4"))
    with pytest.raises(ConfigError, match=r"metadata\.group_id must be a string or an integer"):
        run.admit(request("d", group_id=[1]))


def carried(reuse: ReuseBuffer) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The buffer's ended and running tasks, each ``(task_id, carried)``."""
    return ([(c.task.task_id, c.carried) for c in reuse.ended], [(c.task.task_id, c.carried) for c in reuse.running])


def test_a_reuse_buffer_carries_the_surplus_to_the_next_runs() -> None:
    reuse = ReuseBuffer()
    a, b, c = (request(name, num_samples=2) for name in "abc")
    mixed = (session(0, reward=0.0), session(1))
    first = GroupRun(GroupConfig(batch_size=1, max_in_flight=3), reuse=reuse)
    for task in (a, b, c):
        first.submitted(first.admit(task))
    first.take(ended(a, *mixed))
    first.take(ended(b, *mixed))
    assert not first.needs_policy_version  # own tasks, no max_staleness: no version asked
    assert [group.task_id for group in first.judge()] == ["a"]  # b ended past the full batch: carried, not unused
    assert first.stop_surplus() == ["c"] and first.stats.cancelled == ["c"]
    first.cancelled(ended(c, *mixed))  # c had ended before the cancel reached it: surplus too, not lost
    [handed] = first.hand_out()
    first.close()
    assert (handed.task_id, handed.carried) == ("a", 0) and first.stats.reused == []
    stats = first.stats
    assert (stats.cancelled, stats.unused, stats.carried_out, stats.carried_in) == ([], [], ["b", "c"], [])
    assert carried(reuse) == ([("b", 1), ("c", 1)], [])

    second = GroupRun(GroupConfig(batch_size=1, max_staleness=1), reuse=reuse)
    assert len(reuse) == 0 and second.stats.carried_in == ["b", "c"] and second.needs_policy_version
    with pytest.raises(ConfigError, match="task 'b' came from the source of groups\\(\\) and from its reuse buffer"):
        second.admit(b)
    assert [group.task_id for group in second.judge(policy_version=4)] == ["b"]  # sampled at 3: one behind
    assert [(g.task_id, g.carried, g.staleness) for g in second.hand_out()] == [("b", 1, 1)]
    assert second.stats.reused == [ReusedGroup(task_id="b", carried=1, staleness=1, kept_running=False)]
    assert second.finished and not second.wants_task()  # the batch is full without a task of its own
    second.close()
    assert carried(reuse) == ([("c", 2)], []) and second.stats.carried_out == ["c"]

    third = GroupRun(GroupConfig(batch_size=1, max_staleness=1), reuse=reuse)
    assert third.judge(policy_version=5) == [] and third.wants_task()  # c is 2 behind: dropped, and replaced
    [drop] = third.stats.dropped
    assert (drop.reason, drop.group.task_id, drop.group.carried, drop.group.staleness) == ("stale", "c", 2, 2)
    assert third.stats.reused == [] and len(reuse) == 0


def test_kept_running_tasks_go_on_in_the_buffer_and_leaving_early_puts_back_what_was_not_handed_out() -> None:
    with pytest.raises(ValueError, match="keep_running keeps the tasks still running once the batch is full"):
        GroupConfig(keep_running=True)
    with pytest.raises(ConfigError, match=r"keep_running carries .* pass reuse=ReuseBuffer\(\)"):
        GroupRun(GroupConfig(batch_size=1, keep_running=True))
    reuse = ReuseBuffer()
    a, b, c, d, e = (request(name, num_samples=2) for name in "abcde")
    mixed = (session(0, reward=0.0), session(1))
    first = GroupRun(GroupConfig(batch_size=1, max_in_flight=4, keep_running=True), reuse=reuse)
    for task in (a, b, c, d):
        first.submitted(first.admit(task))
    first.take(ended(a, *mixed))
    first.take(ended(b, *mixed))
    first.judge()
    assert first.stop_surplus() == [] and first.stats.cancelled == []  # c and d run on, in the buffer
    assert carried(reuse) == ([("b", 1)], [("c", 1), ("d", 1)])
    assert ReuseBuffer.model_validate_json(reuse.model_dump_json()) == reuse  # saved with a checkpoint

    second = GroupRun(GroupConfig(batch_size=3), reuse=reuse)
    assert list(second.running) == ["c", "d"] and second.polls(1.0) == [("c", 1.0), ("d", None)]
    second.take(ended(c, *mixed))
    assert [group.task_id for group in second.judge(policy_version=3)] == ["b", "c"]
    second.submitted(second.admit(e))
    handed = second.hand_out()
    assert next(handed).task_id == "b"  # the caller takes one group, then leaves the loop
    assert second.stop_running() == ["d", "e"]
    second.close()
    assert carried(reuse) == ([("c", 2)], [])  # judged, not handed out: carried again, nothing lost
    assert second.stats.reused == [ReusedGroup(task_id="b", carried=1, staleness=0, kept_running=False)]
    assert (second.stats.cancelled, second.stats.carried_out) == (["d", "e"], ["c"])

    third = GroupRun(GroupConfig(batch_size=1), reuse=reuse)
    third.judge(policy_version=3)
    assert [g.task_id for g in third.hand_out()] == ["c"]
    assert third.stats.reused == [ReusedGroup(task_id="c", carried=2, staleness=0, kept_running=True)]
    running = GroupRun(GroupConfig(batch_size=1, keep_running=True), reuse=reuse)
    running.submitted(running.admit(d))
    assert running.stop_surplus() == [] and reuse.discard() == ["d"] and len(reuse) == 0


def test_groups_refuses_one_task_for_a_source_before_any_request() -> None:
    with PolarClient("http://127.0.0.1:9", "t") as client:  # nothing listens there: no request is made
        for one in (request(), request().model_dump(), "task.yaml", Path("task.yaml")):
            with pytest.raises(ConfigError, match="an iterable of tasks, not one task"):
                next(client.groups(one))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="poll interval must be positive"):
            next(client.groups([request()], poll_interval=0))


# ---- client.groups against a real polar serve ------------------------------------------------------------------------

def complete(group: Group) -> None:
    assert len(group.results) + len(group.dropped) == group.num_samples
    assert len({r.session_id for r in group.results} | {d.session_id for d in group.dropped}) == group.num_samples


def test_groups_come_complete_as_tasks_end_and_unusable_ones_are_dropped(served: Served, tmp_path: Path) -> None:
    slow = planned("grp-slow", ["gate", "fail"], tmp_path, group_id="g-slow", rollout_step=3)
    fast = planned("grp-fast", ["pass", "fail", "none"], tmp_path, group_id=7)
    few = planned("grp-few", ["pass", "crash", "crash"], tmp_path)
    stats = GroupStats()
    seen: list[Group] = []
    with PolarClient(served.url, served.token) as client:
        for group in client.groups([slow, fast.model_dump(mode="json"), few], stats=stats, poll_interval=0.2):
            seen.append(group)
            if group.task_id == "grp-fast":  # the slow task's group is not complete yet: one session waits
                called(tmp_path, "grp-slow", 2)
                assert client.status("grp-slow").state == "running"
                gate(tmp_path, "grp-slow").parent.mkdir(exist_ok=True)
                gate(tmp_path, "grp-slow").touch()
        version = client.inference().policy_version
    assert [group.task_id for group in seen] == ["grp-fast", "grp-slow"]
    for group in seen:
        complete(group)
    first, second = seen
    assert (first.group_id, first.rollout_step, sorted(first.rewards)) == (7, None, [0.0, 1.0])
    [nothing] = first.dropped
    assert (nothing.cause, nothing.result.status, nothing.result.reward) == ("no_model_call", "no_model_call", None)
    assert nothing.detail.startswith("the harness exited without a single model call reaching Polar's proxy")
    assert (second.group_id, second.rollout_step, sorted(second.rewards), second.dropped) == (
        "g-slow",
        3,
        [0.0, 1.0],
        [],
    )
    assert second.metadata == {"group_id": "g-slow", "rollout_step": 3}
    assert all(trace.trainable_tokens and trace.policy_versions for trace in second.traces)
    assert second.oldest_version == second.newest_version == version and second.policy_version is None
    [drop] = stats.dropped
    assert (drop.reason, drop.group.task_id) == ("too_few_usable", "grp-few")
    assert drop.detail == "task grp-few: 1 of 3 sessions usable, below 60% (2 not_completed)"
    assert [d.cause for d in drop.group.dropped] == ["not_completed", "not_completed"]
    assert all(d.detail.startswith("status error: shell exited with status 1") for d in drop.group.dropped)
    assert all("crashed as planned" in d.detail for d in drop.group.dropped)
    assert (stats.submitted, stats.usable, stats.cancelled, stats.unused) == (
        ["grp-slow", "grp-fast", "grp-few"],
        2,
        [],
        [],
    )
    assert stats.source_exhausted


def test_a_task_whose_sessions_never_called_the_model_fails_loudly(served: Served, tmp_path: Path) -> None:
    hang = planned("grp-hang", ["hang"], tmp_path)
    nothing = planned("grp-nothing", ["none", "none"], tmp_path)
    stats = GroupStats()
    with PolarClient(served.url, served.token) as client:
        with pytest.raises(PolarError, match=r"task grp-nothing: not one of its 2 sessions captured a model call "
                           r"\(2 no_model_call\): the harness never reached Polar's proxy"):  # fmt: skip
            list(client.groups([hang, nothing], stats=stats, poll_interval=0.2))
        assert stats.cancelled == ["grp-hang"]  # what it had submitted and still ran is cancelled on the way out
        assert client.wait("grp-hang", timeout=30).state == "cancelled"
        failed = client.status("grp-nothing")
    assert (failed.state, failed.completed, failed.failed) == ("failed", 0, 2)
    assert failed.error is not None and failed.error.startswith("not one of its 2 sessions made a model call")
    assert {r.status for r in failed.results} == {"no_model_call"}
    assert all(r.error and "bypassed the base URL" in r.error for r in failed.results)


def test_a_group_beyond_the_staleness_bound_is_dropped(served: Served, tmp_path: Path) -> None:
    fresh = planned("grp-fresh", ["pass", "fail"], tmp_path)
    stale = planned("grp-stale", ["gate", "gate"], tmp_path)
    stats = GroupStats()
    with PolarClient(served.url, served.token) as client:
        before = client.inference().policy_version
        seen = []
        for group in client.groups([fresh, stale], GroupConfig(max_staleness=1), stats=stats, poll_interval=0.2):
            seen.append(group)
            called(tmp_path, "grp-stale", 2)  # both sampled under `before`; the trainer moves on twice
            client.resume()
            client.resume()
            gate(tmp_path, "grp-stale").parent.mkdir(exist_ok=True)
            gate(tmp_path, "grp-stale").touch()
    [group] = seen
    assert (group.task_id, group.policy_version, group.staleness) == ("grp-fresh", before, 0)
    [drop] = stats.dropped
    assert (drop.reason, drop.group.task_id, drop.group.staleness) == ("stale", "grp-stale", 2)
    assert drop.detail == f"task grp-stale: sampled from policy version {before} on, 2 behind the current " \
                          f"{before + 2} (max_staleness 1)"  # fmt: skip
    complete(drop.group)


def test_dynamic_sampling_drops_all_equal_groups_and_cancels_the_surplus(served: Served, tmp_path: Path) -> None:
    plans = {
        "grp-equal": ["pass", "pass"],
        "grp-mixed-1": ["pass", "fail"],
        "grp-hang-1": ["hang", "hang"],
        "grp-hang-2": ["hang", "hang"],
        "grp-mixed-2": ["fail", "pass"],  # taken once a task has ended: the first four fill max_in_flight
        "grp-hang-3": ["hang", "hang"],  # taken when the second of grp-equal, grp-mixed-1 ends before grp-mixed-2
        "grp-hang-4": ["hang", "hang"],  # never taken: only two tasks end before the batch is full
    }
    pulled: list[str] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        for task_id, plan in plans.items():
            pulled.append(task_id)
            yield planned(task_id, plan, tmp_path).model_dump(mode="json")

    config = GroupConfig(dynamic_sampling=True, batch_size=2, max_in_flight=4)
    stats = GroupStats()

    async def body() -> tuple[list[Group], list[str]]:
        async with AsyncPolarClient(served.url, served.token) as client:
            seen = [group async for group in client.groups(source(), config, stats=stats, poll_interval=0.2)]
            states: list[str] = [(await client.status(task_id)).state for task_id in stats.cancelled]
        return seen, states

    seen, states = asyncio.run(body())
    assert [group.task_id for group in seen] == ["grp-mixed-1", "grp-mixed-2"]
    assert all(sorted(group.rewards) == [0.0, 1.0] for group in seen)
    assert [(drop.reason, drop.group.task_id) for drop in stats.dropped] == [("all_equal", "grp-equal")]
    assert stats.dropped[0].detail.startswith("task grp-equal: every usable session has reward 1.0")
    assert pulled in (list(plans)[:5], list(plans)[:6]) and stats.submitted == pulled
    assert sorted(stats.cancelled) == [task_id for task_id in pulled if "hang" in task_id]
    assert states == ["cancelled"] * len(stats.cancelled)
    assert not stats.source_exhausted and stats.usable == 2 and stats.unused == []


def test_the_groups_snippet_of_the_docs_runs(served: Served, tmp_path: Path) -> None:
    [snippet] = [b for b in code_blocks(ROOT / "docs" / "service.md")
                 if b.tested_by == "tests/client/test_groups.py::test_the_groups_snippet_of_the_docs_runs"]  # fmt: skip
    trained: list[tuple[str, list[float]]] = []

    def prompts(step: int) -> Iterator[TaskRequest]:  # endless: alternately all equal and mixed
        for n in itertools.count():
            plan = ["pass", "pass"] if n % 2 == 0 else ["fail", "pass"]
            yield planned(f"grp-doc-{step}-{n}", plan, tmp_path, group_id=f"prompt-{n}", rollout_step=step)

    def train_on(group: Group, advantages: list[float]) -> None:
        trained.append((group.task_id, advantages))

    scope: dict[str, Any] = {"url": served.url, "token": served.token, "step": 5, "prompts": prompts,
                             "train_on": train_on}  # fmt: skip
    exec(snippet.text, scope)
    stats: GroupStats = scope["stats"]
    assert len(trained) == 2 and all(int(task_id.rsplit("-", 1)[1]) % 2 for task_id, _ in trained)  # the mixed ones
    assert all(sorted(advantages) == [-0.5, 0.5] for _, advantages in trained)
    assert stats.usable == 2 and set(stats.dropped_by_reason()) <= {"all_equal"}
    assert all(int(drop.group.task_id.rsplit("-", 1)[1]) % 2 == 0 for drop in stats.dropped)
    assert stats.submitted == [f"grp-doc-5-{n}" for n in range(len(stats.submitted))]
    assert all(task_id not in stats.cancelled for task_id, _ in trained)


# ---- reuse across calls, against the real polar serve ---------------------------------------------------------------

MIXED = ["pass", "fail"]


def surplus_first(client: PolarClient, tasks: list[TaskRequest], last: TaskRequest) -> Iterator[TaskRequest]:
    """``tasks``, then ``last`` once every one of them has ended: the first poll round finds them all ended, so with
    batch_size 1 the first is the batch and the others the surplus that ended after it was full."""
    yield from tasks
    for task in tasks:
        assert client.wait(task.task_id, timeout=60).state == "completed"
    yield last


def test_surplus_groups_are_handed_out_first_in_the_next_call(served: Served, tmp_path: Path) -> None:
    reuse = ReuseBuffer()
    a, b = (planned(f"reuse-{name}", MIXED, tmp_path) for name in "ab")
    hang = planned("reuse-hang", ["hang", "hang"], tmp_path)
    first, second, third = GroupStats(), GroupStats(), GroupStats()
    with PolarClient(served.url, served.token) as client:
        before = client.inference().policy_version
        source = surplus_first(client, [a, b], hang)
        batch = list(client.groups(source, GroupConfig(batch_size=1, max_in_flight=3), stats=first, reuse=reuse,
                                   poll_interval=0.2))  # fmt: skip
        assert [group.task_id for group in batch] == ["reuse-a"]
        assert (first.carried_out, first.cancelled, first.unused) == (["reuse-b"], ["reuse-hang"], [])
        assert carried(reuse) == ([("reuse-b", 1)], [])
        assert client.wait("reuse-hang", timeout=30).state == "cancelled"  # keep_running is off: cancelled
        assert client.resume().policy_version == before + 1  # the trainer's step
        config = GroupConfig(batch_size=2, max_staleness=1)
        d = planned("reuse-d", MIXED, tmp_path)
        batch = list(client.groups([d], config, stats=second, reuse=reuse, poll_interval=0.2))
        assert [(g.task_id, g.carried, g.staleness, g.policy_version) for g in batch] == [
            ("reuse-b", 1, 1, before + 1), ("reuse-d", 0, 0, before + 1),
        ]  # fmt: skip
        complete(batch[0])
        assert second.reused == [ReusedGroup(task_id="reuse-b", carried=1, staleness=1, kept_running=False)]
        assert (second.carried_in, second.submitted, second.carried_out, second.usable) == (
            ["reuse-b"], ["reuse-d"], [], 2)  # fmt: skip
        assert len(reuse) == 0
        assert list(client.groups([], config, stats=third, reuse=reuse, poll_interval=0.2)) == []  # handed out once
    assert (third.carried_in, third.reused) == ([], [])


def test_carried_groups_beyond_max_staleness_are_dropped(served: Served, tmp_path: Path) -> None:
    reuse = ReuseBuffer()
    a, b = (planned(f"stale-{name}", MIXED, tmp_path) for name in "ab")
    slow = planned("stale-slow", ["gate", "gate"], tmp_path)
    first, second = GroupStats(), GroupStats()

    async def body() -> tuple[list[Group], list[Group], int]:
        async with AsyncPolarClient(served.url, served.token) as client:

            async def source() -> AsyncIterator[TaskRequest]:
                yield a
                yield b
                for task in (a, b):
                    await client.wait(task.task_id, timeout=60)
                yield slow

            config = GroupConfig(batch_size=1, max_in_flight=3, keep_running=True)
            one = [g async for g in client.groups(source(), config, stats=first, reuse=reuse, poll_interval=0.2)]
            assert (await client.status("stale-slow")).state in ("pending", "running")  # kept, in the buffer
            assert carried(reuse) == ([("stale-b", 1)], [("stale-slow", 1)]) and first.cancelled == []
            called(tmp_path, "stale-slow", 2)  # sampled under the version of the first call
            await client.resume()
            version = (await client.resume()).policy_version  # two steps on: both carried groups are 2 behind
            gate(tmp_path, "stale-slow").parent.mkdir(exist_ok=True)
            gate(tmp_path, "stale-slow").touch()
            # ended before the next call polls it first, so it is judged (stale) before the batch can fill
            assert (await client.wait("stale-slow", timeout=60)).state == "completed"
            config = GroupConfig(batch_size=1, max_staleness=1)
            e = planned("stale-e", MIXED, tmp_path)
            two = [g async for g in client.groups([e], config, stats=second, reuse=reuse, poll_interval=0.2)]
        return one, two, version

    one, two, version = asyncio.run(body())
    assert [group.task_id for group in one] == ["stale-a"] and first.carried_out == ["stale-b", "stale-slow"]
    assert [(g.task_id, g.carried, g.staleness) for g in two] == [("stale-e", 0, 0)]  # none beyond max_staleness
    assert [(d.reason, d.group.task_id, d.group.carried, d.group.staleness) for d in second.dropped] == [
        ("stale", "stale-b", 1, 2), ("stale", "stale-slow", 1, 2),
    ]  # fmt: skip
    assert all(d.detail.endswith(f"behind the current {version} (max_staleness 1)") for d in second.dropped)
    assert second.dropped_by_reason() == {"stale": 2} and second.reused == []
    assert (second.carried_in, second.carried_out, second.cancelled) == (["stale-b", "stale-slow"], [], [])
    assert len(reuse) == 0


def test_leaving_the_loop_early_cancels_the_carried_tasks_and_keeps_the_groups_not_handed_out(
    served: Served, tmp_path: Path
) -> None:
    reuse = ReuseBuffer()
    a, b, c = (planned(f"early-{name}", MIXED, tmp_path) for name in "abc")
    hang, late = planned("early-hang", ["hang", "hang"], tmp_path), planned("early-late", ["hang"], tmp_path)
    first, second, third = GroupStats(), GroupStats(), GroupStats()
    with PolarClient(served.url, served.token) as client:
        config = GroupConfig(batch_size=1, max_in_flight=4, keep_running=True)
        source = surplus_first(client, [a, b, c], hang)
        assert [g.task_id for g in client.groups(source, config, stats=first, reuse=reuse, poll_interval=0.2)] == [
            "early-a"]  # fmt: skip
        assert carried(reuse) == ([("early-b", 1), ("early-c", 1)], [("early-hang", 1)])
        seen = []
        for group in client.groups([late], GroupConfig(batch_size=3), stats=second, reuse=reuse, poll_interval=0.2):
            seen.append(group.task_id)
            break  # after the first of the two carried groups
        assert seen == ["early-b"] and second.submitted == ["early-late"]
        assert second.cancelled == ["early-hang", "early-late"]  # the carried running task too
        assert [client.wait(task_id, timeout=30).state for task_id in second.cancelled] == ["cancelled"] * 2
        assert second.reused == [ReusedGroup(task_id="early-b", carried=1, staleness=0, kept_running=False)]
        assert carried(reuse) == ([("early-c", 2)], []) and second.carried_out == ["early-c"]
        last = list(client.groups([], GroupConfig(batch_size=1), stats=third, reuse=reuse, poll_interval=0.2))
    assert [(g.task_id, g.carried) for g in last] == [("early-c", 2)] and len(reuse) == 0  # nothing lost
    assert third.reused == [ReusedGroup(task_id="early-c", carried=2, staleness=0, kept_running=False)]


def test_the_reuse_snippet_of_the_docs_runs(served: Served, tmp_path: Path) -> None:
    [snippet] = [b for b in code_blocks(ROOT / "docs" / "service.md")
                 if b.tested_by == "tests/client/test_groups.py::test_the_reuse_snippet_of_the_docs_runs"]  # fmt: skip
    pulled: list[str] = []
    trained: list[list[Group]] = []
    updates: list[int] = []

    def prompts(step: int) -> Iterator[TaskRequest]:  # endless: alternately all equal and mixed
        for n in itertools.count():
            pulled.append(f"reuse-doc-{step}-{n}")
            yield planned(pulled[-1], ["pass", "pass"] if n % 2 == 0 else MIXED, tmp_path, rollout_step=step)

    with PolarClient(served.url, served.token) as client:
        before = client.inference().policy_version
    scope: dict[str, Any] = {"url": served.url, "token": served.token, "steps": 3, "prompts": prompts,
                             "train_on": trained.append, "update_weights": updates.append}  # fmt: skip
    exec(snippet.text, scope)
    assert updates == [0, 1, 2] and [len(batch) for batch in trained] == [2, 2, 2]
    groups = [group for batch in trained for group in batch]
    assert len({group.task_id for group in groups}) == 6  # none handed out twice
    assert all(int(group.task_id.rsplit("-", 1)[1]) % 2 for group in groups)  # the mixed ones
    for step, batch in enumerate(trained):
        assert all(group.policy_version is None or group.policy_version == before + step for group in batch)
        for group in batch:  # a carried group is one of an earlier step, at most max_staleness behind
            assert (group.carried > 0) == (group.rollout_step != step) and (group.staleness or 0) <= 1
    assert len(scope["reuse"]) == 0
    with PolarClient(served.url, served.token) as client:  # nothing left running: the kept tasks were cancelled
        assert all(client.status(task_id).state in ("completed", "cancelled") for task_id in pulled)
