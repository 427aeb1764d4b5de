"""A least-recently-used cache bounded by bytes, for what a process keeps of immutable files (an object
store's data logs, base files' key columns): thread-safe; an item larger than an eighth of the budget is not
kept (one large file must not evict everything)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class SizedCache(Generic[V]):
    def __init__(self, budget: int, weigh: Callable[[V], int] = len) -> None:
        self.budget = budget
        self.weigh = weigh
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._mutex = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._mutex:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: V) -> None:
        size = self.weigh(value)
        if size > self.budget // 8:
            return
        with self._mutex:
            if key in self._items:
                return
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.budget:
                self._bytes -= self._items.popitem(last=False)[1][1]

    def discard(self, key: Hashable) -> None:
        with self._mutex:
            item = self._items.pop(key, None)
            if item is not None:
                self._bytes -= item[1]

    def clear(self) -> None:
        with self._mutex:
            self._items.clear()
            self._bytes = 0
