"""A receive served by whichever broker of a topic has messages for the group (docs/consumers.md).

A client names one broker per receive (the official SimpleConsumer goes round the route's brokers),
but the messages may all sit on another. `pop_anywhere` asks the named broker first, then the others
in turn, each without waiting; only when none has anything does it long-poll all of them at once and
take the first answer with messages. A broker that had nothing for the group and topic moments ago
(`EmptyBrokers`, `EMPTY_FOR_S`) is asked after the others instead of first: a backlog that sits on
one broker is then drained without a useless pop of the empty one on every other receive (the
official SimpleConsumer names the brokers in turn). It is asked again once that memory lapses, or
when the others have nothing either. Each message's receipt handle names the broker that delivered
it, so acks and invisibility changes reach that broker whichever broker the client named.

A long poll that loses the race is not cancelled (a cancelled pop whose broker had already popped
would lose its answer, and those messages would come back only after their whole invisible
duration): it finishes on its own, and what it brings is made visible again after
`RELEASE_INVISIBLE_MS` (a broker's shortest invisibility). One that had already answered (the
answers crossed) is handed out too when the batch has room; what does not fit is released the same way.

FIFO groups keep their order: a message group lives on one queue of one broker, and that broker
hands out a group's next message only after the previous one is acked, whoever asks.

A pop never creates its consumer group: a broker that lacks it answers CONSUMER_GROUP_NOT_FOUND,
and `pop_in_group` gives it the cluster's definition (proxy/firstuse.py, `ensure_group`: another
broker's copy, a FIFO group stays FIFO) before asking once more. Before, a pop that reached a broker
ahead of the client's settings or heartbeat created the group there with the defaults.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import replace

from broker.client import receipt
from broker.client.api import CallContext, FilterSpec, MessagingApi, PopRequest, StoredMessage
from common import metrics
from common.errors import BadRequest, ConsumerGroupNotFound, SluiceError
from common.logs import kv
from proxy import firstuse
from proxy.directory import BrokerDirectory

log = logging.getLogger("sluice.proxy.gather")

# What a surplus popped message is made invisible for: brokers accept no less (broker PopConfig).
RELEASE_INVISIBLE_MS = 1_000
# Refusals that every broker would give alike (the request itself is wrong): raised at once. Others
# (unreachable, timing out, a topic or group one broker lacks) skip that broker.
_REQUEST_ERRORS = (BadRequest,)

# True inside a pop this module makes of a broker other than the one the receive named: a merged
# node counts such a pop of another node's broker as balancing, not as a misrouted call
# (proxy/shards.py, `sluice_proxy_forwarded_calls_total{call="pop_elsewhere"}`).
ELSEWHERE: ContextVar[bool] = ContextVar("sluice_pop_elsewhere", default=False)

# How long a broker that had nothing for a group and topic is asked after the others: also the
# longest a message new on it waits while another broker of the topic keeps a backlog.
EMPTY_FOR_S = 1.0
# (group, topic, filter) kinds remembered at once; a full memory starts over rather than grow.
EMPTY_MAX = 10_000

_Kind = tuple[str, str, FilterSpec]


class EmptyBrokers:
    """Which brokers had nothing for a (group, topic, filter) lately: soft state of one proxy process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[_Kind, dict[str, float]] = {}  # kind -> broker -> when it answered empty

    def order(self, request: PopRequest, brokers: Sequence[str]) -> list[str]:
        """`brokers` with the ones empty lately moved to the end (each part keeps its order)."""
        seen = self._seen.get((request.group, request.topic, request.filter))
        if not seen:
            return list(brokers)
        lapsed = self._clock() - EMPTY_FOR_S
        empty = {b for b, at in seen.items() if at > lapsed}
        if not empty:
            return list(brokers)
        return [b for b in brokers if b not in empty] + [b for b in brokers if b in empty]

    def answered(self, request: PopRequest, broker: str, found: bool) -> None:
        kind = (request.group, request.topic, request.filter)
        if found:
            seen = self._seen.get(kind)
            if seen is not None:
                seen.pop(broker, None)
            return
        if kind not in self._seen and len(self._seen) >= EMPTY_MAX:
            self._seen.clear()
        self._seen.setdefault(kind, {})[broker] = self._clock()


async def pop_in_group(
    directory: BrokerDirectory, api: MessagingApi, request: PopRequest, ctx: CallContext
) -> list[StoredMessage]:
    """`api.pop(request)`; when its broker lacks the consumer group, the group is created there as
    the cluster defines it (`firstuse.ensure_group` over every broker) and the pop asked once more.
    CONSUMER_GROUP_NOT_FOUND when no broker holds the group or creates it on first use."""
    try:
        return await api.pop(request, ctx=ctx)
    except ConsumerGroupNotFound:
        brokers = [(n, directory.broker(n)) for n in directory.broker_names()]
        if await firstuse.ensure_group(brokers, request.group, firstuse.GROUP_WAIT_S) is None:
            raise
    return await api.pop(request, ctx=ctx)


