"""How the suite splits over pytest-xdist workers (``POLAR_TEST_WORKERS=2 .ci/run``: ``pytest -n 2 --dist loadgroup``).

Every test gets an ``xdist_group``: its own file by default, so a module's servers (module-scoped fixtures) start once,
on one worker. Every test that needs a vLLM server goes to one group, ``vllm``: the servers are session fixtures, and
one worker starts each once instead of both starting their own copy (each start takes about 40 s of both cores).
A test that already names a group keeps it.
"""

from __future__ import annotations

import pytest

VLLM_GROUP = "vllm"
VLLM_FIXTURES = frozenset({"vllm_url", "vllm_pair", "vllm_model_dir"})


def group_of(item: pytest.Item) -> str:
    if item.get_closest_marker("vllm") is not None or VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
        return VLLM_GROUP
    return item.nodeid.split("::", 1)[0]


def assign_groups(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(name=group_of(item)))
