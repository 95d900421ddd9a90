"""The broker's copy of the AMQP gateway's metadata document (exchanges, queues, bindings).

Like the security document (broker/security_store.py) the broker does not interpret it: the
proxies encode it (proxy/amqp/meta.py). It is kept durably in the RocksDB column family
`amqp_meta` under one key, as an 8-byte big-endian version followed by the document. A write
must carry exactly the next version (compare-and-set): two proxies that change the metadata at
once cannot both win, the loser re-reads and applies its change again. Writes go through
`Index.batch()` / `Index.write()`, so a replicated primary records them as state changes and the
broker acknowledges them once the in-sync replicas hold them (docs/replication.md).
"""

from __future__ import annotations

import struct

from broker.store.index import Index
from common.errors import BadRequest, PreconditionFailed

CF_AMQP_META = "amqp_meta"
AMQP_META_CFS = (CF_AMQP_META,)
_KEY = b"document"
_VERSION = struct.Struct(">Q")
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


class AmqpMetaStore:
    def __init__(self, index: Index) -> None:
        self._index = index
        raw = index.cf(CF_AMQP_META).get(_KEY)
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
            raise BadRequest(f"the AMQP metadata document is {len(data)} bytes; at most {MAX_DOCUMENT_BYTES} are kept")
        if version != self.version + 1:
            raise PreconditionFailed(
                f"the AMQP metadata changed meanwhile (this broker holds version {self.version}, the write was "
                f"version {version}); read it again and retry"
            )
        batch = self._index.batch()
        batch.put(_KEY, _VERSION.pack(version) + data, self._index.handle(CF_AMQP_META))
        self._index.write(batch)
        self.version, self.data = version, data
