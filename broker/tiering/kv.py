"""The small ordered key-value interface the tiered manifest is kept in, and its two implementations.

- `RocksKV`: a column family (`CF_TIER`) of the broker's RocksDB; the store must be opened with
  `extra_cfs=(CF_TIER, ...)`. `write` is one RocksDB WriteBatch, so it is atomic and durable with
  the rest of the store's state.
- `MemoryKV`: a dict, for unit tests and tools.

Keys and values are bytes; `scan(prefix)` yields (key, value) pairs in byte order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from broker.store.index import Index

CF_TIER = "tier"


class KV(Protocol):
    """Bytes to bytes, ordered by key. `write` applies its puts and deletes atomically."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes] = ()) -> None: ...


class MemoryKV:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.write({key: value})

    def delete(self, key: bytes) -> None:
        self.write({}, [key])

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        with self._lock:
            items = sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))
        yield from items

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        with self._lock:
            for key in deletes:
                self.data.pop(key, None)
            self.data.update(puts)


class RocksKV:
    def __init__(self, index: Index, cf: str = CF_TIER) -> None:
        self._index = index
        self._name = cf
        self._cf = index.cf(cf)

    def get(self, key: bytes) -> bytes | None:
        value = self._cf.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        self.write({key: value})

    def delete(self, key: bytes) -> None:
        self.write({}, [key])

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._cf.items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield bytes(key), bytes(value)

    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes] = ()) -> None:
        handle = self._index.handle(self._name)
        batch = self._index.batch()
        for key in deletes:
            batch.delete(key, handle)
        for key, value in puts.items():
            batch.put(key, value, handle)
        self._index.write(batch)
