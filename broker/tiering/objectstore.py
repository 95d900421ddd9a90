"""The object store seam of tiered storage: a `typing.Protocol` and what every implementation shares.

Implementations: `S3ObjectStore` (broker/tiering/s3store.py: boto3, any S3-compatible endpoint) and
`LocalDirObjectStore` (broker/tiering/localstore.py: a directory, for tests and for users without
S3). tests/contract/test_object_store_contract.py runs one suite against both.

Contract (every method is blocking and bounded; call it from a worker thread, never the event loop):

- `put(key, data)` / `put_stream(key, seekable_stream)` store an object whole (multipart above a size
  threshold where the store has it) and return only after the object is verified: a HEAD shows the
  expected size and the SHA-256 the writer computed (kept as object metadata). Re-putting a key
  replaces it. A failed or unverified put raises; the key then holds the old object, the new one,
  or nothing, never a mix that passes verification.
- `put_if(key, data, etag)` is a conditional write (S3's If-Match / If-None-Match): it stores the
  object only if the key's current version has `etag` (an `ObjectInfo.etag` from `head` or an
  earlier `put_if`), or, with `etag=""`, only if the key holds nothing; otherwise it raises
  `PreconditionFailed` and changes nothing. It returns the new version's `ObjectInfo` (with its etag).
  The tiered manifest's mirror uses it (manifest.py). Small objects only (no multipart).
- `get(key, start, end)` returns bytes [start, min(end, size)); `b""` when start >= size.
- `head(key)` returns size and SHA-256 (`""` if the object carries none), or None if absent.
- `list_objects(prefix)` yields every object whose key starts with `prefix`, in key order (no SHA-256).
- `delete(key)` removes an object; deleting an absent key is not an error.

Errors: `Unavailable` (retriable) when the store cannot be reached, times out or answers 5xx;
`ObjectNotFound` for a missing key on `get`; other refusals (access denied, no such bucket) raise
`InternalError`. Every message names the store, bucket and key.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import BinaryIO, Protocol

from common.errors import NotFound

SHA256_METADATA_KEY = "sha256"  # S3 user metadata (x-amz-meta-sha256): hex SHA-256 of the whole object
HASH_CHUNK_BYTES = 1 << 20


class ObjectNotFound(NotFound):
    """The object does not exist (never uploaded, or deleted by tiered retention)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str = ""  # lower-case hex; "" when unknown (listings, objects written by others)
    etag: str = ""


class ObjectStore(Protocol):
    def describe(self) -> str:
        """Where the store is (endpoint and bucket, or directory), for messages; never credentials."""
        ...

    def put(self, key: str, data: bytes) -> ObjectInfo: ...

    def put_if(self, key: str, data: bytes, etag: str) -> ObjectInfo: ...

    def put_stream(self, key: str, stream: BinaryIO) -> ObjectInfo:
        """Upload a seekable stream from its current position to its end."""
        ...

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...


def hash_stream(stream: BinaryIO) -> tuple[int, str]:
    """(bytes, hex SHA-256) from the stream's position to its end; the position is restored."""
    start = stream.tell()
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(HASH_CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
    stream.seek(start)
    return size, digest.hexdigest()


@dataclass
class StoreCounters:
    gets: int = 0
    get_bytes: int = 0
    puts: int = 0
    put_bytes: int = 0
    heads: int = 0
    lists: int = 0
    deletes: int = 0


class MeteredObjectStore:
    """An ObjectStore that counts calls and bytes (metrics; tests count GETs with it). Thread-safe."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.counters = StoreCounters()
        self._lock = threading.Lock()

    def snapshot(self) -> StoreCounters:
        with self._lock:
            return StoreCounters(**{f.name: getattr(self.counters, f.name) for f in fields(StoreCounters)})

    def reset(self) -> None:
        with self._lock:
            self.counters = StoreCounters()

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + amount)

    def describe(self) -> str:
        return self.inner.describe()

    def put(self, key: str, data: bytes) -> ObjectInfo:
        info = self.inner.put(key, data)
        self._count("puts")
        self._count("put_bytes", len(data))
        return info

    def put_if(self, key: str, data: bytes, etag: str) -> ObjectInfo:
        info = self.inner.put_if(key, data, etag)
        self._count("puts")
        self._count("put_bytes", len(data))
        return info

    def put_stream(self, key: str, stream: BinaryIO) -> ObjectInfo:
        info = self.inner.put_stream(key, stream)
        self._count("puts")
        self._count("put_bytes", info.size)
        return info

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self._count("gets")
        data = self.inner.get(key, start, end)
        self._count("get_bytes", len(data))
        return data

    def head(self, key: str) -> ObjectInfo | None:
        self._count("heads")
        return self.inner.head(key)

    def list_objects(self, prefix: str) -> Iterator[ObjectInfo]:
        self._count("lists")
        return self.inner.list_objects(prefix)

    def delete(self, key: str) -> None:
        self._count("deletes")
        self.inner.delete(key)
