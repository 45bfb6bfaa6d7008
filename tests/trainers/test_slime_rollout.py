"""slime's rollout function (``polar_cli.trainers.slime_rollout``) called the way slime's ``RolloutManager`` calls a
``--rollout-function-path`` / ``--eval-function-path`` function (``call_rollout_fn``), with slime's data source and
``Sample`` from the test-only stand-in (tests/support/slime_standin: copied from slime 0.3.1, 624b824a, which is not on
PyPI), against a real ``polar serve`` over the run's shared real vLLM CPU server. slime's SGLang worker, listed by a
stand-in of its router's ``/workers`` route, is the same vLLM server under another name, registered into the pool.

Rows: three quick ones (one model call per session) and two that wait for a marker file before their call.
Rollout 0 (``--partial-rollout``, 4 groups pulled and run at once for a batch of 2): two quick groups make the batch,
as slime Samples whose tokens, mask and logprobs are what the gateway journaled; the over-sampled quick group and the
waiting one go back to the data source with their Polar task ids (the waiting one ``ABORTED``, its task still
running), and Polar is paused for slime's weight sync. Rollout 1 (no partial rollout) resumes Polar one version on and
joins the two carried tasks instead of resubmitting them; the waiting row it submitted itself is cancelled, not
returned. Evaluation gives slime's ``{name: {rewards, truncated, samples}}``. Two quick tests, no server: a row made
a task, and a group's dropped sessions kept in place as ``remove_sample`` samples.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from polar_cli.client import PolarClient
from polar_cli.errors import ConfigError
from polar_cli.groups import DroppedSession, Group
from polar_cli.models import Completion
from polar_cli.proxy.journal import read_journal
from tests.server.procs import Serve, serve_config
from tests.support.vllm import MODEL_NAME, vllm_model_dir, vllm_url
from tests.trainers.helpers import make_result, make_trace

__all__ = ["vllm_model_dir", "vllm_url"]

STANDIN = Path(__file__).resolve().parents[1] / "support" / "slime_standin"
# The harness: waits for the file named after "wait:" in the instruction, if any, then makes one sampled chat call.
AGENT = """
import json, os, time, urllib.request
instruction = os.environ["POLAR_INSTRUCTION"]
if "wait:" in instruction:
    marker = instruction.split("wait:", 1)[1].strip()
    while not os.path.exists(marker):
        time.sleep(0.1)
