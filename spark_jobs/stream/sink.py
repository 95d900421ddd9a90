"""`df.writeStream.format("sluice")` and `df.write.format("sluice")`: rows become messages, sent to the
brokers in batches, each with a deterministic message id the broker deduplicates.

| column | type | meaning |
|---|---|---|
| `body` | binary or string | required |
| `topic` | string | where the row goes; the `topic` option, when set, wins |
| `keys` | array<string> or string | message keys |
| `tag`, `message_group` | string | a message group makes it a FIFO message |
| `properties` | map<string,string> | user properties |
| `delivery_timestamp` | timestamp | a DELAY message delivered then |

Other columns are ignored, so the source's own rows can be written back as they are.

**Effectively once.** A row's message id is a hash of (query id, batch id, partition, row number)
in a streaming query, and of (a write id fixed when the batch write was planned, partition, row
number) in a batch write; the row picks its broker and queue from the same hash. Messages are
sent with `dedup`, so a broker that stored that id in the topic within its `dedup_window_s`
(600 s) answers with the stored copy: a task retried, or a micro-batch replayed after a failure
between its write and its commit, adds no duplicate (tests/integration/test_spark_stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from broker.client.remote import RemoteBroker
from common import record
from common.errors import BadRequest, TopicNotFound
from common.logs import kv
from common.model import MessageType
from nameserver.client import NameServerClient, parse_addresses

log = logging.getLogger("sluice.spark.sink")

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # local properties Spark sets on a micro-batch's tasks
QUERY_ID_PROPERTY = "sql.streaming.queryId"
DEFAULT_SEND_BATCH = 256
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SinkOptions:
    namesrv: tuple[str, ...]
    topic: str = ""  # every row goes here; "" = the row's topic column
    send_batch: int = DEFAULT_SEND_BATCH
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        opts = {k.lower(): str(v).strip() for k, v in options.items() if v is not None}
        namesrv = opts.get("namesrv", "")
        if not namesrv:
            raise BadRequest("option namesrv is required: the cluster's NameServers, host:port[;host:port]")
        try:
            addresses = tuple(parse_addresses(namesrv))
        except ValueError as exc:
            raise BadRequest(f"option namesrv {namesrv!r}: {exc}") from None
        names = set(schema.fieldNames())
        if "body" not in names:
            raise BadRequest(f"a sluice sink needs a body column; the rows have {', '.join(sorted(names))}")
        topic = opts.get("topic", "")
        if not topic and "topic" not in names:
            raise BadRequest("a sluice sink needs the topic option or a topic column")
        try:
            send_batch = int(opts.get("sendbatch", str(DEFAULT_SEND_BATCH)))
            timeout_s = float(opts.get("timeouts", str(DEFAULT_TIMEOUT_S)))
        except ValueError as exc:
            raise BadRequest(f"options sendBatch and timeoutS must be numbers: {exc}") from None
        if not 1 <= send_batch <= 1024 or timeout_s <= 0:
            raise BadRequest("option sendBatch must be 1..1024 and timeoutS positive")
        return cls(addresses, topic, send_batch, timeout_s)


@dataclass
class SentMessages(WriterCommitMessage):
    messages: int


def message_id(scope: str, partition: int, row: int) -> str:
    """The message id of a row: stable for the same rows of the same batch, unique otherwise."""
    return hashlib.sha256(f"{scope}/{partition}/{row}".encode()).hexdigest()[:32].upper()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def to_message(row: Mapping[str, Any], mid: str) -> bytes:
    """The record (`common.record.outgoing`) of a row, sent at most once (`dedup`: replays are no-ops)."""
    body = row.get("body")
    if body is None:
        raise BadRequest(f"row {mid} has no body")
    keys = row.get("keys")
    keys = () if keys is None else (keys,) if isinstance(keys, str) else tuple(str(k) for k in keys)
    properties = row.get("properties") or {}
    if not isinstance(properties, dict):
        properties = dict(properties)  # pyarrow hands maps over as lists of pairs
    group, when = _text(row.get("message_group")), row.get("delivery_timestamp")
    at_ms = int(when.timestamp() * 1000) if isinstance(when, datetime) else 0
    kind = MessageType.DELAY if at_ms else MessageType.FIFO if group else MessageType.NORMAL
    return record.outgoing(
        body=body.encode() if isinstance(body, str) else bytes(body), message_id=mid, message_type=kind,
        tag=_text(row.get("tag")), keys=keys, message_group=group,
        properties={str(k): str(v) for k, v in properties.items()}, delivery_timestamp_ms=at_ms, dedup=True,
    )  # fmt: skip


async def _send(opts: SinkOptions, rows: Sequence[tuple[str, str, bytes]]) -> int:
    """Send (topic, message id, record) rows, each to the queue its id picks among the topic's writable queues."""
    ns = NameServerClient(list(opts.namesrv), timeout_s=opts.timeout_s)
    brokers: dict[str, RemoteBroker] = {}
    try:
        queues: dict[str, list[tuple[str, str, int]]] = {}  # topic -> sorted (broker, address, queue)
        batches: dict[tuple[str, str, int], list[bytes]] = {}
        for topic, mid, msg in rows:
            if topic not in queues:
                route = await ns.get_route(topic)
                queues[topic] = sorted(
                    (b.broker_name, b.address, q) for b in route.brokers if b.permission.writable
                    for q in range(b.queue_count)
                )  # fmt: skip
                if not queues[topic]:
                    raise TopicNotFound(f"topic {topic} has no writable queue")
            broker, address, queue = queues[topic][int(mid, 16) % len(queues[topic])]
            if address not in brokers:
                brokers[address] = RemoteBroker(broker, address, timeout_s=opts.timeout_s)
            batches.setdefault((topic, address, queue), []).append(msg)
        for (topic, address, queue), msgs in sorted(batches.items()):
            for i in range(0, len(msgs), opts.send_batch):
                await brokers[address].send(topic, queue, msgs[i : i + opts.send_batch])
        return len(rows)
    finally:
        for remote in brokers.values():
            with contextlib.suppress(Exception):
                await remote.close()
        with contextlib.suppress(Exception):
            await ns.close()


def write_rows(opts: SinkOptions, scope: str, batches: Iterator[pa.RecordBatch]) -> SentMessages:
    """Send the task's rows (an executor's `write`)."""
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    pending: list[tuple[str, str, bytes]] = []
    sent = row = 0
    for batch in batches:
        for values in batch.to_pylist():
            topic = opts.topic or _text(values.get("topic"))
            mid = message_id(scope, partition, row)
            row += 1
            if not topic:
                raise BadRequest(f"row {mid} has no topic and the topic option is not set")
            pending.append((topic, mid, to_message(values, mid)))
        if len(pending) >= 16 * opts.send_batch:
            sent += asyncio.run(_send(opts, pending))
            pending = []
    if pending:
        sent += asyncio.run(_send(opts, pending))
    return SentMessages(sent)


class SluiceStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessages:
        ctx = TaskContext.get()
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
        if batch is None or query is None:
            raise BadRequest("the sluice stream sink runs only inside a streaming query's micro-batch")
        return write_rows(self.opts, f"{query}/{batch}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sent = sum(m.messages for m in messages if isinstance(m, SentMessages))
        log.info("micro-batch written", extra=kv(batch=batchId, messages=sent))


class SluiceBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.write_id = uuid.uuid4().hex  # fixed on the driver: a retried task gets the same ids

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentMessages:
        return write_rows(self.opts, self.write_id, iterator)
