"""The MQTT gateway's durable state: a key-value store the broker keeps without interpreting it.

Sessions, QoS 2 packet identifiers and retained messages (docs/mqtt.md, "Durable state") are small
records the gateway encodes (proxy/mqtt/state.py) under keys of its own. The home broker (the first
by name) keeps them in the column family `mqtt`; writes go through `Index.batch()` /
`Index.write()`, so a replicated primary records them as state changes and the broker answers once
the in-sync replicas hold them (docs/replication.md). A write is atomic (one WriteBatch) and may
carry expectations (compare-and-set): a key's value as the writer read it, or its absence; a write
whose expectations do not hold changes nothing (PreconditionFailed). Event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.store.index import Index
from common.errors import BadRequest, PreconditionFailed

CF_MQTT = "mqtt"
MQTT_CFS = (CF_MQTT,)
MAX_KEY_BYTES = 70_000  # a namespace, a client id or topic (65,535 bytes at most) and a prefix
MAX_VALUE_BYTES = 64 * 1024 * 1024  # a retained message's record
MAX_WRITE_ENTRIES = 10_000
MAX_SCAN_ENTRIES = 10_000
MAX_SCAN_BYTES = 8 * 1024 * 1024  # a page of a scan stops past this many bytes (one entry at least)


class MqttStateStore:
    def __init__(self, index: Index) -> None:
        self._index = index

    def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if len(keys) > MAX_WRITE_ENTRIES:
            raise BadRequest(f"{len(keys)} keys in one read; at most {MAX_WRITE_ENTRIES}")
        if not keys:
            return []
        return [None if v is None else bytes(v) for v in self._index.cf(CF_MQTT).get(list(keys))]

    def write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes],
              expect: Sequence[tuple[bytes, bytes | None]] = ()) -> None:  # fmt: skip
        """Put and delete at once, if every (key, value) of `expect` holds (None: the key is absent)."""
        if len(puts) + len(deletes) + len(expect) > MAX_WRITE_ENTRIES:
            raise BadRequest(f"a write of {len(puts) + len(deletes)} entries; at most {MAX_WRITE_ENTRIES}")
        for key, value in puts:
            if not key or len(key) > MAX_KEY_BYTES or len(value) > MAX_VALUE_BYTES:
                raise BadRequest(f"an MQTT state entry of a {len(key)}-byte key and a {len(value)}-byte value; keys "
                                 f"hold 1-{MAX_KEY_BYTES} bytes, values at most {MAX_VALUE_BYTES}")  # fmt: skip
        if expect:
            held = self.get([key for key, _ in expect])
            for (key, wanted), found in zip(expect, held, strict=True):
                if found != wanted:
                    raise PreconditionFailed(f"MQTT state {key[:64]!r} changed meanwhile; read it again and retry")
        batch = self._index.batch()
        handle = self._index.handle(CF_MQTT)
        for key in deletes:
            batch.delete(key, handle)
        for key, value in puts:
            batch.put(key, value, handle)
        self._index.write(batch)

    def scan(self, prefix: bytes, after: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Entries whose key starts with `prefix`, in key order, after the key `after` (b"": from
        the first); at most `limit` of them and about MAX_SCAN_BYTES."""
        if not 0 < limit <= MAX_SCAN_ENTRIES:
            raise BadRequest(f"a scan of {limit} entries; 1-{MAX_SCAN_ENTRIES}")
        out: list[tuple[bytes, bytes]] = []
        size = 0
        start = after + b"\x00" if after else prefix
        for key, value in self._index.cf(CF_MQTT).items(from_key=start):
            if not key.startswith(prefix) or len(out) >= limit or (out and size >= MAX_SCAN_BYTES):
                break
            out.append((bytes(key), bytes(value)))
            size += len(key) + len(value)
        return out