async def _pop(directory: BrokerDirectory, name: str, named: str, request: PopRequest,
               ctx: CallContext) -> list[StoredMessage]:  # fmt: skip
    token = ELSEWHERE.set(name != named)
    try:
        found = await pop_in_group(directory, directory.broker(name), request, ctx)
    finally:
        ELSEWHERE.reset(token)
    if found and name != named:
        metrics.count_balanced(name, len(found))
    return found


async def pop_anywhere(
    directory: BrokerDirectory, brokers: Sequence[str], request: PopRequest, *, ctx: CallContext,
    usable: Callable[[str], bool] | None = None, empty: EmptyBrokers | None = None,
) -> list[StoredMessage]:  # fmt: skip
    """Messages for `request` from the first of `brokers` (in that order) that has any.

    A broker that fails (unreachable, timing out) is skipped; its error is raised only when no
    broker answered at all. A broker `usable` says is hung or failing (the send health,
    proxy/core/health.py) is not asked without waiting, where it would hold the receive for its
    whole timeout; it still takes part in the long poll. `empty`: brokers that had nothing lately
    are asked after the others."""
    if len(brokers) == 1:
        return await pop_in_group(directory, directory.broker(brokers[0]), request, ctx)
    named = brokers[0]  # the broker the client named: pops of the others count as balancing
    quick = replace(request, long_poll_ms=0)
    avoided = [] if usable is None else [n for n in brokers if not usable(n)]
    if len(avoided) == len(brokers):
        avoided = []  # every broker looks troubled: ask them all the same
    live: list[str] = list(avoided)
    failure: SluiceError | None = None
    for name in brokers if empty is None else empty.order(request, brokers):
        if name in avoided:
            continue
        try:
            found = await _pop(directory, name, named, quick, ctx)
        except _REQUEST_ERRORS:
            raise
        except SluiceError as exc:
            log.debug("broker skipped for a receive", extra=kv(broker=name, error=exc.message))
            failure = failure or exc
            continue
        if empty is not None:
            empty.answered(request, name, bool(found))
        if found:
            return found
        live.append(name)
    if not live and failure is not None:
        raise failure
    if request.long_poll_ms <= 0 or not live:
        return []
    found = await _long_poll(directory, live, named, request, ctx)
    if empty is not None:
        for name in {receipt.broker_of(m.receipt_handle) for m in found}:
            empty.answered(request, name, True)
    return found


async def _long_poll(
    directory: BrokerDirectory, brokers: list[str], named: str, request: PopRequest, ctx: CallContext
) -> list[StoredMessage]:
    """Long-poll every broker at once; the first answer with messages is the result."""
    tasks = [asyncio.create_task(_pop(directory, n, named, request, ctx), name=f"pop-{n}") for n in brokers]
    out: list[StoredMessage] = []
    late: list[StoredMessage] = []  # answers after the first with messages
    failure: BaseException | None = None
    read: set[asyncio.Task[list[StoredMessage]]] = set()
    try:
        pending = set(tasks)
        while pending and not out:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                read.add(task)
                exc = task.exception()
                if exc is None:
                    (late if out else out).extend(task.result())
                elif isinstance(exc, _REQUEST_ERRORS):
                    raise exc
                else:
                    failure = failure or exc
    except BaseException:  # the receive itself ends (cancelled, a bad request): so do its polls
        for task in tasks:
            task.cancel()
        raise
    for task in tasks:
        if task in read:
            continue
        if task.done():  # answered meanwhile
            if not task.cancelled() and task.exception() is None:
                late.extend(task.result())
            continue
        # A long poll that lost the race finishes on its own instead of being cancelled: a broker
        # that had already popped for a cancelled call would lose the answer, and its messages would
        # come back only after their whole invisible duration. What it brings is released (soon
        # visible again to the group).
        finisher = asyncio.create_task(_finish_late(directory, request, task), name=f"{task.get_name()}-late")
        _lingering.add(finisher)
        finisher.add_done_callback(_lingering.discard)
    if not out and failure is not None and len(read) == len(tasks) and all(t.exception() for t in tasks):
        raise failure
    room = max(request.max_messages - len(out), 0)
    out.extend(late[:room])
    await _release(directory, request, late[room:])
    return out


# Long polls that lost a race, left to finish (`_long_poll`); held here so that none is collected.
_lingering: set[asyncio.Task[None]] = set()


async def _finish_late(
    directory: BrokerDirectory, request: PopRequest, poll: asyncio.Task[list[StoredMessage]]
) -> None:
    try:
        found = await poll
    except Exception:  # a broker that failed meanwhile: nothing of it was delivered
        return
    await _release(directory, request, found)


async def _release(directory: BrokerDirectory, request: PopRequest, surplus: list[StoredMessage]) -> None:
    """Make popped messages that no answer has room for visible again soon (instead of after their
    whole invisible duration)."""
    for m in surplus:
        try:
            api = directory.broker(receipt.broker_of(m.receipt_handle))
            await api.change_invisible_duration(request.group, request.topic, m.receipt_handle, RELEASE_INVISIBLE_MS)
        except SluiceError as exc:
            log.debug("surplus message left invisible", extra=kv(topic=request.topic, error=exc.message))
