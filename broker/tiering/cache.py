"""A thread-safe LRU cache bounded by bytes (decoded row groups and footers of tiered segments).

`put` of an entry larger than the whole budget is ignored rather than evicting everything. Sizes are
the caller's estimate of the memory an entry holds (`pyarrow.Table.nbytes`, a footer's size).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0


class LruCache(Generic[K, V]):
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._stats = CacheStats()

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._stats.misses += 1
                return None
            self._items.move_to_end(key)
            self._stats.hits += 1
            return item[0]

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._items

    def put(self, key: K, value: V, size_bytes: int) -> None:
        if size_bytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._stats.bytes -= old[1]
            self._items[key] = (value, size_bytes)
            self._stats.bytes += size_bytes
            while self._stats.bytes > self.max_bytes:
                _, (_, size) = self._items.popitem(last=False)
                self._stats.bytes -= size
                self._stats.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._stats.bytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            s = self._stats
            return CacheStats(s.hits, s.misses, s.evictions, len(self._items), s.bytes)
