"""The head reads of a lite consumer's pop: the next message of each of several lite topics at once.

A lite topic is consumed one message at a time (its next message once the previous one is done), so
a pop of n messages reads the head of up to n lite topics, not n messages of one queue. Read one by
one through the store's general queue read, each head cost three RocksDB iterators (the queue's
bounds, then its ConsumeQueue) and a cursor get: several times a normal pop's cost per message.
Here the group's cursors of all candidates come from one multi-get, each head from one seek of one
shared ConsumeQueue iterator (which also tells whether a message follows it), and the CommitLog
records of all heads from one pass that reads messages stored back to back (a send to several lite
topics) with one pread.

Only the plain case is read here: a cursor that exists, a head stored locally at exactly the cursor,
a filter that takes every message. Anything else (a lite topic the group never started, offsets
retention deleted, a tag or SQL filter) goes through the pop engine's general read, which handles
it; `take_heads` reports those queues to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.popstate import PopBatch, PopState
from broker.store.index import CqEntry
from broker.store.store import MessageStore
from common.record import MessageRecord


@dataclass(slots=True)
class Head:
    queue_id: int
    entry: CqEntry
    more: bool  # another message follows the head in this lite topic


def read_heads(
    store: MessageStore, pop: PopState, group: str, topic: str, topic_id: int, queue_ids: list[int]
) -> tuple[list[Head], list[int], list[int]]:
    """(heads found, queues whose head is past the end — nothing new —, queues the general read must
    handle) of the lite queues `queue_ids` for `group`."""
    cursors = pop.cursors(group, topic, queue_ids)
    heads: list[Head] = []
    empty: list[int] = []
    general: list[int] = [qid for qid, cursor in zip(queue_ids, cursors, strict=True) if cursor is None]
    known = [(qid, cursor) for qid, cursor in zip(queue_ids, cursors, strict=True) if cursor is not None]
    for (qid, cursor), (entry, more) in zip(known, store.index.cq_heads(topic_id, known), strict=True):
        if entry is not None:
            heads.append(Head(qid, entry, more))
            continue
        # Nothing stored at the cursor: usually the queue ends there. A cursor below what retention
        # kept, or past a queue that lost its tail in a crash, is the general read's to repair.
        low, high = store.index.queue_bounds(topic_id, qid)
        (empty if low <= cursor == high else general).append(qid)
    return heads, empty, general


def deliver_heads(
    store: MessageStore, heads: list[Head], group: str, topic: str, until: int, batch: PopBatch
) -> list[tuple[Head, MessageRecord]]:
    """Load the heads' records (back-to-back ones with one read) and mark them in flight in `batch`."""
    ordered = sorted(heads, key=lambda h: h.entry.physical_offset)
    records = store.load_entries([h.entry for h in ordered])
    add, set_cursor = batch.add_inflight, batch.set_cursor
    for head in ordered:
        offset = head.entry.queue_offset
        add(group, topic, head.queue_id, offset, until, "")
        set_cursor(group, topic, head.queue_id, offset + 1)
    return list(zip(ordered, records, strict=True))
