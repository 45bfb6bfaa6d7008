"""check_task: a bad task is a ConfigError naming the field when it is submitted, before any session exists."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_cli.errors import ConfigError, UnknownComponentError
from polar_cli.gateway.config import GatewayConfig
from polar_cli.gateway.node import GatewayNode
from polar_cli.interfaces.runtime import RuntimeContext
from polar_cli.models import PrepareAction, RuntimeSpec, TaskRequest
from polar_cli.runtimes import start_session
from polar_cli.task_check import check_task

SHELL = {"harness": "shell", "config": {"command": "true"}}


def task(**fields: Any) -> TaskRequest:
    return TaskRequest.model_validate({"task_id": "t", "instruction": "go", "agent": SHELL, **fields})


def refused(message: str, **fields: Any) -> None:
    with pytest.raises(ConfigError, match=message):
        check_task(task(**fields))


def test_a_good_task_passes() -> None:
    check_task(task(builder={"strategy": "prefix_merging", "config": {"eos_token_id": 2, "verify": True}},
                    runtime={"prepare": [{"command": "echo hi"}, {"type": "write_file", "path": "a", "content": ""},
                                         {"type": "upload", "source": "data/x.txt", "path": "x"}]},
                    metadata={"script": [{"content": "hi"}], "group_id": "g"}))  # fmt: skip


def test_a_builder_config_typo_names_the_field() -> None:
    refused(r"task 't': builder.config: builder 'prefix_merging': unknown field 'eos_token' "
            r"\(did you mean 'eos_token_id'\?\)", builder={"config": {"eos_token": 2}})  # fmt: skip
    refused(r"builder.config: .*unknown field 'session_id'", builder={"config": {"session_id": "s"}})
    refused(r"builder.config: .*verify: Input should be a valid boolean", builder={"config": {"verify": "maybe"}})
    with pytest.raises(UnknownComponentError, match="prefix_merge"):
        check_task(task(builder={"strategy": "prefix_merge"}))


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"type": "exec"}, r"\(exec\): needs 'command'"),
        ({"type": "exec", "command": ""}, r"\(exec\): needs 'command'"),
        ({"type": "write_file", "path": "a"}, r"\(write_file\): needs 'content'"),
        ({"type": "write_file", "content": "x"}, r"\(write_file\): needs 'path'"),
        ({"type": "upload"}, r"\(upload\): needs 'source'"),
        ({"type": "write_file", "path": "a", "content": "x", "command": "ls"}, r"'command' does not apply"),
        ({"type": "upload", "source": "/etc/passwd"}, r"source '/etc/passwd' must be a path inside the task's folder"),
        ({"type": "upload", "source": "../secret"}, r"source '../secret' must be a path inside the task's folder"),
        ({"type": "upload", "source": "a/../../b"}, r"must be a path inside the task's folder"),
    ],
)
def test_bad_prepare_actions(action: dict[str, Any], message: str) -> None:
    refused(rf"task 't': runtime.prepare: prepare\[0\] .*{message}", runtime={"prepare": [action]})


def test_an_upload_may_not_follow_a_symlink_out_of_the_task_folder(tmp_path: Path) -> None:
    folder = tmp_path / "task"
    folder.mkdir()
    (tmp_path / "secret.txt").write_text("no")
    (folder / "link.txt").symlink_to(tmp_path / "secret.txt")
    bad = task(runtime={"prepare": [{"type": "upload", "source": "link.txt"}]})
    with pytest.raises(ConfigError, match="leads outside the task's folder"):
        check_task(bad, base_dir=folder)

    async def start() -> None:  # the same rule where the action runs
        await start_session(bad.runtime, RuntimeContext("u", scratch_root=tmp_path / "scratch"), base_dir=folder)

    with pytest.raises(ConfigError, match="leads outside the task's folder"):
        asyncio.run(start())
    no_folder = RuntimeSpec(prepare=[PrepareAction(type="upload", source="x.txt")])
    with pytest.raises(ConfigError, match=r"this task has no folder to upload 'x\.txt' from"):
        asyncio.run(start_session(no_folder, RuntimeContext("v", scratch_root=tmp_path / "scratch")))


def test_runtime_spec_and_config() -> None:
    refused(r"runtime: runtime 'local': unknown config isolaton", runtime={"config": {"isolaton": "none"}})
    refused(r"runtime: runtime 'local' cannot honour image", runtime={"image": "ubuntu"})
    refused(r"runtime: runtime 'docker' needs 'image'", runtime={"backend": "docker"})


def test_harness_config_is_checked_by_the_harness() -> None:
    refused(r"agent.config: harness 'shell': unknown config comand",
            agent={"harness": "shell", "config": {"comand": "x"}})  # fmt: skip
    refused(r"agent.config: harness 'shell': config.command must be", agent={"harness": "shell", "config": {}})
    refused(r"agent.config: harness 'pi': config api must be one of", agent={"harness": "pi", "config": {"api": "x"}})
    refused(r"agent.config: harness 'pi': unknown config model", agent={"harness": "pi", "config": {"model": "x"}})
    refused(r"agent.config: harness 'opencode': config.settings must be a mapping",
            agent={"harness": "opencode", "config": {"settings": [1]}})  # fmt: skip


def test_evaluator_config() -> None:
    refused(r"evaluator.config: ", evaluator={"strategy": "test_on_output", "config": {}})


def test_a_script_path_in_metadata_is_refused() -> None:
    script = "/etc/script.yaml"
    message = rf"metadata.script: a session's script must be an inline list .* not str '{script}'"
    refused(message, metadata={"script": script})


def test_the_gateway_refuses_at_submit_before_any_session(tmp_path: Path) -> None:
    config = GatewayConfig(port=0, data_dir=tmp_path / "data", scratch_root=tmp_path / "scratch")
    bad = task(builder={"config": {"eos_tokn": 2}}, agent={"harness": "shell", "config": {"command": sys.executable}})

    async def body() -> int:
        async with GatewayNode(config) as node:
            with pytest.raises(ConfigError, match=r"builder.config: .*unknown field 'eos_tokn'"):
                await node.submit_task(bad)
            return node.pipeline.metrics()["sessions"]["submitted"]

    assert asyncio.run(body()) == 0
