"""`x-max-length`, `x-max-length-bytes` and `x-overflow`: a queue holding at most N ready messages
and at most B bytes of ready message bodies (either limit, or both).

- `drop-head` (the default): after a publish is stored, and after a channel's requeues, the
  oldest ready messages are taken from the head and dead-lettered (reason `maxlen`) or dropped
  while the queue is above a limit (a message larger than B on its own goes too: the queue is
  above B while it holds it).
- `reject-publish`: each publish in turn that would take the queue above a limit is not stored
  there (a later, smaller one may still fit); with confirms it is nacked (`reject-publish-dlx`
  does the same: the refused message is not dead-lettered yet).

The counts are the queue's exact ready messages and their body bytes (the broker's
`GroupQueueStatus.ready` and `ready_bytes`), read before (reject) or after (drop-head) the store;
a queue written through several proxies at once may pass a limit briefly, as the reads and writes
of different proxies interleave. Bytes are asked for only of queues with a byte limit.
"""

from __future__ import annotations

import logging

from common.errors import NotFound, SluiceError
from common.logs import kv
from proxy.amqp.deadletter import DeadLetters
from proxy.amqp.meta import QueueMeta
from proxy.amqp.queues import Publish, QueueStore

log = logging.getLogger("sluice.proxy.amqp")

MAXLEN = "maxlen"
_TRIM_MAX = 64 * 32  # messages one trim drops at most; the rest is left for the next publish


def rejects(queue: QueueMeta) -> bool:
    limited = queue.max_length is not None or queue.max_length_bytes is not None
    return limited and queue.overflow in ("reject-publish", "reject-publish-dlx")


async def admit(store: QueueStore, queue: QueueMeta, publishes: list[Publish]) -> list[Publish]:
    """The publishes a reject-publish queue has room for, each checked in turn as RabbitMQ does:
    one that would take the queue above a limit is refused."""
    max_length, max_bytes = queue.max_length, queue.max_length_bytes
    if max_bytes is None:
        assert max_length is not None
        ready, _ = await store.counts(queue)
        return publishes[: max(0, max_length - ready)]
    ready, size = await store.ready(queue)
    accepted = []
    for p in publishes:
        if (max_length is None or ready < max_length) and size + len(p.body) <= max_bytes:
            accepted.append(p)
            ready += 1
            size += len(p.body)
    return accepted


async def trim(store: QueueStore, dead: DeadLetters, vhost: str, queue: QueueMeta) -> None:
    """Dead-letter or drop the oldest ready messages over a drop-head queue's limits (a failure
    is logged: the publishes are stored all the same, the next one trims again)."""
    if (queue.max_length is None and queue.max_length_bytes is None) or rejects(queue):
        return
    try:
        await _trim(store, dead, vhost, queue)
    except NotFound:
        return  # the queue was deleted meanwhile: nothing left to trim
    except SluiceError as exc:
        log.warning("could not trim an AMQP queue to its limits", extra=kv(queue=queue.name, error=exc.message))


async def _trim(store: QueueStore, dead: DeadLetters, vhost: str, queue: QueueMeta) -> None:
    max_length, max_bytes = queue.max_length, queue.max_length_bytes
    if max_bytes is None:
        ready, _ = await store.counts(queue)
        size = 0
    else:
        ready, size = await store.ready(queue)
    dropped: list[str] = []  # handles of messages taken to be dropped (no dead-letter exchange)
    taken = 0
    try:
        while taken < _TRIM_MAX:
            excess = 0 if max_length is None else ready - max_length
            if excess <= 0 and (max_bytes is None or size <= max_bytes):
                return
            # Over the length: the excess at once. Over the bytes alone: one at a time, as how many
            # must go depends on the sizes of the head's messages, known when they are taken.
            got = await store.pop(queue, min(max(excess, 1), _TRIM_MAX - taken), 0)
            if not got:
                return
            if queue.dead_letter_exchange is None:
                dropped += [d.handle for d in got]
            else:
                for d in got:
                    await dead.dead_letter(vhost, queue, d, MAXLEN)
            taken += len(got)
            ready -= len(got)
            size -= sum(len(d.body) for d in got)
    finally:
        if dropped:  # taken, so no longer ready: acknowledged at the end with one call
            await store.ack(queue, dropped)
