"""`TransactionService`: half messages, their resolution, and the bookkeeping of check-backs.

A TRANSACTION send appends the message once to the CommitLog under the system topic `HALF_TOPIC`
(never registered as a topic, so no consumer can read it) and records a pending entry
(pending.py). The transaction id names the half message's position (txid.py).

- COMMIT marks the entry COMMITTING, appends a copy to the message's real topic and queue (same
  message id, type TRANSACTION, system property `TXN_ID`), then deletes the entry. A crash in
  between is finished at startup: the copy is appended unless the topic's message-id index
  already holds one carrying this transaction id, so a commit is visible exactly once.
- ROLLBACK deletes the entry; the half message stays in the CommitLog until retention.
- Check-backs: `claim` hands out due entries of the topics a proxy has producers for and moves
  each to its next check; after `max_checks` handed-out checks, an entry still pending one check
  interval later is rolled back by `sweep` and logged.

Everything here runs on the broker's event loop (RocksDB writes inline, like the pop state).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from broker.client import txid
from broker.client.api import (
    SendResult,
    StoredMessage,
    TransactionCheck,
    TransactionResolution,
    TransactionSource,
)
from broker.config import TransactionConfig
from broker.store.store import MessageStore
from broker.transaction.pending import HalfEntry, HalfState, PendingTable
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import (
    InvalidTransactionId,
    MessageCorrupted,
    OffsetNotFound,
    SluiceError,
    TooManyRequests,
)
from common.logs import kv
from common.model import MessageType
from common.record import SYSPROP_TX_RECOVERY_MS, SYSPROP_TXN_ID, SYSPROP_TXN_TOPIC, MessageRecord, copy_to_store

log = logging.getLogger("sluice.broker.transaction")

HALF_TOPIC = "%TXN_HALF%"


class TransactionService:
    def __init__(
        self,
        broker_name: str,
        store: MessageStore,
        config: TransactionConfig,
        store_host: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`clock`: check-back times are read on it (common/clock.py)."""
        self._broker = broker_name
        self._clock = clock
        self._store = store
        self._config = config
        self._host = store_host
        self.pending = PendingTable(store.index, config.max_checks)
        # One lock per transaction being ended, with the number of callers holding or awaiting it.
        self._locks: dict[int, tuple[asyncio.Lock, int]] = {}

    async def start(self) -> None:
        """Load the pending entries and finish commits a crash interrupted."""
        for entry in self.pending.load():
            if self._outlived(entry):
                continue
            try:
                await self._finish_commit(entry)
            except SluiceError as exc:  # logged by _load_half; the broker must still start
                log.error("interrupted commit could not be finished", extra=kv(error=exc.message))
        log.info("transactions loaded", extra=kv(pending=len(self.pending)))

    # -- half messages ---------------------------------------------------------------------------

    def _recovery_ms(self, msg: MessageRecord) -> int:
        raw = msg.system_properties.get(SYSPROP_TX_RECOVERY_MS, "")
        wanted = int(raw) if raw.isdigit() else self._config.default_recovery_ms
        return min(max(wanted, self._config.min_recovery_ms), self._config.max_recovery_ms)

    async def prepare(self, topic: str, queue_id: int, messages: list[MessageRecord]) -> list[SendResult]:
        """Store TRANSACTION messages as half messages; their send results carry the transaction ids."""
        if len(self.pending) + len(messages) > self._config.max_pending:
            raise TooManyRequests(
                f"broker {self._broker} holds {len(self.pending)} unresolved transactions (limit "
                f"{self._config.max_pending}); commit or roll back transactions, then retry"
            )
        records = []
        for m in messages:
            sysprops = {**m.system_properties, SYSPROP_TXN_TOPIC: topic}
            rec = dataclasses.replace(m, topic=HALF_TOPIC, queue_id=0, system_properties=sysprops, edge=b"")
            records.append(rec)
        appended = await self._store.append(records)
        now = self._clock.now_ms()
        entries = [
            HalfEntry(position=r.physical_offset, size=r.size, topic=topic, queue_id=queue_id, message_id=m.message_id,
                      created_ms=now, next_check_ms=now + self._recovery_ms(m))
            for m, r in zip(messages, appended, strict=True)
        ]  # fmt: skip
        self.pending.put_many(entries)
        return [
            SendResult(m.message_id, queue_id, r.queue_offset, transaction_id=self._txid(e))
            for m, r, e in zip(messages, appended, entries, strict=True)
        ]

    def drop_topic(self, topic: str, before: int) -> int:
        """Roll back the transactions of `topic` whose half message was stored before CommitLog
        position `before` (the topic's deletion: store.deletion); how many."""
        stale = [e for e in self.pending.entries.values() if e.topic == topic and e.position < before]
        for entry in stale:
            self.pending.delete(entry)
        if stale:
            log.info("transactions of a deleted topic rolled back", extra=kv(topic=topic, transactions=len(stale)))
        return len(stale)

    def _outlived(self, entry: HalfEntry) -> bool:
        """Whether the entry's topic was deleted after its half message was stored; then it is
        rolled back (a half message that raced the deletion's `drop_topic`)."""
        if entry.position > self._store.deleted_at(entry.topic):
            return False
        self.pending.delete(entry)
        fields = kv(transaction_id=self._txid(entry), topic=entry.topic, message_id=entry.message_id)
        log.info("transaction of a deleted topic rolled back", extra=fields)
        return True

    def _txid(self, entry: HalfEntry) -> str:
        return txid.TransactionId(self._broker, entry.position, entry.size).encode()

    # -- resolution ------------------------------------------------------------------------------

    async def end(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution,
        source: TransactionSource,
    ) -> None:  # fmt: skip
        tid = txid.decode(transaction_id)
        if tid.broker != self._broker:
            raise InvalidTransactionId(
                f"transaction {transaction_id} belongs to broker {tid.broker}, not {self._broker}"
            )
        key = tid.physical_offset
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                await self._end_locked(tid, topic, message_id, transaction_id, resolution, source)
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    async def _end_locked(
        self, tid: txid.TransactionId, topic: str, message_id: str, transaction_id: str,
        resolution: TransactionResolution, source: TransactionSource,
    ) -> None:  # fmt: skip
        entry = self.pending.get(tid.physical_offset)
        if entry is not None and (entry.size != tid.size or entry.topic != topic or entry.message_id != message_id):
            raise InvalidTransactionId(
                f"transaction {transaction_id} was issued for message {entry.message_id} of topic {entry.topic}, "
                f"not for message {message_id} of topic {topic}"
            )
        if entry is None or self._outlived(entry):
            self._already_ended(tid, topic, message_id, transaction_id, resolution)
            return
        fields = kv(transaction_id=transaction_id, topic=topic, message_id=message_id, source=source.name,
                    checks=entry.checks)  # fmt: skip
        if resolution is TransactionResolution.UNSPECIFIED:
            log.info("transaction still undecided; it will be checked again", extra=fields)
        elif resolution is TransactionResolution.ROLLBACK:
            if entry.state is HalfState.COMMITTING:
                raise InvalidTransactionId(f"transaction {transaction_id} cannot be rolled back: it is being committed")
            self.pending.delete(entry)
            log.info("transaction rolled back", extra=fields)
        else:
            retry = entry.state is HalfState.COMMITTING  # an earlier attempt failed midway
            entry.state = HalfState.COMMITTING
            self.pending.update(entry)
            await self._finish_commit(entry, look_for_copy=retry)
            log.info("transaction committed", extra=fields)

    def _already_ended(
        self, tid: txid.TransactionId, topic: str, message_id: str, transaction_id: str,
        resolution: TransactionResolution,
    ) -> None:  # fmt: skip
        """A repeated EndTransaction is OK when it agrees with what happened; else say what did."""
        committed = self._committed_copy(topic, message_id, transaction_id) is not None
        if resolution is TransactionResolution.COMMIT and not committed:
            if tid.physical_offset < self._store.deleted_at(topic):
                raise InvalidTransactionId(
                    f"transaction {transaction_id} cannot be committed: topic {topic} was deleted after its half "
                    "message was stored, and the half message with it (a topic of that name now is a new one)"
                )
            raise InvalidTransactionId(
                f"transaction {transaction_id} cannot be committed: it is not pending (it was rolled back, by its "
                f"producer or after {self._config.max_checks} unanswered check-backs, or it never existed)"
            )
        if resolution is TransactionResolution.ROLLBACK and committed:
            raise InvalidTransactionId(f"transaction {transaction_id} cannot be rolled back: it was committed")

    def _committed_copy(self, topic: str, message_id: str, transaction_id: str) -> MessageRecord | None:
        for rec in self._store.find_by_id(message_id, topic):
            if rec.system_properties.get(SYSPROP_TXN_ID) == transaction_id:
                return rec
        return None

    def _load_half(self, entry: HalfEntry) -> MessageRecord | None:
        try:
            return self._store.read_at(entry.position, entry.size)
        except (OffsetNotFound, MessageCorrupted) as exc:
            log.error("half message is no longer readable; its transaction is rolled back",
                      extra=kv(topic=entry.topic, message_id=entry.message_id, position=entry.position,
                               error=str(exc)))  # fmt: skip
            self.pending.delete(entry)
            return None

    async def _finish_commit(self, entry: HalfEntry, *, look_for_copy: bool = True) -> None:
        """Append the committed copy (unless an interrupted attempt left one) and drop the entry.

        `look_for_copy=False` only for an entry that was PENDING until now: no copy can exist.
        """
        transaction_id = self._txid(entry)
        if not look_for_copy or self._committed_copy(entry.topic, entry.message_id, transaction_id) is None:
            half = self._load_half(entry)
            if half is None:
                raise InvalidTransactionId(
                    f"transaction {transaction_id} cannot be committed: its half message was removed by retention"
                )
            await self._store.append([self._committed(half, entry, transaction_id)])
        self.pending.delete(entry)

    @staticmethod
    def _committed(half: MessageRecord, entry: HalfEntry, transaction_id: str) -> MessageRecord:
        sysprops = {k: v for k, v in half.system_properties.items() if k != SYSPROP_TXN_TOPIC}
        sysprops[SYSPROP_TXN_ID] = transaction_id
        return copy_to_store(
            half,
            entry.topic,
            entry.queue_id,
            sysprops,
            message_type=int(MessageType.TRANSACTION),
            delivery_timestamp_ms=0,
        )

    # -- check-backs -----------------------------------------------------------------------------

    def claim(self, topics: list[str], limit: int, now_ms: int | None = None) -> list[TransactionCheck]:
        """Hand out up to `limit` due check-backs of `topics`; each counts as made."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        out: list[TransactionCheck] = []
        for topic in topics:
            for entry in self.pending.due(topic, now):
                if len(out) >= limit:
                    self.pending.requeue(entry)
                    return out
                if self._outlived(entry):
                    continue
                half = self._load_half(entry)
                if half is None:
                    continue
                entry.checks += 1
                entry.next_check_ms = now + self._config.check_interval_ms
                self.pending.update(entry)
                out.append(TransactionCheck(self._txid(entry), self._as_delivered(half, entry), entry.checks))
        return out

    def _as_delivered(self, half: MessageRecord, entry: HalfEntry) -> StoredMessage:
        """The half message as its producer sent it: its real topic and queue, no half-topic property."""
        sysprops = {k: v for k, v in half.system_properties.items() if k != SYSPROP_TXN_TOPIC}
        rec = dataclasses.replace(
            half, topic=entry.topic, queue_id=entry.queue_id, message_type=int(MessageType.TRANSACTION),
            system_properties=sysprops, raw=b"",
        )  # fmt: skip
        return StoredMessage(rec, max(entry.checks, 1), store_host=self._host)

    def sweep(self, now_ms: int | None = None) -> int:
        """Roll back half messages whose last check-back went unanswered; returns how many."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        n = 0
        for entry in self.pending.unanswered(now):
            self.pending.delete(entry)
            n += 1
            log.warning("transaction rolled back: no producer resolved it",
                        extra=kv(transaction_id=self._txid(entry), topic=entry.topic, message_id=entry.message_id,
                                 checks=entry.checks, age_ms=now - entry.created_ms))  # fmt: skip
        return n

    # -- observability ---------------------------------------------------------------------------

    def backlog(self, topic: str | None = None) -> int:
        """Half messages awaiting resolution (of one topic, or all)."""
        return len(self.pending) if topic is None else self.pending.per_topic.get(topic, 0)
