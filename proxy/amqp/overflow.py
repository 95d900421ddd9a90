"""`x-max-length` and `x-overflow`: a queue holding at most N ready messages.

- `drop-head` (the default): after a publish is stored, the oldest ready messages beyond N are
  taken from the head and dead-lettered (reason `maxlen`) or dropped.
- `reject-publish`: a publish that finds the queue full is not stored there; with confirms it is
  nacked (`reject-publish-dlx` does the same: the refused message is not dead-lettered yet).

The count is the queue's exact ready count read before (reject) or after (drop-head) the store; a
queue written through several proxies at once may pass N briefly, as the reads and writes of
different proxies interleave.
"""

from __future__ import annotations

import logging

from common.errors import SluiceError
from common.logs import kv
from proxy.amqp.deadletter import DeadLetters
from proxy.amqp.meta import QueueMeta
from proxy.amqp.queues import Publish, QueueStore

log = logging.getLogger("sluice.proxy.amqp")

MAXLEN = "maxlen"
_TRIM_ROUNDS = 64  # pops of one trim (32 messages each) before the rest is left for the next publish


def rejects(queue: QueueMeta) -> bool:
    return queue.max_length is not None and queue.overflow in ("reject-publish", "reject-publish-dlx")


async def admit(store: QueueStore, queue: QueueMeta, publishes: list[Publish]) -> list[Publish]:
    """The publishes a reject-publish queue has room for (the first ones)."""
    assert queue.max_length is not None
    ready, _ = await store.counts(queue)
    return publishes[: max(0, queue.max_length - ready)]


async def trim(store: QueueStore, dead: DeadLetters, vhost: str, queue: QueueMeta) -> None:
    """Dead-letter or drop the oldest ready messages over a drop-head queue's length (a failure
    is logged: the publishes are stored all the same, the next one trims again)."""
    if queue.max_length is None or rejects(queue):
        return
    try:
        await _trim(store, dead, vhost, queue, queue.max_length)
    except SluiceError as exc:
        log.warning("could not trim an AMQP queue to its x-max-length", extra=kv(queue=queue.name, error=exc.message))


async def _trim(store: QueueStore, dead: DeadLetters, vhost: str, queue: QueueMeta, limit: int) -> None:
    ready, _ = await store.counts(queue)
    excess = ready - limit
    for _ in range(_TRIM_ROUNDS):
        if excess <= 0:
            return
        got = await store.pop(queue, excess, 0)
        if not got:
            return
        for d in got:
            await dead.dead_letter(vhost, queue, d, MAXLEN)
        excess -= len(got)
