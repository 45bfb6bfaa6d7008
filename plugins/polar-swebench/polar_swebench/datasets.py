"""The ``swegym``, ``swebench_verified`` and ``skyrl_swegym`` datasets: SWE instances as TaskRequests.

Rows come from the HuggingFace hub with ``datasets`` (``pip install 'polar-swebench[hf]'``), or offline from ``path``:
a ``.jsonl``/``.json``/``.parquet`` file or a folder of them (e.g. a downloaded dataset snapshot). Each instance
becomes a task: the instance's image (``image_prefix`` + id, ``__`` → ``_s_``, lower-cased; an ``image`` field in the
row or ``image_template`` wins), workdir ``/testbed``, the instruction template filled from the row, ``repo`` and
``instance_id`` in the metadata (for grouping and stratified splits), and the ``swebench_harness`` evaluator with the
instance attached and ``refresh_runtime`` on. ``backend`` picks the runtime (``docker`` or ``apptainer``, which
gets a ``docker://`` URI for the same image).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from polar_cli.api import (
    ConfigError,
    Dataset,
    PolarError,
    StrictModel,
    TaskRequest,
    hub_cause,
    load_from_hub,
    missing_dependency,
    require,
    validate_model,
)
from polar_swebench.images import DEFAULT_PREFIX, DEFAULT_TAG, for_backend, image_name
from polar_swebench.instance import SweInstance, load_instance

DEFAULT_INSTRUCTION = """\
<uploaded_files>
{workdir}
</uploaded_files>
I've uploaded a Python code repository in the directory {workdir}. Consider the following issue description:

<issue_description>
{problem_statement}
</issue_description>

Make the minimal changes to non-test files in {workdir} so that the issue is resolved. The tests are already taken
care of: do not modify the testing logic or any of the tests. Work in {workdir} until the issue is fixed.
"""
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


class SweDatasetConfig(StrictModel):
    """Config of the SWE datasets (``polar generate --dataset swegym -O key=value`` or a recipe's ``dataset``)."""

    path: str | None = Field(default=None, description="local .jsonl/.json/.parquet file or folder (offline)")
    hub_id: str | None = Field(default=None, description="HuggingFace dataset id (default: the dataset's own)")
    split: str | None = Field(default=None, description="hub split / file stem (default: the dataset's own)")
    limit: int | None = Field(default=None, gt=0)
    instance_ids: list[str] | None = Field(default=None, description="only these instances")
    backend: str = Field(default="docker", description="runtime backend: docker or apptainer")
    image_prefix: str = DEFAULT_PREFIX
    image_tag: str = DEFAULT_TAG
    image_template: str | None = Field(default=None, description="e.g. 'registry/{instance_id}:v1' (wins)")
    workdir: str = "/testbed"
    instruction_template: str = DEFAULT_INSTRUCTION
    harness: str = "pi"
    model_name: str | None = None
    num_samples: int = Field(default=1, gt=0)
    timeout_seconds: float = Field(default=3600.0, gt=0, description="the agent's budget per session")
    eval_timeout_seconds: float = Field(default=1800.0, gt=0, description="the test run's limit")
    evaluation_budget_seconds: float | None = Field(default=None, gt=0, description="EvaluatorSpec.timeout_seconds")
    builder: str = "prefix_merging"
    runtime_config: dict[str, Any] = Field(default_factory=dict, description="RuntimeSpec.config")
    agent_config: dict[str, Any] = Field(default_factory=dict, description="AgentSpec.config")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="added to every task's metadata (e.g. the scripted backend's script)"
    )


