"""A versioned document the broker keeps for others without interpreting it.

The security document (common/security.py) and the AMQP gateway's metadata (proxy/amqp/meta.py)
are each one encoded document. The broker keeps the newest version durably in a RocksDB column
family of its own, under one key, as an 8-byte big-endian version followed by the document.
Writes go through `Index.batch()` / `Index.write()`, so a replicated primary records them as state
changes and the broker acknowledges them once the in-sync replicas hold them
(docs/replication.md). Mutations run on the broker's event loop thread.
"""

from __future__ import annotations

import struct

from broker.store.index import Index
from common.errors import BadRequest, PreconditionFailed

_KEY = b"document"
_VERSION = struct.Struct(">Q")
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


class VersionedDocument:
    """One document in column family `cf`. With `next_only` a write must carry exactly the next
    version (compare-and-set: of two writers at once one wins, the other re-reads and retries);
    otherwise any version above the one held (a slow or repeated write never rolls it back).
    `what` names the document in errors, `retry` says what to do after a lost race."""

    def __init__(self, index: Index, cf: str, *, what: str, next_only: bool, retry: str) -> None:
        self._index = index
        self._cf = cf
        self._what = what
        self._next_only = next_only
        self._retry = retry
        raw = index.cf(cf).get(_KEY)
        if raw is None:
            self.version, self.data = 0, b""
        else:
            (self.version,) = _VERSION.unpack_from(raw)
            self.data = bytes(raw[_VERSION.size :])

    def get(self, newer_than: int) -> tuple[int, bytes]:
        """(version, document); the document is empty unless the version is above `newer_than`."""
        return self.version, (self.data if self.version > newer_than else b"")

    def put(self, version: int, data: bytes) -> None:
        if len(data) > MAX_DOCUMENT_BYTES:
            raise BadRequest(f"the {self._what} is {len(data)} bytes; at most {MAX_DOCUMENT_BYTES} are kept")
        stale = version != self.version + 1 if self._next_only else version <= self.version
        if stale:
            raise PreconditionFailed(
                f"the {self._what} changed meanwhile (this broker holds version {self.version}, the write was "
                f"version {version}); {self._retry}"
            )
        batch = self._index.batch()
        batch.put(_KEY, _VERSION.pack(version) + data, self._index.handle(self._cf))
        self._index.write(batch)
        self.version, self.data = version, data
