"""Topic deletion in the store: a record in the CommitLog, ordered with the messages it ends.

Deleting a topic appends one record to the internal topic `DELETION_TOPIC` (queue 0) whose one key
names the deleted topic (`deletion_record`). What the CommitLog holds of the topic before that record
is its old incarnation; what follows belongs to the next one. The dispatcher applies the record where
it meets it, in the WriteBatch of the round that holds it (`dispatcher.index_runs`): when the round is
written, when recovery re-dispatches the log after a crash, and when a replica indexes what it copied
from its primary. So every member of a broker group, before and after any restart or failover, draws
the line at the same place, with no state of its own to keep in step:

- every queue of the topic that holds anything (ConsumeQueue entries, a retention floor, or entries
  earlier in the same round) keeps its end: its entries go (one range delete), and its floor (`q:`)
  and the first offset of its next incarnation (`f:`, `Index.incarnation_floor`) become that end. The
  next message of the queue takes that offset, so no old offset, receipt handle or committed offset
  ever names a new message, and readers of the queue (pops, pulls, offset queries) start there.
- the record's position is the topic's deletion position (`d:`, `Index.deleted_at`, also in memory):
  lookups by id or key, pending timers and half messages stored before it belong to the old topic.

The records of the old incarnation stay in the CommitLog until retention deletes their segment;
nothing indexes them any more, so that is where their space comes back.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.record import MessageRecord

# The internal topic of deletion records: one queue, never registered as a topic, so never routed.
DELETION_TOPIC = "%SYS_TOPIC_DELETED"


def deletion_record(topic: str) -> MessageRecord:
    """The record that deletes `topic` where it is stored: its one key is the topic's name."""
    return MessageRecord(DELETION_TOPIC, 0, b"", keys=(topic,))


@dataclass(frozen=True, slots=True)
class Deletion:
    """A deletion record the dispatcher applied."""

    topic: str
    position: int  # the record's CommitLog position
    floors: dict[int, int]  # queue id -> the first offset of its next incarnation (where it ended)
