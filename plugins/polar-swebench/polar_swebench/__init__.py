"""Polar plugin: the ``swebench_harness`` evaluator and the SWE-Gym / SWE-bench Verified / SkyRL datasets."""

from __future__ import annotations

from polar_cli.api import RegisterDataset, RegisterEvaluator, hookimpl
from polar_swebench.datasets import SkyRLSweGymDataset, SwebenchVerifiedDataset, SweGymDataset, task_for
from polar_swebench.evaluator import SwebenchHarnessConfig, SwebenchHarnessEvaluator
from polar_swebench.grading import GradeReport, grade
from polar_swebench.images import image_name
from polar_swebench.instance import SweInstance

__all__ = [
    "GradeReport",
    "SkyRLSweGymDataset",
    "SweGymDataset",
    "SweInstance",
    "SwebenchHarnessConfig",
    "SwebenchHarnessEvaluator",
    "SwebenchVerifiedDataset",
    "grade",
    "image_name",
    "task_for",
]


@hookimpl
def register_evaluators(register: RegisterEvaluator) -> None:
    register(SwebenchHarnessEvaluator())


@hookimpl
def register_datasets(register: RegisterDataset) -> None:
    register(SweGymDataset())
    register(SwebenchVerifiedDataset())
    register(SkyRLSweGymDataset())
