"""Pop consumption state of one broker, in RocksDB, with in-memory counters rebuilt at startup.

Per (consumer group, topic, queue):

* `pop_cursor` -> u64: the next offset never yet handed to the group. Everything below it was
  either delivered or skipped by the group's filter.
* `pop_msg` (group, topic, queue, offset) -> entry: a message delivered and not yet done
  (INFLIGHT), or, for FIFO groups, held back behind an earlier message of its message group
  (WAITING). Acknowledged and dead-lettered messages have no entry. So the group's consumed offset
  (everything below is done) is the smallest entry's offset, or the cursor when there is none.
* `pop_due` (group, invisible_until_ms, topic, queue, offset) -> b"": one key per INFLIGHT entry,
  ordered by deadline, so "what is visible again" is a range scan up to now.

Keys are length-prefixed UTF-8 names and big-endian numbers (byte order = numeric order):
  queue key = u16 len + group, u16 len + topic, u32 queue_id
  pop_msg key = queue key + u64 offset
  pop_due key = u16 len + group, u64 invisible_until_ms, u16 len + topic, u32 queue_id, u64 offset
  entry value = u8 state, u32 delivery attempt, u32 handle version, u64 invisible_until_ms,
                u16 len + message group

The handle version of a new entry's first delivery is 1, or, on a replicated primary, derived from
its epoch (`first_version`); it grows by one (wrapping) on every redelivery and invisible-duration change,
within the versions of the primary's term (`next_version_in_term`): an entry an earlier term versioned
starts over at the term's first version, so two terms never hand out one version for one entry.

Every change to a group's state is one WriteBatch (`PopBatch.commit`), and memory follows only after
the batch is written, so a crash leaves either the old or the new state, never a mix.
Single-writer: all mutations run on the broker's event loop thread.

**FIFO lanes on a replicated primary.** A message group's next message is handed out only once the
change that settled the one before it (its ack, its dead letter) is held by every in-sync member
(`acked_state`, the store's durability: broker/store/durability.py), as an ack answered OK is. The
batch that removes a group's in-flight entry marks its lane `settling` with the number of the state
change it recorded (`Index.write`); the lane stays closed until `acked_state()` reaches it
(`release_settled`). Otherwise a failover or a partition could undo an ack the next message was
released on (an ack applied here and refused HA_NOT_AVAILABLE, or still waiting for the replicas):
the earlier message would come back after the later one was delivered. For the same reason a new
primary's lanes hand out nothing until every in-sync member holds the state its term began with
(`fifo_open`). A broker outside a replicated group records no change numbers, so its lanes never
wait.

**Lite topics** are ordered as a whole (docs/lite-topics.md: a lite topic's next message goes out
once the one before it is done), so each is one lane, `WHOLE_QUEUE`, that waits the same way: the
batch that removes an in-flight entry of a lite topic's queue (`lite_topic` says which topics are
bind topics) marks that lane `settling`, and the lite pop hands out nothing of it until
`release_settled` opened it (broker/lite/service.py). Only the settling mark lives in that lane: the
lite topic's in-flight count is `inflight`, as for any queue.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

import rocksdict

from broker.lite.keys import LITE_QUEUE_BASE
from broker.store.index import Index
from broker.store.keys import next_prefix

CF_POP_CURSOR = "pop_cursor"
CF_POP_MSG = "pop_msg"
CF_POP_DUE = "pop_due"
POP_CFS = (CF_POP_CURSOR, CF_POP_MSG, CF_POP_DUE)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ENTRY = struct.Struct("<BIIQH")
_QO = struct.Struct(">IQ")  # queue id, offset: how every pop_msg and pop_due key ends
QueueKey = tuple[str, str, int]  # group, topic, queue id
_NO_DEADLINE = (1 << 64) - 1


# The lane of a queue whose messages go out one at a time whatever their message group (a lite topic).
WHOLE_QUEUE = ""

_VERSION_MASK = (1 << 32) - 1  # versions are u32 and wrap
TERM_VERSION_SHIFT = 16  # a replicated primary's term owns 2**16 versions of every entry it creates


def first_version(term: int) -> int:
    """The version of an entry's first delivery when a primary of `term` creates it (0: a broker
    outside a replicated group, version 1). Per term, so that a receipt handle an earlier primary
    issued for a queue offset a successor reused (the earlier primary's message there never reached
    it: it dispatched before the replicas held it) names a version the successor's entry lacks."""
    return ((term << TERM_VERSION_SHIFT) + 1) & _VERSION_MASK


