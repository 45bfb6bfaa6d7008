"""A FIFO between two stages: optionally bounded, and a waiting session can be taken out (cancellation)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class StageQueue(Generic[T]):
    """``put`` waits while the queue is full (backpressure on the stage before), ``get`` while it is empty."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._items: deque[T] = deque()
        self._changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return self.capacity is not None and len(self._items) >= self.capacity

    async def put(self, item: T) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: not self.full())
            self._items.append(item)
            self._changed.notify_all()

    async def get(self) -> T:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    async def remove(self, item: T) -> bool:
        """Take ``item`` out (by identity); False if it is not waiting here."""
        async with self._changed:
            for index, candidate in enumerate(self._items):
                if candidate is item:
                    del self._items[index]
                    self._changed.notify_all()
                    return True
            return False
