"""The broker's copy of the cluster security document (users, access rules, limits).

The broker does not interpret the document (common/security.py is its codec); it keeps the
newest version durably in the RocksDB column family `security` under one key, as an 8-byte
big-endian version followed by the encoded document, and refuses a write whose version is not
above the one held, so a slow or repeated write can never roll the document back. Every broker
holds a copy: `sluice admin` writes each one, proxies read the highest version they can reach.
Mutations run on the broker's event loop thread. A write goes through `Index.batch()` /
`Index.write()`, so a replicated primary records it as a state change (docs/replication.md) and
the broker acknowledges it once the in-sync replicas hold it.
"""

from __future__ import annotations

import struct

from broker.store.index import Index
from common.errors import BadRequest, PreconditionFailed

CF_SECURITY = "security"
SECURITY_CFS = (CF_SECURITY,)
_KEY = b"document"
_VERSION = struct.Struct(">Q")
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


class SecurityStore:
    def __init__(self, index: Index) -> None:
        self._index = index
        self._cf = index.cf(CF_SECURITY)
        raw = self._cf.get(_KEY)
        if raw is None:
            self.version, self.data = 0, b""
        else:
            (self.version,) = _VERSION.unpack_from(raw)
            self.data = bytes(raw[_VERSION.size :])

    def put(self, version: int, data: bytes) -> None:
        if len(data) > MAX_DOCUMENT_BYTES:
            raise BadRequest(f"the security document is {len(data)} bytes; at most {MAX_DOCUMENT_BYTES} are kept")
        if version <= self.version:
            raise PreconditionFailed(
                f"the security document changed meanwhile (this broker holds version {self.version}, "
                f"the write was version {version}); run the command again"
            )
        batch = self._index.batch()
        batch.put(_KEY, _VERSION.pack(version) + data, self._index.handle(CF_SECURITY))
        self._index.write(batch)
        self.version, self.data = version, data
