"""Instances given only by their ``instance_id``, looked up when grading in the SWE dataset the operator configured.

The paper's TaskRequest (appendix A.3) names its instance as ``{"instance_id": "getmoto__moto-5752"}``: the rows
(base commit, test patch, FAIL_TO_PASS, ...) are the operator's data, not the task's. Where they are is therefore said
on the machine that grades (the gateway: ``polar serve``, ``polar run``), never in the task, so a submitted task cannot
make Polar read a host file of its choosing:

- ``POLAR_SWEBENCH_DATASET``: a local ``.jsonl``/``.json``/``.parquet`` file or a folder of them (offline; relative to
  where the grading process started), or a HuggingFace dataset id (``SWE-Gym/SWE-Gym``; needs ``polar-swebench[hf]``).
  An existing path, an absolute one, or one ending in a data suffix is a local file; anything else is a hub id.
- ``POLAR_SWEBENCH_SPLIT``: the hub split, or a file-name prefix in a folder (default ``train`` on the hub).

Rows are SWE-bench / SWE-Gym rows, or SkyRL rows nesting the instance under ``instance``. The index is built once per
source (again when a local file is rewritten) and kept in the process.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field

from polar_cli.api import EvaluationError, PolarError, StrictModel
from polar_swebench.datasets import DATA_SUFFIXES, hub_rows, local_rows
from polar_swebench.instance import SweInstance, load_instance

DATASET_ENV = "POLAR_SWEBENCH_DATASET"
SPLIT_ENV = "POLAR_SWEBENCH_SPLIT"
DEFAULT_HUB_SPLIT = "train"
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
HOW = (f"the operator sets {DATASET_ENV} where it grades (a local {'/'.join(DATA_SUFFIXES)} file or folder of SWE "
       "rows, or a HuggingFace dataset id such as SWE-Gym/SWE-Gym)")  # fmt: skip


class InstanceRef(StrictModel):
    """An instance given only by its id (the paper's payload): the row is looked up when the session is graded."""

    instance_id: str = Field(min_length=1)


@dataclass(frozen=True)
class InstanceSource:
    """Where the operator's rows are: ``location`` (a local path or a hub id) and ``split``."""

    location: str
    split: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InstanceSource | None:
        env = os.environ if environ is None else environ
        location = env.get(DATASET_ENV, "").strip()
        return cls(location, env.get(SPLIT_ENV, "").strip() or None) if location else None

    @property
    def local(self) -> bool:
        path = Path(self.location).expanduser()
        return (path.exists() or path.is_absolute() or path.suffix.lower() in DATA_SUFFIXES
                or not HUB_ID.fullmatch(self.location))  # fmt: skip

    def describe(self) -> str:
        split = f" (split {self.split})" if self.split else ""
        return f"{'' if self.local else 'hub dataset '}{self.location}{split} ({DATASET_ENV})"

    def rows(self) -> Iterator[dict[str, Any]]:
        if self.local:
            return local_rows(Path(self.location).expanduser(), self.split)
        return hub_rows(self.location, self.split or DEFAULT_HUB_SPLIT, f"point {DATASET_ENV} at a local copy")

    def version(self) -> int | None:
        """A local source's modification time (a rewritten file, or a folder with files added or removed, is read
        again); None for the hub."""
        try:
            return Path(self.location).expanduser().stat().st_mtime_ns if self.local else None
        except OSError:
            return None


def _row_id(row: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any]]:
    nested = row.get("instance")
    if "instance_id" not in row and isinstance(nested, str):
        try:
            nested = json.loads(nested)
        except ValueError:
            nested = None
    if "instance_id" not in row and isinstance(nested, Mapping):  # SkyRL: the instance nested under "instance"
        row = nested
    value = row.get("instance_id")
    return (str(value) if value is not None else None), row


_LOADING = threading.Lock()  # sessions graded at once read the dataset once, not once each


@lru_cache(maxsize=4)
def _index(source: InstanceSource, version: int | None) -> dict[str, Mapping[str, Any]]:
    del version  # part of the cache key only
    index: dict[str, Mapping[str, Any]] = {}
    for row in source.rows():
        instance_id, instance = _row_id(row)
        if instance_id is not None:
            index.setdefault(instance_id, instance)
    return index


def lookup_instance(instance_id: str, source: InstanceSource | None = None) -> SweInstance:
    """The row of ``instance_id`` in ``source`` (default: the one the environment configures), validated; an
    EvaluationError naming the id when there is no source, it cannot be read, or the id is not in it (or its row is
    malformed).

    Blocking (it may read a file or the hub the first time): call it in a thread from async code.
    """
    source = source or InstanceSource.from_env()
    if source is None:
        raise EvaluationError(f"instance {instance_id!r} is given only by its instance_id and no SWE dataset is "
                              f"configured to look it up in: {HOW}")  # fmt: skip
    try:
        with _LOADING:
            index = _index(source, source.version())
    except PolarError as exc:
        raise EvaluationError(f"instance {instance_id!r}: cannot read {source.describe()}: {exc}") from exc
    row = index.get(instance_id)
    if row is None:
        raise EvaluationError(f"instance {instance_id!r} is not in {source.describe()} ({len(index)} instances)")
    try:
        return load_instance(dict(row), source=f"instance {instance_id!r} in {source.describe()}")
    except PolarError as exc:
        raise EvaluationError(str(exc)) from exc