def next_version(version: int) -> int:
    return (version + 1) & _VERSION_MASK


def next_version_in_term(version: int, term: int) -> int:
    """The version after `version` when a primary of `term` changes the entry (0: `next_version`).
    An entry it did not version itself (one an earlier term created or changed, which came through
    the replication stream) jumps to `first_version(term)`: a deposed primary changing the same
    entry after waking from a pause bumps it within its own term's range, so the two terms'
    handles for one stored copy never carry the same version."""
    following = (version + 1) & _VERSION_MASK
    if not term:
        return following
    own = first_version(term) >> TERM_VERSION_SHIFT
    if following >> TERM_VERSION_SHIFT == own and following & ((1 << TERM_VERSION_SHIFT) - 1):
        return following
    return first_version(term)


class EntryState(IntEnum):
    INFLIGHT = 1
    WAITING = 2


@dataclass(slots=True)
class PopEntry:
    state: EntryState
    attempt: int  # deliveries made so far
    version: int  # changes on every delivery and invisible-duration change
    invisible_until_ms: int
    message_group: str = ""

    def encode(self) -> bytes:
        mg = self.message_group.encode()
        return _ENTRY.pack(self.state, self.attempt, self.version, self.invisible_until_ms, len(mg)) + mg

    @classmethod
    def decode(cls, raw: bytes) -> PopEntry:
        state, attempt, version, until, n = _ENTRY.unpack_from(raw)
        mg = raw[_ENTRY.size : _ENTRY.size + n].decode() if n else ""
        return cls(_STATES[state], attempt, version, until, mg)


_STATES = {s.value: s for s in EntryState}  # a dict lookup costs less than EntryState(value)


def _within(prefix: bytes) -> rocksdict.ReadOptions:
    """Read options for a scan of the keys starting with `prefix`: RocksDB stops at its end. Without
    the bound, a seek into a range with no live key steps over every deleted key after it, the
    tombstones of other groups' acknowledged messages included, until it meets a live one: after a
    group had acknowledged 100,000 messages, each pop of a group ordered before it with nothing in
    flight spent ~20 ms there (lite_bench.py's priority phase: 1,700 against 13,000 msg/s).

    The caller holds the options in a variable for as long as it iterates: rocksdict's iterator
    does not keep them alive, and a bound freed under a live iterator reads as garbage (scans came
    back empty)."""
    opts = rocksdict.ReadOptions()
    opts.set_iterate_upper_bound(next_prefix(prefix))
    return opts


@functools.lru_cache(maxsize=4096)
def _name(text: str) -> bytes:
    # Cached: every key of a pop or an ack starts with the same group and topic names, several
    # keys per message (entry, deadline, cursor), and encoding them again costs more than a lookup.
    b = text.encode("utf-8")
    return _U16.pack(len(b)) + b


