"""Polar plugin: SWE-Gym / SWE-bench Verified datasets and the swebench_harness evaluator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from polar_cli.errors import NotImplementedYetError
from polar_cli.hookspecs import Register, hookimpl
from polar_cli.interfaces import Dataset, Evaluator
from polar_cli.models import TaskRequest


def _not_yet(what: str) -> NotImplementedYetError:
    return NotImplementedYetError(f"{what} (polar-swebench) is declared but not implemented yet")


class SwebenchHarnessEvaluator(Evaluator):
    """Runs the SWE-bench test harness on the agent's patch."""

    name = "swebench_harness"
    description = "SWE-bench harness: apply the agent's patch, run FAIL_TO_PASS/PASS_TO_PASS tests"

    async def evaluate(self, context: Any) -> Any:
        raise _not_yet("evaluator 'swebench_harness'")


class _SweDataset(Dataset):
    def tasks(self, **config: Any) -> Iterator[TaskRequest]:
        raise _not_yet(f"dataset {self.name!r}")


class SweGymDataset(_SweDataset):
    name = "swegym"
    description = "SWE-Gym training tasks"


class SwebenchVerifiedDataset(_SweDataset):
    name = "swebench_verified"
    description = "SWE-bench Verified evaluation tasks"


@hookimpl
def register_evaluators(register: Register) -> None:
    register(SwebenchHarnessEvaluator())


@hookimpl
def register_datasets(register: Register) -> None:
    register(SweGymDataset())
    register(SwebenchVerifiedDataset())
