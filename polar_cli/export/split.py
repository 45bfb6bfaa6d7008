"""A deterministic stratified train/test split that keeps every group with two or more rows in both splits.

Written here rather than taken from ``datasets`` (``train_test_split(stratify_by_column=...)``), which needs a
ClassLabel column and refuses groups too small for the requested fraction; here a group of ``n >= 2`` rows gives
``min(n - 1, max(1, round(n * test_size)))`` rows to test, and a group of one row stays in train.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Hashable, Iterable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def stratified_test_keys(rows: Iterable[tuple[K, str]], test_size: float, seed: int) -> set[K]:
    """The keys that go to test, from ``(key, group)`` pairs; the same input and seed give the same answer."""
    groups: dict[str, list[K]] = defaultdict(list)
    for key, group in rows:
        groups[group].append(key)
    test: set[K] = set()
    if test_size <= 0:
        return test
    for group in sorted(groups):
        keys = sorted(groups[group], key=repr)
        if len(keys) < 2:
            continue
        random.Random(f"{seed}:{group}").shuffle(keys)
        n_test = min(len(keys) - 1, max(1, round(len(keys) * test_size)))
        test.update(keys[:n_test])
    return test
