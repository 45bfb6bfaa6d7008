"""One SWE-style task instance (SWE-bench, SWE-bench Verified, SWE-Gym, SWE-smith and ``swebench`` 5.x rows)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polar_cli.api import validate_model


class SweInstance(BaseModel):
    """The fields Polar reads; any other column (created_at, environment_setup_commit, ...) is kept as it is.

    ``FAIL_TO_PASS``/``PASS_TO_PASS`` may be lists or JSON strings (SWE-bench stores strings). ``eval_script`` and
    ``log_parser`` (a ``swebench`` parser name, e.g. ``parse_log_pytest``) are what ``swebench`` 5.x instances and
    SWE-smith-style datasets carry; without them the script comes from an installed ``swebench`` or ``swegym``.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str
    repo: str
    base_commit: str | None = None
    version: str | None = None
    problem_statement: str = ""
    hints_text: str | None = None
    patch: str | None = None
    test_patch: str | None = None
    fail_to_pass: list[str] = Field(default_factory=list, alias="FAIL_TO_PASS")
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")
    eval_script: str | None = None
    log_parser: str | None = None
    image: str | None = None

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else []
            except ValueError as exc:
                raise ValueError(f"not a JSON list of test names: {exc}") from exc
        return list(value) if isinstance(value, tuple) else value

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    def as_row(self) -> dict[str, Any]:
        """The instance as a dataset row (SWE-bench's field names, lists for the test lists)."""
        return self.model_dump(by_alias=True, exclude_none=True)


def load_instance(data: Any, *, source: str) -> SweInstance:
    """Validate one instance row (ConfigError naming the field and ``source`` when it is malformed)."""
    return validate_model(SweInstance, data, source=source)