body = {"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": instruction}],
        "max_tokens": 6, "temperature": 1.0}
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
json.load(urllib.request.urlopen(request, timeout=300))
"""
TASK = {
    "timeout_seconds": 300,
    "agent": {
        "harness": "shell",
        "config": {"command": f'exec {sys.executable} "$HOME/agent.py"', "files": {"agent.py": AGENT}},
    },
    "builder": {"strategy": "per_request"},
    "evaluator": {"strategy": "session_completion"},
}


@pytest.fixture
def slime(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    monkeypatch.syspath_prepend(str(STANDIN))
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils.types import Sample

    return SimpleNamespace(Sample=Sample, DataSource=RolloutDataSourceWithBuffer, call=call_rollout_fn,
                           TrainOutput=RolloutFnTrainOutput, EvalOutput=RolloutFnEvalOutput)  # fmt: skip


@contextmanager
def sglang_router(workers: list[str]) -> Iterator[ThreadingHTTPServer]:
    """The one route of SGLang's router that the rollout function reads, ``GET /workers`` (its answer's shape as
    slime 0.3.1 reads it in ``slime/rollout/sglang_rollout.py``): a stand-in, there is no SGLang on a CPU."""

    class Workers(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"workers": [{"url": url} for url in workers]}).encode()
            self.send_response(200 if self.path == "/workers" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Workers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def journaled(data_dir: Path, session_id: str) -> Completion:
    (completion,) = read_journal(data_dir / "journal" / f"{session_id}.jsonl")
    return completion


def test_a_dropped_session_keeps_its_place_as_a_removed_sample(slime: SimpleNamespace) -> None:
    from polar_cli.trainers.slime_rollout import group_samples

    rows = [slime.Sample(group_index=3, index=6 + i, prompt="p", label="l", metadata={"row": 3}) for i in range(3)]
    usable = make_result([make_trace([1, 0, 1], reward=0.5)], session_id="s-0", reward=0.5)
    timed_out = make_result([make_trace([1, 1])], status="timeout", session_id="s-1", sample_index=1, reward=None)
    cancelled = make_result([], status="cancelled", session_id="s-2", sample_index=2, reward=None)
    dropped = [DroppedSession(session_id=r.session_id, sample_index=r.sample_index, cause="not_completed",
                              detail=r.status, result=r) for r in (timed_out, cancelled)]  # fmt: skip
    group = Group(task_id="task-1", num_samples=3, results=[usable], rewards=[0.5], dropped=dropped)
    kept, timeout, empty = group_samples(group, rows)
    assert kept.status == slime.Sample.Status.COMPLETED and not kept.remove_sample
    assert (kept.index, kept.group_index, kept.rollout_id, kept.label) == (6, 3, 6, "l")
    assert kept.tokens == [1, 2, 3, 100, 101, 102] and kept.loss_mask == [1, 0, 1]
    assert kept.rollout_log_probs == pytest.approx([-0.1, 0.0, -0.3]) and kept.reward == 0.5
    # the dropped ones: no loss, the usable rewards' mean (the baseline is unchanged), slime's status for the ending
    assert timeout.remove_sample and timeout.status == slime.Sample.Status.ABORTED and timeout.index == 7
    assert timeout.loss_mask == [0, 0] and timeout.reward == 0.5
    assert timeout.metadata["polar_dropped"] == "not_completed"
    assert empty.remove_sample and empty.response_length == 0 and empty.loss_mask == [] and empty.reward == 0.5
    assert rows[0].response_length == 0  # the data source's rows are copied, not filled


def test_a_row_becomes_a_task(slime: SimpleNamespace) -> None:
    from polar_cli.trainers.slime_rollout import SlimePolarConfig, row_task

    args = SimpleNamespace(polar_url="http://x", polar_task={**TASK, "instruction": "Solve: {prompt}",
                                                             "metadata": {"family": "math"}})  # fmt: skip
    config = SlimePolarConfig.from_args(args)
    row = slime.Sample(group_index=4, index=8, prompt=[{"role": "system", "content": "be brief"},
                                                       {"role": "user", "content": "1+1"}],
                       label="2", metadata={"level": 1, "polar_task": {"timeout_seconds": 60}})  # fmt: skip
    task = row_task(config, row, num_samples=8, rollout_id=5)
    assert task.instruction == "Solve: 1+1" and task.num_samples == 8 and task.timeout_seconds == 60
    assert task.metadata == {"family": "math", "level": 1, "group_id": 4, "rollout_step": 5, "label": "2"}
    with pytest.raises(ConfigError, match="polar_task"):
        SlimePolarConfig.from_args(SimpleNamespace())


@pytest.mark.vllm
@pytest.mark.e2e
def test_slime_rollouts_through_polar(vllm_url: str, tmp_path: Path, slime: SimpleNamespace) -> None:
    from polar_cli.trainers.slime_rollout import TASK_ID_KEY, close_rollouts, eval_rollout, generate_rollout

    data_dir = tmp_path / "polar-data"
    serve = Serve(data_dir, "--port", "0", "--config", str(serve_config(tmp_path, "serve")), "--backend", "vllm",
                  "--backend-url", vllm_url, "--model", MODEL_NAME)  # fmt: skip
    stack = ExitStack()
    # slime's SGLang worker, as its router lists it: the same vLLM server under another name
    engine = vllm_url.replace("127.0.0.1", "localhost")
    router = stack.enter_context(sglang_router([engine]))
    try:
        info = asyncio.run(serve.ready())
        first, second = tmp_path / "go-1", tmp_path / "go-2"
        prompts = ["Name a colour.", "Name a fruit.", "Name a tree.", f"Name a bird. wait:{first}",
                   f"Name a fish. wait:{second}"]  # fmt: skip
        rows = [slime.Sample(prompt=[{"role": "user", "content": p}], label=f"label-{i}", metadata={"row": i})
                for i, p in enumerate(prompts)]  # fmt: skip
        (tmp_path / "eval.jsonl").write_text('{"question": "Name a river.", "answer": "Nile"}\n')
        args = SimpleNamespace(
            n_samples_per_prompt=2, rollout_batch_size=2, over_sampling_batch_size=4, partial_rollout=True,
            polar_url=info["url"], polar_token=info["token"], polar_task=TASK, polar_min_usable_fraction=1.0,
            polar_register_engines=True, sglang_router_ip="127.0.0.1", sglang_router_port=router.server_port,
            input_key="question", label_key="answer", n_samples_per_eval_prompt=2,
            eval_datasets=[SimpleNamespace(name="rivers", path=str(tmp_path / "eval.jsonl"), input_key=None,
                                           label_key=None, n_samples_per_eval_prompt=None)],
        )  # fmt: skip
        source = slime.DataSource(args, rows)
        polar = stack.enter_context(PolarClient(info["url"], info["token"]))

        # rollout 0: a batch of 2 of the 3 quick groups; the third and the waiting one go back to the buffer
        out = slime.call(generate_rollout, args, 0, source, evaluation=False)
        assert isinstance(out, slime.TrainOutput) and len(out.samples) == 2
        for group in out.samples:
            assert len(group) == 2 and {s.group_index for s in group} <= {0, 1, 2}
            assert len({s.session_id for s in group}) == 2
            for sample in group:
                row = rows[sample.metadata["row"]]
                completion = journaled(data_dir, sample.session_id)
                assert sample.prompt == row.prompt and sample.label == row.label
                assert sample.tokens == [*completion.prompt_ids, *completion.response_ids]
                assert sample.response_length == len(completion.response_ids) > 0
                assert sample.loss_mask == [1] * sample.response_length
                assert sample.rollout_log_probs == completion.response_logprobs
                assert sample.reward == 1.0 and not sample.remove_sample
                finish = completion.finish_reason
                assert sample.status == slime.Sample.Status["TRUNCATED" if finish == "length" else "COMPLETED"]
                assert sample.weight_versions == ["1"]  # one per model call, as slime appends them
        assert out.metrics["polar/returned_groups"] == 2
        assert source.get_buffer_length() == 2
        carried = {group[0].metadata["row"]: group for group in source.buffer}
        assert set(carried) == {3, ({0, 1, 2} - {g[0].metadata["row"] for g in out.samples}).pop()}
        waiting = carried[3]
        assert [s.status for s in waiting] == [slime.Sample.Status.ABORTED] * 2
        assert all(s.metadata["start_rollout_id"] == 0 and s.response_length == 0 for s in waiting)
        assert polar.status(waiting[0].metadata[TASK_ID_KEY]).state == "running"  # partial rollout: not cancelled
        assert polar.inference().paused == "wait"  # slime syncs its weights now
        (pool,) = [gateway.pool for gateway in polar.inference().gateways if gateway.pool is not None]
        assert {replica.url for replica in pool.replicas} == {vllm_url, engine}  # slime's worker, registered once

        # rollout 1 pulls 3 groups: the two carried ones rejoin their tasks (not resubmitted), the fish row is new
        first.touch()
        args.partial_rollout, args.over_sampling_batch_size = False, 3
        out = slime.call(generate_rollout, args, 1, source, evaluation=False)
        assert polar.inference().policy_version == 2
        assert {group[0].metadata["row"] for group in out.samples} == set(carried)
        assert out.metrics["polar/reused"] == 2 and out.metrics["polar/submitted"] == 1
        assert {group[0].metadata[TASK_ID_KEY] for group in out.samples} == {g[0].metadata[TASK_ID_KEY]
                                                                             for g in carried.values()}  # fmt: skip
        versions = {s.metadata["row"]: set(s.weight_versions) for group in out.samples for s in group}
        assert versions[3] == {"2"}  # the waiting row sampled after the resume
        (cancelled,) = [t for t in polar.ended_tasks() if polar.status(t).state == "cancelled"]
        assert polar.task_request(cancelled).metadata["row"] == 4  # no partial rollout: dropped, as slime drops it
        assert out.metrics["polar/cancelled"] == 1 and source.get_buffer_length() == 0

        evaluation = slime.call(eval_rollout, args, 1, source, evaluation=True)
        assert isinstance(evaluation, slime.EvalOutput)
        rivers = evaluation.data["rivers"]
        assert rivers["rewards"] == [1.0, 1.0] and len(rivers["truncated"]) == 2
        assert all(s.label == "Nile" and s.weight_versions == ["3"] for s in rivers["samples"])
    finally:
        stack.close()
        close_rollouts()
        serve.stop()
