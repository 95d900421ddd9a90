"""The send path of one broker: a send's records (made by an edge with `common.record.outgoing`,
verified and placed by `LocalBroker.send` with `record.received`) are checked against their topic
and the broker's limits, then stored as plain records (NORMAL and FIFO), timers (DELAY) or half
messages (TRANSACTION); a LITE topic's messages go to its lite topics (broker/lite/), a PRIORITY
topic's to the queue of their level (broker/priority.py).

The checks are `broker/messages.py::validate_all` (column by column for a batch, message by
message below `messages.COLUMNS_MIN` or to name the error).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

from broker import priority
from broker.client.api import CallContext, SendResult, TopicSpec
from broker.config import BrokerConfig
from broker.lite.service import LiteService, is_lite
from broker.messages import at_queues, validate_all, validate_queue
from broker.store.store import MessageStore
from broker.store.writer import AppendResult, offsets_of, span_of
from broker.timer.service import TimerService
from broker.trace import TraceRecorder
from broker.transaction.service import TransactionService
from common.errors import BadRequest, Forbidden, RequestTimeout
from common.model import EXCLUSIVE_TYPES, MessageType, TopicInfo
from common.record import MessageRecord

_MESSAGE_ID = attrgetter("message_id")
_PRIORITY_ONLY = frozenset({MessageType.PRIORITY})


class Producer:
    def __init__(
        self, name: str, config: BrokerConfig, store: MessageStore, timers: TimerService,
        transactions: TransactionService, trace: TraceRecorder, lite: LiteService,
    ) -> None:  # fmt: skip
        self._name = name
        self._config = config
        self._store = store
        self._timers = timers
        self._transactions = transactions
        self._trace = trace
        self._lite = lite

    async def send(
        self, spec: TopicSpec, queue_id: int, messages: list[MessageRecord], ctx: CallContext
    ) -> list[SendResult]:
        """Store `messages` in queue `queue_id` of the topic `spec` describes, all or none; none
        once the deadline of `ctx` has passed (its client has stopped waiting for the answer)."""
        if ctx.expired():
            raise RequestTimeout(f"the client's deadline passed before the send to {spec.name} was stored")
        topic = spec.name
        if not spec.permission.writable:
            raise Forbidden(f"topic {topic} is not writable on broker {self._name}")
        if not messages:
            raise BadRequest("no messages to send")
        if len(messages) > self._config.limits.max_batch_messages:
            raise BadRequest(f"{len(messages)} messages in one send; at most {self._config.limits.max_batch_messages}")
        info = TopicInfo(spec.name, spec.queue_count, spec.permission, spec.message_types)
        validate_queue(info, queue_id)
        client = ctx.client_id  # who sent them: for the trace only, not stored
        if spec.message_types & EXCLUSIVE_TYPES:  # lite topics and priority levels have queues of their own
            if is_lite(spec):
                return await self._lite.send(spec, info, messages, client)
            return await self._send_priority(spec, info, messages, client)
        if validate_all(messages, info, self._config.limits):  # NORMAL and FIFO only: stored as they come
            results = await self._store.append(messages)
            return self._sent_plain(topic, queue_id, messages, results, client)
        timers = self._timers
        for msg in messages:
            if msg.message_type is MessageType.DELAY:
                timers.check_delivery_time(msg)
        if any(m.message_type is MessageType.TRANSACTION for m in messages):
            return await self._send_half(topic, queue_id, messages)
        mixed = [timers.timer_record(m) if m.message_type is MessageType.DELAY else m for m in messages]
        results = await self._store.append(mixed)
        # Not plain and no transaction: at least one of them is a DELAY message.
        delayed = [(topic, m.delivery_timestamp_ms, r) for m, r in zip(messages, results, strict=True)
                   if m.message_type is MessageType.DELAY]  # fmt: skip
        handles = iter(timers.index(delayed))
        return [
            SendResult(m.message_id, queue_id, r.queue_offset,
                       recall_handle=next(handles) if m.message_type is MessageType.DELAY else "")
            for m, r in zip(messages, results, strict=True)
        ]  # fmt: skip

    async def _send_priority(self, spec: TopicSpec, info: TopicInfo, messages: list[MessageRecord],
                             client: str) -> list[SendResult]:  # fmt: skip
        validate_all(messages, info, self._config.limits, _PRIORITY_ONLY)
        qids = [priority.level_queue(priority.priority_of(msg, spec)) for msg in messages]
        results = await self._store.append(at_queues(messages, qids))
        self._trace.sent_append(spec.name, *span_of(results), client, messages[0].born_host)
        return list(map(SendResult, map(_MESSAGE_ID, messages), qids, offsets_of(results)))

    def _sent_plain(self, topic: str, queue_id: int, messages: list[MessageRecord],
                    results: Sequence[AppendResult], client: str) -> list[SendResult]:  # fmt: skip
        # One append takes consecutive offsets of its queue: one trace event for the whole range.
        self._trace.sent(topic, queue_id, results[0].queue_offset, results[-1].queue_offset + 1, client,
                        messages[0].born_host)  # fmt: skip
        if len(messages) == 1:
            return [SendResult(messages[0].message_id, queue_id, results[0].queue_offset)]
        # A one-run append keeps its results as columns: take the offsets without building results.
        return list(map(SendResult, map(_MESSAGE_ID, messages), repeat(queue_id), offsets_of(results)))

    async def _send_half(self, topic: str, queue_id: int, messages: list[MessageRecord]) -> list[SendResult]:
        if not all(m.message_type is MessageType.TRANSACTION for m in messages):
            raise BadRequest("send TRANSACTION messages in their own request, not mixed with other types")
        return await self._transactions.prepare(topic, queue_id, messages)