def _read_file(path: Path) -> Iterator[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.read_table(path).to_pylist()
        elif suffix == ".jsonl":
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise ConfigError(f"{path}:{number}: not valid JSON: {exc}") from exc
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
            yield from data if isinstance(data, list) else [data]
    except ImportError as exc:
        raise missing_dependency("pyarrow", needed_by=f"reading {path}") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc


def local_rows(path: Path, split: str | None) -> Iterator[dict[str, Any]]:
    """Rows of a data file, or of a folder's data files (only those whose name starts with ``split`` when given)."""
    if path.is_file():
        yield from _read_file(path)
        return
    if not path.is_dir():
        raise ConfigError(f"dataset path {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
    if split is not None:
        files = [p for p in files if p.name.startswith(split) or split in p.parent.name]
    if not files:
        raise ConfigError(f"dataset path {path} holds no {'/'.join(DATA_SUFFIXES)} file" +
                          (f" for split {split!r}" if split else ""))  # fmt: skip
    for file in files:
        yield from _read_file(file)


def local_copy(dataset: str) -> str:
    """How to give ``dataset``'s rows without the hub: its ``path`` option, with an example."""
    return (f"give a local copy: polar generate --dataset {dataset} -O path=/data/{dataset}.jsonl "
            f"(a {'/'.join(DATA_SUFFIXES)} file or a folder of them)")  # fmt: skip


def hub_rows(hub_id: str, split: str, hint: str) -> Iterator[dict[str, Any]]:
    """The rows of ``hub_id``'s ``split``, loaded with ``datasets``; without the hub, one line within seconds (not
    the library's ~24 s of retry warnings) ending with ``hint``: how to give a local copy instead."""
    datasets = require("datasets", needed_by=f"loading {hub_id} from the hub", distribution="polar-swebench",
                       also=f"; or {hint}")  # fmt: skip
    try:
        rows: Iterable[dict[str, Any]] = load_from_hub(
            lambda: datasets.load_dataset(hub_id, split=split), name=f"{hub_id} (split {split})",
            local_copy=hint)  # fmt: skip
    except PolarError:
        raise
    except Exception as exc:  # auth, unknown split...: the library's own message says which
        raise ConfigError(f"cannot load {hub_id} (split {split}): {hub_cause(exc)}") from exc
    yield from rows


class SweDataset(Dataset):
    """Base of the SWE datasets: where rows come from and how one becomes a TaskRequest."""

    hub_id: ClassVar[str]
    split: ClassVar[str]
    options: ClassVar[type[BaseModel]] = SweDatasetConfig

    def instance_of(self, row: dict[str, Any], source: str) -> SweInstance:
        return load_instance(row, source=source)

    def rows(self, config: SweDatasetConfig) -> Iterator[dict[str, Any]]:
        split = config.split or self.split
        if config.path is not None:
            return local_rows(Path(config.path), config.split)
        return hub_rows(config.hub_id or self.hub_id, split, local_copy(self.name))

    def tasks(self, **raw: Any) -> Iterator[TaskRequest]:
        config: SweDatasetConfig = self.parse_config(raw)
        wanted = set(config.instance_ids) if config.instance_ids else None
        count = 0
        for number, row in enumerate(self.rows(config)):
            if config.limit is not None and count >= config.limit:
                return
            instance = self.instance_of(row, f"dataset {self.name!r} row {number}")
            if wanted is not None and instance.instance_id not in wanted:
                continue
            count += 1
            yield task_for(instance, config)


def _image(instance: SweInstance, config: SweDatasetConfig) -> str:
    if config.image_template:
        return config.image_template.format(instance_id=instance.instance_id,
                                            image_id=instance.instance_id.replace("__", "_s_").lower())  # fmt: skip
    if instance.image:
        return instance.image
    return image_name(instance.instance_id, prefix=config.image_prefix, tag=config.image_tag)


def task_for(instance: SweInstance, config: SweDatasetConfig) -> TaskRequest:
    """The TaskRequest for one instance."""
    fields = {"workdir": config.workdir, "problem_statement": instance.problem_statement,
              "instance_id": instance.instance_id, "repo": instance.repo}  # fmt: skip
    try:
        instruction = config.instruction_template.format(**fields)
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"instruction_template: unknown field {exc} (known: {', '.join(fields)})") from exc
    evaluator: dict[str, Any] = {
        "strategy": "swebench_harness",
        "refresh_runtime": True,
        "timeout_seconds": config.evaluation_budget_seconds,
        "config": {"instance": instance.as_row(), "eval_timeout_seconds": config.eval_timeout_seconds},
    }
    runtime = {
        "backend": config.backend,
        "image": for_backend(_image(instance, config), config.backend),
        "workdir": config.workdir,
        "config": config.runtime_config,
    }
    metadata = {
        **config.metadata,
        "instance_id": instance.instance_id,
        "repo": instance.repo,
        "base_commit": instance.base_commit,
        "version": instance.version,
    }
    task = {
        "task_id": instance.instance_id,
        "instruction": instruction,
        "num_samples": config.num_samples,
        "timeout_seconds": config.timeout_seconds,
        "runtime": runtime,
        "agent": {"harness": config.harness, "model_name": config.model_name, "config": config.agent_config},
        "builder": {"strategy": config.builder},
        "evaluator": evaluator,
        "metadata": metadata,
    }
    return validate_model(TaskRequest, task, source=f"instance {instance.instance_id}")


class SweGymDataset(SweDataset):
    name: ClassVar[str] = "swegym"
    description: ClassVar[str] = "SWE-Gym training tasks (SWE-Gym/SWE-Gym, 2,438 instances)"
    hub_id: ClassVar[str] = "SWE-Gym/SWE-Gym"
    split: ClassVar[str] = "train"


class SwebenchVerifiedDataset(SweDataset):
    name: ClassVar[str] = "swebench_verified"
    description: ClassVar[str] = "SWE-bench Verified evaluation tasks (princeton-nlp/SWE-bench_Verified, 500)"
    hub_id: ClassVar[str] = "princeton-nlp/SWE-bench_Verified"
    split: ClassVar[str] = "test"


class SkyRLSweGymDataset(SweDataset):
    """The paper's training set: SWE-Gym instances nested under each row's ``instance`` column."""

    name: ClassVar[str] = "skyrl_swegym"
    description: ClassVar[str] = "SkyRL-v0-293-data: the paper's 293 SWE-Gym training tasks (rows nest 'instance')"
    hub_id: ClassVar[str] = "NovaSky-AI/SkyRL-v0-293-data"
    split: ClassVar[str] = "train"

    def instance_of(self, row: dict[str, Any], source: str) -> SweInstance:
        nested = row.get("instance")
        if isinstance(nested, str):
            try:
                nested = json.loads(nested)
            except ValueError as exc:
                raise ConfigError(f"{source}: column 'instance' is not a JSON object: {exc}") from exc
        if not isinstance(nested, dict):
            raise ConfigError(f"{source}: expected an 'instance' column holding the SWE-Gym instance")
        return load_instance(nested, source=f"{source} (instance)")
