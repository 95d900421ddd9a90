"""What a broker keeps about lite topics, in RocksDB (layouts: broker/lite/keys.py).

Nothing here holds a Python object per lite topic: a lite topic is a handful of RocksDB keys. In
memory are a bounded cache of recently written lite topics (name -> queue id and the last write
recorded), and per bind topic its next lite number and live count. Single-writer: the broker's
event loop thread calls everything here (each call is a few RocksDB gets and one WriteBatch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from broker.lite import keys as K
from broker.store.index import Index
from common.logs import kv

log = logging.getLogger("sluice.broker.lite")
_MIGRATE_CHUNK = 10_000  # expiry keys per WriteBatch of a layout migration


@dataclass(slots=True)
class LiteRecord:
    queue_id: int
    created_ms: int
    last_write_ms: int


class _Recent:
    """The records of lite topics used lately, per bind topic, in two generations of `size` each
    (so the `size` most recently used are always held, and never more than twice that): a hit in the
    current one is one dict lookup (an LRU's relinking on every hit cost a send ~1 us per message
    at 100,000 lite topics); a hit in the previous one moves the record to the current one; a full
    current generation becomes the previous one, and what the previous one held and nobody used
    since is forgotten."""

    def __init__(self, size: int) -> None:
        self._size = max(1, size)
        self._new: dict[int, dict[str, LiteRecord]] = {}
        self._old: dict[int, dict[str, LiteRecord]] = {}
        self._count = 0  # records in `_new`

    def get_many(self, topic_id: int, names: list[str]) -> tuple[dict[str, LiteRecord], list[str]]:
        """(records found, names not held)."""
        new = self._new.get(topic_id)
        if new is not None:
            try:  # the hot path: every one in the current generation
                return {name: new[name] for name in names}, []
            except KeyError:
                pass
        old = self._old.get(topic_id, {})
        out: dict[str, LiteRecord] = {}
        missing: list[str] = []
        for name in names:
            rec = new.get(name) if new is not None else None
            if rec is None:
                rec = old.get(name)
                if rec is None:
                    missing.append(name)
                    continue
                self.put(topic_id, name, rec)
            out[name] = rec
        return out, missing

    def put(self, topic_id: int, name: str, rec: LiteRecord) -> None:
        if self._count >= self._size:
            self._old, self._new, self._count = self._new, {}, 0
        held = self._new.setdefault(topic_id, {})
        if name not in held:
            self._count += 1
        held[name] = rec

    def pop(self, topic_id: int, name: str) -> None:
        for generation in (self._new, self._old):
            held = generation.get(topic_id)
            if held is not None and held.pop(name, None) is not None and generation is self._new:
                self._count -= 1


class LiteState:
    def __init__(self, index: Index, cache_size: int) -> None:
        self._index = index
        # Column families are looked up on the index at each use, never held here: RocksDB keeps
        # its lock while any handle is alive, and the store must reopen after a close.
        self._cache = _Recent(cache_size)
        self._meta: dict[int, list[int]] = {}  # topic_id -> [next lite number, live lite topics]
        self.migrate_v1()
        for key, value in self._index.cf(K.CF_LITE_META).items():
            self._meta[K.U32.unpack(key)[0]] = list(K.META.unpack(value))

    def migrate_v1(self) -> int:
        """Move a store of the first lite layout (keys.py: `CF_LITE_ID_V1`) to this one: each old
        expiry key (expires, topic id, queue id) becomes (expires, topic id, name), its name taken
        from the old id -> name row, then the old column family is dropped. Each chunk deletes the
        id rows it used with the keys it moved, so a migration cut short resumes where it
        stopped. How many expiry keys moved."""
        index = self._index
        if K.CF_LITE_ID_V1 not in index.unused_cfs:
            return 0
        ids = index.cf(K.CF_LITE_ID_V1)
        h_exp, h_id = index.handle(K.CF_LITE_EXP), index.handle(K.CF_LITE_ID_V1)
        old = [key for key, _ in index.cf(K.CF_LITE_EXP).items() if len(key) == K.EXP_V1.size]
        moved = 0
        for at in range(0, len(old), _MIGRATE_CHUNK):
            chunk = old[at : at + _MIGRATE_CHUNK]
            id_keys = [K.ID_V1.pack(*K.EXP_V1.unpack(key)[1:]) for key in chunk]
            batch = index.batch()
            for key, id_key, name in zip(chunk, id_keys, ids.get(id_keys), strict=True):
                if name is None:  # a new-layout key whose name is 4 bytes long
                    continue
                batch.delete(key, h_exp)
                batch.put(key[: K.EXP_HEAD.size] + name, b"", h_exp)
                batch.delete(id_key, h_id)
                moved += 1
            index.write(batch)
        index.drop_cf(K.CF_LITE_ID_V1)
        log.info("lite topics migrated to the two-row layout", extra=kv(expiry_keys=moved))
        return moved

    # -- bind topics -----------------------------------------------------------------------------

    def topic_id(self, topic: str, *, create: bool) -> int | None:
        tid = self._index.topic_id(topic)
        if tid is None and create:
            batch = self._index.batch()
            tid = self._index.intern_topic(topic, batch)
            self._index.write(batch)
        return tid

    def count(self, topic_id: int) -> int:
        meta = self._meta.get(topic_id)
        return meta[1] if meta is not None else 0

    # -- lite topics -----------------------------------------------------------------------------

    def get(self, topic_id: int, name: str) -> LiteRecord | None:
        return self.get_many(topic_id, [name]).get(name)

    def get_many(self, topic_id: int, names: list[str]) -> dict[str, LiteRecord]:
        """The records of the lite topics `names` that exist: the cache, then one multi-get for the
        others."""
        out, missing = self._cache.get_many(topic_id, names)
        if missing:
            raws = self._index.cf(K.CF_LITE_NAME).get([K.name_key(topic_id, name) for name in missing])
            for name, raw in zip(missing, raws, strict=True):
                if raw is not None:
                    out[name] = rec = LiteRecord(*K.RECORD.unpack(raw))
                    self._cache.put(topic_id, name, rec)
        return out

    def create_many(self, topic_id: int, names: list[str], now_ms: int, expires_ms: int) -> dict[str, LiteRecord]:
        """New lite topics, in one WriteBatch (the caller checked they do not exist, and the quota)."""
        meta = self._meta.setdefault(topic_id, [0, 0])
        first = K.LITE_QUEUE_BASE + meta[0]
        if first + len(names) - 1 > K.MAX_LITE_QUEUE:
            raise OverflowError("lite topic numbers of this bind topic are exhausted")
        batch = self._index.batch()
        h_name, h_exp = self._index.handle(K.CF_LITE_NAME), self._index.handle(K.CF_LITE_EXP)
        value_tail = K.RECORD.pack(0, now_ms, now_ms)[4:]
        tid_raw, exp_head = K.U32.pack(topic_id), K.EXP_HEAD.pack(expires_ms, topic_id)
        out: dict[str, LiteRecord] = {}
        for qid, name in enumerate(names, first):
            raw = name.encode()
            batch.put(tid_raw + raw, K.U32.pack(qid) + value_tail, h_name)
            batch.put(exp_head + raw, b"", h_exp)
            out[name] = LiteRecord(qid, now_ms, now_ms)
        batch.put(K.U32.pack(topic_id), K.META.pack(meta[0] + len(names), meta[1] + len(names)),
                  self._index.handle(K.CF_LITE_META))  # fmt: skip
        self._index.write(batch)
        meta[0] += len(names)
        meta[1] += len(names)
        for name, rec in out.items():
            self._cache.put(topic_id, name, rec)
        return out

    def touch(self, topic_id: int, stale: list[tuple[str, LiteRecord]], now_ms: int, expiration_ms: int) -> None:
        """Record a write at `now_ms` to the lite topics `stale` (name, record), in one WriteBatch:
        moves their expiry (the caller passes only lite topics whose recorded last write is older
        than its granularity, so a hot lite topic costs one update per granule, not per message)."""
        batch = self._index.batch()
        h_exp, h_name = self._index.handle(K.CF_LITE_EXP), self._index.handle(K.CF_LITE_NAME)
        for name, rec in stale:
            batch.delete(K.exp_key(rec.last_write_ms + expiration_ms, topic_id, name), h_exp)
            batch.put(K.exp_key(now_ms + expiration_ms, topic_id, name), b"", h_exp)
            batch.put(K.name_key(topic_id, name), K.RECORD.pack(rec.queue_id, rec.created_ms, now_ms), h_name)
        self._index.write(batch)
        for _, rec in stale:
            rec.last_write_ms = now_ms

    def due(self, now_ms: int, limit: int) -> list[tuple[int, int, str]]:
        """(expires_ms, topic_id, lite name) of up to `limit` lite topics expired at `now_ms`, oldest
        first: a range scan of the expiry index from its start, never a scan of all lite topics."""
        out: list[tuple[int, int, str]] = []
        for key, _ in self._index.cf(K.CF_LITE_EXP).items():
            expires, tid, name = K.parse_exp_key(key)
            if expires > now_ms or len(out) >= limit:
                break
            out.append((expires, tid, name))
        return out

    def remove(self, topic_id: int, name: str, rec: LiteRecord, expires_ms: int) -> None:
        """Delete a lite topic: its records, its ConsumeQueue, its subscriptions (the caller
        collected the subscribers first)."""
        batch = self._index.batch()
        qid = rec.queue_id
        batch.delete(K.name_key(topic_id, name), self._index.handle(K.CF_LITE_NAME))
        batch.delete(K.exp_key(expires_ms, topic_id, name), self._index.handle(K.CF_LITE_EXP))
        self._index.delete_cq_below(batch, topic_id, qid, 1 << 62)
        prefix = K.subr_prefix(topic_id, name)
        for group, client in self.subscribers(topic_id, name):
            batch.delete(K.sub_key(group, topic_id, client, name), self._index.handle(K.CF_LITE_SUB))
        batch.delete_range(prefix, K.next_prefix(prefix), self._index.handle(K.CF_LITE_SUBR))
        meta = self._meta.setdefault(topic_id, [0, 1])
        meta[1] = max(0, meta[1] - 1)
        batch.put(K.U32.pack(topic_id), K.META.pack(*meta), self._index.handle(K.CF_LITE_META))
        self._index.write(batch)
        self._cache.pop(topic_id, name)

    def drop_expiry_key(self, expires_ms: int, topic_id: int, name: str) -> None:
        batch = self._index.batch()  # a batch, so that a replicated primary records it
        batch.delete(K.exp_key(expires_ms, topic_id, name), self._index.handle(K.CF_LITE_EXP))
        self._index.write(batch)

    def lite_topics(self, topic_id: int) -> Iterator[tuple[str, LiteRecord]]:
        """Every lite topic of a bind topic (admin listings only: a scan of that bind topic)."""
        prefix = K.U32.pack(topic_id)
        for key, value in self._index.cf(K.CF_LITE_NAME).items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key[4:].decode(), LiteRecord(*K.RECORD.unpack(value))

    # -- subscriptions ---------------------------------------------------------------------------

    def subscriptions(self, group: str, topic_id: int, client_id: str) -> set[str]:
        prefix = K.client_prefix(group, topic_id, client_id)
        out = set()
        for key, _ in self._index.cf(K.CF_LITE_SUB).items(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.add(key[len(prefix) :].decode())
        return out

    def subscribers(self, topic_id: int, name: str) -> list[tuple[str, str]]:
        """(group, client id) of every subscription to one lite topic."""
        prefix = K.subr_prefix(topic_id, name)
        out = []
        for key, _ in self._index.cf(K.CF_LITE_SUBR).items(from_key=prefix):
            if not key.startswith(prefix):
                break
            out.append(K.parse_subr_tail(key, len(prefix)))
        return out

    def all_filters(self) -> Iterator[tuple[str, int, str, str]]:
        """(group, topic_id, client id, filter) of every filter subscription (read once, at start)."""
        for key, _ in self._index.cf(K.CF_LITE_FILT).items():
            yield K.parse_filt_key(key)

    def change_filters(self, group: str, topic_id: int, client_id: str, added: set[str], removed: set[str]) -> None:
        batch = self._index.batch()
        handle = self._index.handle(K.CF_LITE_FILT)
        for text in added:
            batch.put(K.sub_key(group, topic_id, client_id, text), b"", handle)
        for text in removed:
            batch.delete(K.sub_key(group, topic_id, client_id, text), handle)
        self._index.write(batch)

    def change_subscriptions(
        self, group: str, topic_id: int, client_id: str, added: set[str], removed: set[str]
    ) -> None:
        batch = self._index.batch()
        h_sub, h_subr = self._index.handle(K.CF_LITE_SUB), self._index.handle(K.CF_LITE_SUBR)
        for name in added:
            batch.put(K.sub_key(group, topic_id, client_id, name), b"", h_sub)
            batch.put(K.subr_key(topic_id, name, group, client_id), b"", h_subr)
        for name in removed:
            batch.delete(K.sub_key(group, topic_id, client_id, name), h_sub)
            batch.delete(K.subr_key(topic_id, name, group, client_id), h_subr)
        self._index.write(batch)