def _read_name(raw: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(raw, pos)
    return raw[pos + 2 : pos + 2 + n].decode("utf-8"), pos + 2 + n


def queue_key(group: str, topic: str, queue_id: int) -> bytes:
    return _name(group) + _name(topic) + _U32.pack(queue_id)


def msg_key(group: str, topic: str, queue_id: int, offset: int) -> bytes:
    return _name(group) + _name(topic) + _QO.pack(queue_id, offset)


def _due_key(group_name: bytes, until_ms: int, topic_name: bytes, queue_offset: bytes) -> bytes:
    """The due key from its encoded parts (`_name` of group and topic, `_QO` of queue and offset), which
    PopBatch builds once per entry for its msg key too."""
    return group_name + _U64.pack(until_ms) + topic_name + queue_offset


def parse_msg_key(raw: bytes) -> tuple[str, str, int, int]:
    group, pos = _read_name(raw, 0)
    topic, pos = _read_name(raw, pos)
    return group, topic, _U32.unpack_from(raw, pos)[0], _U64.unpack_from(raw, pos + 4)[0]


def parse_due_key(raw: bytes) -> tuple[str, int, str, int, int]:
    group, pos = _read_name(raw, 0)
    until = _U64.unpack_from(raw, pos)[0]
    topic, pos = _read_name(raw, pos + 8)
    return group, until, topic, _U32.unpack_from(raw, pos)[0], _U64.unpack_from(raw, pos + 4)[0]


@dataclass(slots=True)
class FifoLane:
    """One message group of a FIFO consumer group in one queue. Its next message may be handed out
    when nothing is `outstanding` and nothing is `settling`."""

    outstanding: int = 0  # INFLIGHT entries (0 or 1 in practice)
    waiting: collections.deque[int] = field(default_factory=collections.deque)  # WAITING offsets, ascending
    # The state change that settled its last in-flight entry, until every in-sync member holds it
    # (`PopState.release_settled`); 0: none pending.
    settling: int = 0

    @property
    def idle(self) -> bool:
        return self.outstanding == 0 and not self.waiting and not self.settling


class PopState:
    def __init__(
        self, index: Index, *, term: int = 0, cursor_cache_size: int = 200_000,
        acked_state: Callable[[], int | None] = lambda: None, lite_topic: Callable[[str], bool] = lambda _: False,
    ) -> None:  # fmt: skip
        """`acked_state`: the latest state change every in-sync member holds (None: every change;
        broker/store/durability.py), which FIFO lanes wait for (see the module doc). `lite_topic`:
        whether a topic is a bind topic, whose lite topics (queues from LITE_QUEUE_BASE) wait so too."""
        self._index = index
        self._acked_state = acked_state
        self._lite_topic = lite_topic
        # Lanes waiting for their settling change to be held, in change order: (change, queue, group).
        # At most one per lane (a settling lane hands out nothing that could settle again).
        self._settling: collections.deque[tuple[int, QueueKey, str]] = collections.deque()
        self._start_held = False  # `fifo_open`: once True, for good
        self._cursor_cache_size = cursor_cache_size
        self._term = term
        self.first_version = first_version(term)  # of entries created here (`first_version`)
        # of WAITING entries created here: their first delivery is `next_version` of it, `first_version`
        self.waiting_version = (self.first_version - 1) & _VERSION_MASK
        self._cursor = index.cf(CF_POP_CURSOR)
        self._msg = index.cf(CF_POP_MSG)
        self._due = index.cf(CF_POP_DUE)
        self.h_cursor = index.handle(CF_POP_CURSOR)
        self.h_msg = index.handle(CF_POP_MSG)
        self.h_due = index.handle(CF_POP_DUE)
        self.inflight: collections.Counter[QueueKey] = collections.Counter()
        self.fifo: dict[QueueKey, dict[str, FifoLane]] = {}
        # group -> every live `pop_due` key of the group has invisible_until_ms >= this (see `due`);
        # a group missing here has no known bound (scans start at its first key).
        self.due_floor: dict[str, int] = {}
        # Cursors `cursors` read or a committed batch set (write-through: every change of a cursor
        # goes through `PopBatch.commit`, `delete_cursor` or `drop_group`). A lite pop reads the
        # cursors of up to 32 lite topics, each a point lookup at a random place of RocksDB otherwise.
        self._cursor_cache: dict[QueueKey, int] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        for key, value in self._msg.items():
            group, topic, qid, offset = parse_msg_key(key)
            entry = PopEntry.decode(value)
            qk = (group, topic, qid)
            if entry.state is EntryState.INFLIGHT:
                self.inflight[qk] += 1
            if entry.message_group:
                lane = self.fifo.setdefault(qk, {}).setdefault(entry.message_group, FifoLane())
                if entry.state is EntryState.INFLIGHT:
                    lane.outstanding += 1
                else:
                    lane.waiting.append(offset)  # keys iterate in offset order per queue

    # -- reads -----------------------------------------------------------------------------------

    def cursor(self, group: str, topic: str, queue_id: int) -> int | None:
        raw = self._cursor.get(queue_key(group, topic, queue_id))
        return None if raw is None else int(_U64.unpack(raw)[0])

    def cursors(self, group: str, topic: str, queue_ids: list[int]) -> list[int | None]:
        """`cursor` of several queues of one topic: from memory, those not there from one multi-get."""
        cache = self._cursor_cache
        out = [cache.get((group, topic, q)) for q in queue_ids]
        missing = [i for i, cursor in enumerate(out) if cursor is None]
        if not missing:
            return out
        prefix = _name(group) + _name(topic)
        pack = _U32.pack
        found: dict[QueueKey, int] = {}
        for i, raw in zip(missing, self._cursor.get([prefix + pack(queue_ids[i]) for i in missing]), strict=True):
            if raw is not None:
                out[i] = found[(group, topic, queue_ids[i])] = int(_U64.unpack(raw)[0])
        self._cache_cursors(found)
        return out

    def _cache_cursors(self, cursors: dict[QueueKey, int]) -> None:
        cache = self._cursor_cache
        if len(cache) + len(cursors) > self._cursor_cache_size:
            cache.clear()
        cache.update(cursors)

    def delete_cursor(self, group: str, topic: str, queue_id: int) -> None:
        """Forget the group's cursor in a queue (a removed lite topic's)."""
        self._cursor_cache.pop((group, topic, queue_id), None)
        with contextlib.suppress(KeyError):
            del self._cursor[queue_key(group, topic, queue_id)]

    def entry(self, group: str, topic: str, queue_id: int, offset: int) -> PopEntry | None:
        raw = self._msg.get(msg_key(group, topic, queue_id, offset))
        return None if raw is None else PopEntry.decode(raw)

    def entries(self, group: str, topic: str, positions: list[tuple[int, int]]) -> list[bytes | None]:
        """The raw entries (see `PopEntry.decode`) at (queue, offset) positions, in one multi-get."""
        prefix = _name(group) + _name(topic)
        return self._msg.get([prefix + _QO.pack(qid, offset) for qid, offset in positions])

    def first_pending_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        prefix = queue_key(group, topic, queue_id)
        within = _within(prefix)
        it = self._msg.iter(within)
        it.seek(prefix)
        if it.valid() and it.key().startswith(prefix):
            return int(_U64.unpack_from(it.key(), len(prefix))[0])
        return None

    def due_offsets(self, group: str, topic: str, queue_id: int, now_ms: int) -> list[int]:
        """The offsets of the queue's in-flight entries whose invisibility ended (due for
        redelivery). Scans the queue's entries only when it has some in flight."""
        if not self.inflight[(group, topic, queue_id)]:
            return []
        prefix = queue_key(group, topic, queue_id)
        out = []
        within = _within(prefix)  # held while iterating (see _within)
        for key, value in self._msg.items(from_key=prefix, read_opt=within):
            if not key.startswith(prefix):
                break
            entry = PopEntry.decode(value)
            if entry.state is EntryState.INFLIGHT and entry.invisible_until_ms <= now_ms:
                out.append(_U64.unpack_from(key, len(key) - 8)[0])
        return out

    def retrying(self, group: str, topic: str, queue_id: int) -> int:
        """Entries of the queue delivered more than once: messages being retried. Scans the
        queue's entries only when it has some (in flight, or waiting behind a FIFO message group),
        so a queue at rest costs nothing."""
        qk = (group, topic, queue_id)
        if not self.inflight[qk] and qk not in self.fifo:
            return 0
        prefix = queue_key(group, topic, queue_id)
        count = 0
        within = _within(prefix)
        for key, value in self._msg.items(from_key=prefix, read_opt=within):
            if not key.startswith(prefix):
                break
            count += PopEntry.decode(value).attempt > 1
        return count

    def due(self, group: str, now_ms: int, limit: int) -> Iterator[tuple[int, str, int, int]]:
        """(invisible_until_ms, topic, queue_id, offset) of INFLIGHT entries of `group` due by now.

        Every ack deletes a `pop_due` key, and until RocksDB compacts them away a seek steps over
        each of those tombstones; seeking from the group's prefix made every pop slower the more had
        been acknowledged. So the scan starts at `due_floor[group]`, a lower bound of the group's
        live deadlines: the first live key a scan meets becomes the floor, and `PopBatch.put`
        lowers it for every new deadline.
        """
        floor = self.due_floor.get(group, 0)
        if floor > now_ms:
            return  # every live deadline of the group is later (a pop's common case: no iterator, no seek)
        prefix = _name(group)
        within = _within(prefix)
        it = self._due.iter(within)
        it.seek(prefix + _U64.pack(floor))
        n = 0
        while it.valid() and n < limit:
            key = it.key()
            if not key.startswith(prefix):
                break
            _, until, topic, qid, offset = parse_due_key(key)
            if n == 0:
                self.due_floor[group] = until  # the smallest live deadline: nothing live below it
            if until > now_ms:
                return
            yield until, topic, qid, offset
            n += 1
            it.next()
        if n == 0 and limit > 0:
            self.due_floor[group] = _NO_DEADLINE  # nothing live at or above the floor, so nothing at all

    def fifo_open(self) -> bool:
        """Whether FIFO lanes may hand out messages at all: not before every in-sync member holds
        the state this primary's term began with (`acked_state` -1: an ack the predecessor applied
        may have reached this member only, and the lane it freed is free only here)."""
        if not self._start_held:
            held = self._acked_state()
            self._start_held = held is None or held >= 0
        return self._start_held

    def release_settled(self) -> set[str]:
        """Open the FIFO lanes whose settling change every in-sync member now holds; the consumer
        groups of the lanes opened (their consumers may take the next messages)."""
        pending = self._settling
        if not pending:
            return set()
        held = self._acked_state()
        opened: set[str] = set()
        while pending and (held is None or pending[0][0] <= held):
            seq, qk, mg = pending.popleft()
            lane = self.fifo.get(qk, {}).get(mg)
            if lane is None or lane.settling != seq:
                continue  # dropped (a deleted group) or settled again since
            lane.settling = 0
            opened.add(qk[0])
            if lane.idle:
                self._drop_lane(qk, mg)
        return opened

    def settling(self, group: str, topic: str, queue_id: int, lane: str = WHOLE_QUEUE) -> bool:
        """Whether a lane (by default a lite topic's, `WHOLE_QUEUE`) waits for the in-sync members to
        hold the change that settled its last in-flight message."""
        found = self.fifo.get((group, topic, queue_id))
        return found is not None and lane in found and found[lane].settling != 0

    def _settle(self, qk: QueueKey, mg: str, seq: int) -> None:
        """Close a lane until every in-sync member holds state change `seq` (`release_settled`)."""
        lane = self.fifo.setdefault(qk, {}).setdefault(mg, FifoLane())
        lane.settling = seq
        self._settling.append((seq, qk, mg))

    def _drop_lane(self, qk: QueueKey, mg: str) -> None:
        """Forget an idle lane, and its queue's entry with its last lane (a broker may hold a million
        lite topics: nothing is kept per idle queue)."""
        lanes = self.fifo[qk]
        del lanes[mg]
        if not lanes:
            del self.fifo[qk]

    def groups_with_inflight(self) -> set[str]:
        return {g for (g, _, _), n in self.inflight.items() if n > 0}

    def queue_keys(self, group: str) -> list[tuple[str, int]]:
        """(topic, queue) pairs the group has a cursor for."""
        prefix = _name(group)
        out = []
        within = _within(prefix)
        for key, _ in self._cursor.items(from_key=prefix, read_opt=within):
            if not key.startswith(prefix):
                break
            topic, pos = _read_name(key, len(prefix))
            out.append((topic, int(_U32.unpack_from(key, pos)[0])))
        return out

    def next_version(self, version: int) -> int:
        """The version of an entry's next delivery or invisible-duration change made here."""
        return next_version_in_term(version, self._term)

    def batch(self) -> PopBatch:
        return PopBatch(self)

    def reset_queue(self, group: str, topic: str, queue_id: int, cursor: int) -> None:
        """Forget the group's entries of one queue and consume it from `cursor` (one WriteBatch)."""
        prefix = queue_key(group, topic, queue_id)
        batch = PopBatch(self)
        within = _within(prefix)
        for key, raw in self._msg.items(from_key=prefix, read_opt=within):
            if not key.startswith(prefix):
                break
            batch.remove(group, topic, queue_id, int(_U64.unpack_from(key, len(prefix))[0]), PopEntry.decode(raw))
        batch.set_cursor(group, topic, queue_id, cursor)
        batch.commit()

    def entries_below(self, topic: str, groups: Iterable[str], floors: Mapping[int, int]) -> list[tuple[str, int, int]]:
        """(group, queue, offset) of the groups' entries of `topic` below each queue's floor (a
        deleted topic's messages: store/deletion.py). A scan that only reads: any thread."""
        out: list[tuple[str, int, int]] = []
        for group in groups:
            prefix = _name(group) + _name(topic)
            within = _within(prefix)  # held while iterating (see _within)
            for key, _ in self._msg.items(from_key=prefix, read_opt=within):
                if not key.startswith(prefix):
                    break
                qid, offset = _QO.unpack_from(key, len(prefix))
                if offset < floors.get(qid, 0):
                    out.append((group, qid, offset))
        return out

    def drop_entries(self, topic: str, positions: Iterable[tuple[str, int, int]]) -> int:
        """Forget the entries at (group, queue, offset) of `topic` that are still there, in one
        WriteBatch; how many were."""
        by_group: dict[str, list[tuple[int, int]]] = {}
        for group, qid, offset in positions:
            by_group.setdefault(group, []).append((qid, offset))
        batch = PopBatch(self)
        dropped = 0
        for group, at in by_group.items():
            for (qid, offset), raw in zip(at, self.entries(group, topic, at), strict=True):
                if raw is not None:
                    batch.remove(group, topic, qid, offset, PopEntry.decode(raw))
                    dropped += 1
        batch.commit()
        return dropped

    def drop_cursors(self, topic: str, groups: Iterable[str], floors: Mapping[int, int]) -> None:
        """Forget the groups' cursors in `topic` that are at or below their queue's floor: they name
        nothing of the topic's next incarnation (a deleted topic's; one WriteBatch)."""
        batch = PopBatch(self)
        for group in groups:
            prefix = _name(group) + _name(topic)
            within = _within(prefix)
            for key, raw in self._cursor.items(from_key=prefix, read_opt=within):
                if not key.startswith(prefix):
                    break
                qid = _U32.unpack_from(key, len(prefix))[0]
                if _U64.unpack(raw)[0] <= floors.get(qid, 0):
                    batch.drop_cursor(group, topic, qid)
        batch.commit()

    def drop_group(self, group: str) -> None:
        """Forget every cursor and entry of a deleted group."""
        prefix = _name(group)
        end = prefix + b"\xff" * 8
        batch = self._index.batch()
        for handle in (self.h_cursor, self.h_msg, self.h_due):
            batch.delete_range(prefix, end, handle)
        self._index.write(batch)
        for qk in [k for k in self.inflight if k[0] == group]:
            del self.inflight[qk]
        for qk in [k for k in self._cursor_cache if k[0] == group]:
            del self._cursor_cache[qk]
        for qk in [k for k in self.fifo if k[0] == group]:
            del self.fifo[qk]
        self.due_floor.pop(group, None)


class PopBatch:
    """Changes to pop state that become durable (and visible in memory) together on `commit`.

    Hot path (pops and acks of 32 messages): keys are built from the cached name prefixes and one
    pack of (queue, offset); the in-flight counters of entries without a message group change by
    one net delta per queue on commit, and only FIFO entries (with a message group) replay their
    changes one by one (`_apply`, which keeps their lanes in order).
    """

    def __init__(self, state: PopState) -> None:
        self._s = state
        self._wb = state._index.batch()
        self._mem: list[tuple[QueueKey, int, PopEntry | None, PopEntry | None]] = []  # FIFO entries only
        self._inflight: dict[QueueKey, int] = {}  # net change of INFLIGHT entries without a message group
        self._cursors: dict[QueueKey, int] = {}  # cursors set
        self._dropped: list[QueueKey] = []  # cursors deleted
        # Queues from LITE_QUEUE_BASE (lite topics, priority levels) whose in-flight entries it removes.
        self._freed: list[QueueKey] = []
        self.empty = True

    def set_cursor(self, group: str, topic: str, queue_id: int, cursor: int) -> None:
        self._wb.put(queue_key(group, topic, queue_id), _U64.pack(cursor), self._s.h_cursor)
        self._cursors[(group, topic, queue_id)] = cursor
        self.empty = False

    def drop_cursor(self, group: str, topic: str, queue_id: int) -> None:
        self._wb.delete(queue_key(group, topic, queue_id), self._s.h_cursor)
        self._dropped.append((group, topic, queue_id))
        self.empty = False

    def cursor_set(self, group: str, topic: str, queue_id: int) -> int | None:
        """The cursor this batch sets for a queue, if it sets one."""
        return self._cursors.get((group, topic, queue_id))

    def _lower_floor(self, group: str, until_ms: int) -> None:
        due_floor = self._s.due_floor
        floor = due_floor.get(group)
        if floor is not None and until_ms < floor:
            due_floor[group] = until_ms  # lowered before the key exists: stays a bound

    def put(self, group: str, topic: str, queue_id: int, offset: int, new: PopEntry, old: PopEntry | None) -> None:
        wb, s = self._wb, self._s
        g, t, qo = _name(group), _name(topic), _QO.pack(queue_id, offset)
        was_inflight = old is not None and old.state is EntryState.INFLIGHT
        if was_inflight:
            assert old is not None
            wb.delete(_due_key(g, old.invisible_until_ms, t, qo), s.h_due)
        wb.put(g + t + qo, new.encode(), s.h_msg)
        is_inflight = new.state is EntryState.INFLIGHT
        if is_inflight:
            wb.put(_due_key(g, new.invisible_until_ms, t, qo), b"", s.h_due)
            self._lower_floor(group, new.invisible_until_ms)
        self._changed((group, topic, queue_id), offset, old, new, int(is_inflight) - int(was_inflight))

    def add_inflight(
        self, group: str, topic: str, queue_id: int, offset: int, until_ms: int, message_group: str
    ) -> None:
        """`put` of a first delivery (attempt 1, the state's first version) of an offset that has no entry yet."""
        wb, s = self._wb, self._s
        g, t, qo = _name(group), _name(topic), _QO.pack(queue_id, offset)
        version = s.first_version
        if message_group:
            entry = PopEntry(EntryState.INFLIGHT, 1, version, until_ms, message_group)
            self.put(group, topic, queue_id, offset, entry, None)
            return
        wb.put(g + t + qo, _ENTRY.pack(EntryState.INFLIGHT, 1, version, until_ms, 0), s.h_msg)
        wb.put(_due_key(g, until_ms, t, qo), b"", s.h_due)
        self._lower_floor(group, until_ms)
        qk = (group, topic, queue_id)
        self._inflight[qk] = self._inflight.get(qk, 0) + 1
        self.empty = False

    def remove(self, group: str, topic: str, queue_id: int, offset: int, old: PopEntry) -> None:
        wb, s = self._wb, self._s
        g, t, qo = _name(group), _name(topic), _QO.pack(queue_id, offset)
        wb.delete(g + t + qo, s.h_msg)
        was_inflight = old.state is EntryState.INFLIGHT
        if was_inflight:
            wb.delete(_due_key(g, old.invisible_until_ms, t, qo), s.h_due)
            if queue_id >= LITE_QUEUE_BASE:
                self._freed.append((group, topic, queue_id))
        self._changed((group, topic, queue_id), offset, old, None, -int(was_inflight))

    def _changed(
        self, qk: QueueKey, offset: int, old: PopEntry | None, new: PopEntry | None, inflight_delta: int
    ) -> None:
        ref = new if new is not None else old
        if ref is not None and ref.message_group:
            self._mem.append((qk, offset, old, new))
        elif inflight_delta:
            self._inflight[qk] = self._inflight.get(qk, 0) + inflight_delta
        self.empty = False

    def commit(self) -> None:
        if self.empty:
            return
        seq = self._s._index.write(self._wb)
        if self._cursors:
            self._s._cache_cursors(self._cursors)
        for qk in self._dropped:
            self._s._cursor_cache.pop(qk, None)
        inflight = self._s.inflight
        for qk, delta in self._inflight.items():
            count = inflight[qk] + delta
            if count:
                inflight[qk] = count
            else:  # no key per idle queue (a broker may hold a million lite topics' queues)
                del inflight[qk]
        for qk, offset, old, new in self._mem:
            self._apply(qk, offset, old, new, seq)
        if seq and self._freed:  # a lite topic's next message waits until the replicas hold this
            lite = self._s._lite_topic
            for qk in dict.fromkeys(self._freed):
                if lite(qk[1]):
                    self._s._settle(qk, WHOLE_QUEUE, seq)

    def _apply(self, qk: QueueKey, offset: int, old: PopEntry | None, new: PopEntry | None, seq: int) -> None:
        """Counters and FIFO lane of one change of an entry with a message group; `seq`: the
        number of the replicated state change the batch recorded (0: none)."""
        s = self._s
        was_inflight = old is not None and old.state is EntryState.INFLIGHT
        is_inflight = new is not None and new.state is EntryState.INFLIGHT
        s.inflight[qk] += int(is_inflight) - int(was_inflight)
        ref = new if new is not None else old
        assert ref is not None
        mg = ref.message_group
        lane = s.fifo.setdefault(qk, {}).setdefault(mg, FifoLane())
        lane.outstanding += int(is_inflight) - int(was_inflight)
        if old is not None and old.state is EntryState.WAITING and lane.waiting and lane.waiting[0] == offset:
            lane.waiting.popleft()
        elif old is not None and old.state is EntryState.WAITING and offset in lane.waiting:
            lane.waiting.remove(offset)
        if new is not None and new.state is EntryState.WAITING:
            lane.waiting.append(offset)
        if was_inflight and not is_inflight and seq:  # settled: the next waits until the replicas hold it
            s._settle(qk, mg, seq)
        if lane.idle:
            s._drop_lane(qk, mg)
