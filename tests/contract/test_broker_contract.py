"""The `BrokerApi` contract: every test body runs against `LocalBroker` and `RemoteBroker` (conftest.py).

Covers topics and groups, send validation, where a new group starts, pop/ack/redelivery, invisible
duration changes, nack backoff, dead-lettering, FIFO groups, filters, long polling, group status,
the pull API and lookups. Waits are bounded and timing assertions generous: they say "returned
promptly" or "not before the delay", never how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from broker.client.api import (
    BackoffKind,
    BrokerApi,
    ConnectedClient,
    ConsumeFrom,
    FilterSpec,
    GroupSpec,
    OffsetPolicy,
    PopRequest,
    RetryPolicy,
    StoredMessage,
    TopicSpec,
)
from broker.filter import FilterKind
from broker.local import LocalBroker
from common.errors import (
    BadRequest,
    ConsumerGroupNotFound,
    Forbidden,
    IllegalConsumerGroup,
    IllegalFilterExpression,
    IllegalInvisibleTime,
    IllegalMessageGroup,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalTopic,
    InvalidReceiptHandle,
    MessageBodyTooLarge,
    MessageCorrupted,
    MessagePropertiesTooLarge,
    MessageTypeConflict,
    OffsetNotFound,
    PreconditionFailed,
    SluiceError,
    TopicNotFound,
)
from common.model import ALL_MESSAGE_TYPES, UNDECIDED_TYPES, MessageType, Permission, dlq_topic
from common.record import MessageRecord, encode, seal
from tests.contract.conftest import MAX_BODY_BYTES, MIN_INVISIBLE_MS, POP_MAX_BYTES, Elapse, Scope
from tests.helpers.records import outgoing

WAIT_S = 5.0
LONG_INVISIBLE_MS = 30_000  # never expires within a test
SHORT_INVISIBLE_MS = MIN_INVISIBLE_MS
QUIET_MS = 300  # how long "nothing is delivered" is watched
FIFO_TYPES = frozenset({MessageType.FIFO})


# -- helpers -----------------------------------------------------------------------------------


@contextlib.contextmanager
def expect_error(cls: type[SluiceError]) -> Iterator[None]:
    """The block raises `cls` (or a subclass) carrying `cls`'s code, so a broader class does not pass."""
    with pytest.raises(cls) as info:
        yield
    assert info.value.code == cls.code, f"expected {cls.__name__} ({cls.code!r}), got {info.value!r}"


def out(scope: Scope, body: str | bytes = b"x", **fields: object) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    return outgoing(body=data, message_id=scope.message_id(), **fields)  # type: ignore[arg-type]


def fifo(scope: Scope, group: str, body: str) -> bytes:
    return out(scope, body, message_type=MessageType.FIFO, message_group=group)


async def new_topic(api: BrokerApi, scope: Scope, queues: int = 1, types: frozenset[MessageType] | None = None) -> str:
    name = scope.topic()
    await api.create_topic(TopicSpec(name, queues, types or frozenset({MessageType.NORMAL})))
    return name


async def new_group(api: BrokerApi, scope: Scope, **spec: object) -> str:
    name = scope.group()
    await api.create_group(GroupSpec(name, **spec))  # type: ignore[arg-type]
    return name


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


async def wait_stored(api: BrokerApi, topic: str, counts: dict[int, int]) -> None:
    """Until every queue's max offset is at least its count (sends are visible after dispatch)."""

    async def stored() -> bool:
        queues = (await api.topic_status(topic)).queues
        return all(queues[q].max_offset >= n for q, n in counts.items())

    await eventually(stored, f"{counts} messages stored in {topic}")


def pop_request(group: str, topic: str, **fields: object) -> PopRequest:
    fields.setdefault("invisible_ms", LONG_INVISIBLE_MS)
    return PopRequest(group, topic, **fields)  # type: ignore[arg-type]


async def pop_n(
    api: BrokerApi, group: str, topic: str, n: int, *, timeout_s: float = WAIT_S, **fields: object
) -> list[StoredMessage]:
    """Pop until exactly `n` messages arrived (never asks for more), or fail after `timeout_s`."""
    got: list[StoredMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{len(got)} of {n} messages popped from {topic} within {timeout_s} s")
        poll_ms = max(1, int(min(remaining, 1.0) * 1000))
        got += await api.pop(pop_request(group, topic, max_messages=n - len(got), long_poll_ms=poll_ms, **fields))
    return got


async def pop_none(api: BrokerApi, group: str, topic: str, quiet_ms: int = QUIET_MS, **fields: object) -> None:
    got = await api.pop(pop_request(group, topic, long_poll_ms=quiet_ms, **fields))
    assert got == [], f"expected nothing, got {[(m.body, m.delivery_attempt) for m in got]}"


async def ack_all(api: BrokerApi, group: str, topic: str, messages: list[StoredMessage]) -> None:
    results = await api.ack(group, topic, [m.receipt_handle for m in messages])
    assert [r.ok for r in results] == [True] * len(messages), results


async def group_settled(api: BrokerApi, group: str, topic: str) -> bool:
    queues = [q for q in (await api.group_status(group)).queues if q.topic == topic]
    return bool(queues) and all(q.lag == 0 and q.in_flight == 0 for q in queues)


def bodies(messages: list[StoredMessage]) -> list[bytes]:
    return [m.body for m in messages]


# -- topics and groups -------------------------------------------------------------------------


async def test_topic_lifecycle(broker: BrokerApi, scope: Scope) -> None:
    name = scope.topic()
    spec = TopicSpec(name, 4, frozenset({MessageType.NORMAL}))
    assert await broker.create_topic(spec) == spec
    assert await broker.create_topic(spec) == spec  # idempotent
    assert await broker.get_topic(name) == spec
    assert spec in await broker.list_topics()
    status = await broker.topic_status(name)
    assert status.spec == spec and [(q.queue_id, q.min_offset, q.max_offset) for q in status.queues] == [
        (q, 0, 0) for q in range(4)
    ]
    wider = TopicSpec(name, 6, frozenset({MessageType.NORMAL, MessageType.FIFO}))
    assert await broker.update_topic(wider) == wider
    assert await broker.get_topic(name) == wider
    assert len((await broker.topic_status(name)).queues) == 6
    await broker.delete_topic(name)
    with expect_error(TopicNotFound):
        await broker.get_topic(name)
    assert name not in [t.name for t in await broker.list_topics()]
    with expect_error(TopicNotFound):
        await broker.delete_topic(name)
    with expect_error(TopicNotFound):
        await broker.update_topic(spec)
    with expect_error(TopicNotFound):
        await broker.topic_status(name)


async def test_a_topic_created_on_first_use_takes_the_cluster_s_decision(broker: BrokerApi, scope: Scope) -> None:
    """`get_topic(like=...)` (docs/shards.md): an undecided copy takes the types another broker's
    first message decided; a decided copy never changes; nothing is created where the broker does
    not create topics on first use (this one does not)."""
    name = scope.topic()
    undecided = TopicSpec(name, 2, UNDECIDED_TYPES)
    await broker.create_topic(undecided)
    assert await broker.get_topic(name, like=TopicSpec(name, 1, UNDECIDED_TYPES)) == undecided
    with expect_error(BadRequest):  # no first message decides an auto-created topic so
        await broker.get_topic(name, like=TopicSpec(name, 1, frozenset({MessageType.NORMAL})))
    lite = TopicSpec(name, 2, frozenset({MessageType.LITE}))
    assert await broker.get_topic(name, like=TopicSpec(name, 8, frozenset({MessageType.LITE}))) == lite
    assert await broker.get_topic(name, like=TopicSpec(name, 8, ALL_MESSAGE_TYPES)) == lite
    assert await broker.get_topic(name) == lite
    absent = scope.topic()
    with expect_error(TopicNotFound):
        await broker.get_topic(absent, auto_create=True, like=TopicSpec(absent, 1, ALL_MESSAGE_TYPES))
    with expect_error(TopicNotFound):
        await broker.get_topic("%DLQ%" + scope.group(), auto_create=True)


@pytest.mark.parametrize("bad", ["", "has space", "x" * 128, "%SYSTEM", "semi;colon"])
async def test_topic_bad_names(broker: BrokerApi, bad: str) -> None:
    with expect_error(IllegalTopic):
        await broker.create_topic(TopicSpec(bad, 1))


async def test_topic_bad_specs(broker: BrokerApi, scope: Scope) -> None:
    for queues in (0, -1, 100_000):
        with expect_error(BadRequest):
            await broker.create_topic(TopicSpec(scope.topic(), queues))
    with expect_error(BadRequest):
        await broker.create_topic(TopicSpec(scope.topic(), 1, frozenset()))


async def test_group_lifecycle(broker: BrokerApi, scope: Scope) -> None:
    name = scope.group()
    spec = GroupSpec(name, max_delivery_attempts=5)
    info = await broker.create_group(spec)
    assert info.spec == spec and info.created_ms > 0
    assert await broker.create_group(spec) == info  # idempotent, creation time kept
    assert await broker.get_group(name) == info
    assert info in await broker.list_groups()
    policy = RetryPolicy(BackoffKind.CUSTOMIZED, customized_ms=(100, 200))
    changed = GroupSpec(name, fifo=True, max_delivery_attempts=3, retry_policy=policy)
    updated = await broker.update_group(changed)
    assert updated.spec == changed and updated.created_ms == info.created_ms
    assert (await broker.get_group(name)).spec == changed
    await broker.delete_group(name)
    with expect_error(ConsumerGroupNotFound):
        await broker.get_group(name)
    assert name not in [g.spec.name for g in await broker.list_groups()]
    with expect_error(ConsumerGroupNotFound):
        await broker.delete_group(name)
    with expect_error(ConsumerGroupNotFound):
        await broker.update_group(spec)
    with expect_error(ConsumerGroupNotFound):
        await broker.group_status(name)


async def test_group_bad_names_and_specs(broker: BrokerApi, scope: Scope) -> None:
    for bad in ("", "a b", "%RETRY%x", "y" * 128):
        with expect_error(IllegalConsumerGroup):
            await broker.create_group(GroupSpec(bad))
    for spec in (
        GroupSpec(scope.group(), max_delivery_attempts=0),
        GroupSpec(scope.group(), retry_policy=RetryPolicy(BackoffKind.CUSTOMIZED, customized_ms=())),
        GroupSpec(scope.group(), retry_policy=RetryPolicy(initial_ms=500, max_ms=100)),
    ):
        with expect_error(BadRequest):
            await broker.create_group(spec)


# -- send --------------------------------------------------------------------------------------


async def test_send_assigns_offsets_per_queue(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    singles = [out(scope, f"s{i}") for i in range(3)]
    for i, m in enumerate(singles):
        [result] = await broker.send(topic, 0, [m])
        assert (result.message_id, result.queue_id, result.queue_offset) == (m.message_id, 0, i)
    batch = [out(scope, f"b{i}") for i in range(3)]
    results = await broker.send(topic, 1, batch)
    assert [(r.message_id, r.queue_id, r.queue_offset) for r in results] == [
        (m.message_id, 1, i) for i, m in enumerate(batch)
    ]
    [after] = await broker.send(topic, 0, [out(scope, "s3")])
    assert after.queue_offset == 3
    await wait_stored(broker, topic, {0: 4, 1: 3})


async def test_send_rejects_bad_targets(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    with expect_error(TopicNotFound):
        await broker.send(scope.topic(), 0, [out(scope)])
    for queue_id in (2, -1):
        with expect_error(BadRequest):
            await broker.send(topic, queue_id, [out(scope)])
    with expect_error(BadRequest):
        await broker.send(topic, 0, [])


async def test_send_validates_messages(broker: BrokerApi, scope: Scope) -> None:
    normal = await new_topic(broker, scope)
    ordered = await new_topic(broker, scope, types=FIFO_TYPES)
    cases: list[tuple[str, bytes, type[SluiceError]]] = [
        (normal, fifo(scope, "g", "x"), MessageTypeConflict),
        (ordered, out(scope), MessageTypeConflict),
        (ordered, out(scope, message_type=MessageType.FIFO), IllegalMessageGroup),
        (ordered, out(scope, message_type=MessageType.FIFO, message_group=" "), IllegalMessageGroup),
        (normal, out(scope, b"x" * (MAX_BODY_BYTES + 1)), MessageBodyTooLarge),
        (normal, out(scope, properties={f"p{i}": "v" for i in range(129)}), MessagePropertiesTooLarge),
        (normal, out(scope, tag="a||b"), IllegalMessageTag),
        (normal, out(scope, keys=("",)), IllegalMessageKey),
        (normal, out(scope, keys=tuple(f"k{i}" for i in range(33))), IllegalMessageKey),
    ]
    for topic, message, error in cases:
        with expect_error(error):
            await broker.send(topic, 0, [message])
    # A batch with one bad message stores nothing.
    with expect_error(MessageBodyTooLarge):
        await broker.send(normal, 0, [out(scope, "fine"), out(scope, b"x" * (MAX_BODY_BYTES + 1))])
    assert (await broker.send(normal, 0, [out(scope, b"x" * MAX_BODY_BYTES)]))[0].queue_offset == 0
    with expect_error(IllegalMessageTag):  # a record has no empty tag: the encoder refuses one
        out(scope, tag="")


async def test_an_empty_body_is_stored_and_delivered(broker: BrokerApi, scope: Scope) -> None:
    """AMQP publishes may have no body (signals, headers-only messages): the store carries one, in
    a batch with others too, and pops and pulls hand it back empty. (The RocketMQ edge refuses an
    empty body itself, MESSAGE_BODY_EMPTY: tests/e2e/test_bad_input.py.)"""
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    stored = await broker.send(topic, 0, [out(scope, b""), out(scope, "after"), out(scope, b"")])
    assert [r.queue_offset for r in stored] == [0, 1, 2]
    assert bodies(await pop_n(broker, group, topic, 3)) == [b"", b"after", b""]
    pulled = await broker.pull(group, topic, 0, 0, 10, FilterSpec())
    assert bodies(pulled.messages) == [b"", b"after", b""]


async def test_a_pop_carries_about_max_batch_bytes(broker: BrokerApi, scope: Scope) -> None:
    """One pop takes messages up to `read.max_batch_bytes` of records (past its first), however many
    it may take: with 16 MiB AMQP bodies, 32 of them would pass the internal RPC's limit, and the
    pop would fail every time (before: 32 messages, whatever their size). The rest comes with the
    next pops, in order."""
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    sent = [out(scope, bytes([i]) * MAX_BODY_BYTES) for i in range(40)]
    await broker.send(topic, 0, sent[:20])
    await broker.send(topic, 0, sent[20:])
    first = await broker.pop(pop_request(group, topic, max_messages=32))
    assert 1 < len(first) < 32
    assert sum(m.record.size for m in first) <= POP_MAX_BYTES + max(m.record.size for m in first)
    rest = await pop_n(broker, group, topic, 40 - len(first))
    assert [m.body[0] for m in first + rest] == list(range(40))


async def test_send_verifies_records(broker: BrokerApi, scope: Scope) -> None:
    """A send's records are verified as a replica verifies copied ones, and must be as an edge
    writes them (no topic, store host, queue or offsets): anything else is MESSAGE_CORRUPTED and
    nothing of the send is stored."""
    topic = await new_topic(broker, scope)
    good = bytes(out(scope, "good"))
    flipped = bytearray(good)
    flipped[-1] ^= 1  # the body no longer matches the CRC
    placed = bytearray(encode(MessageRecord(topic, 0, b"x", "id")))  # a record that names its topic
    seal(placed, 0, 0, 0)
    for bad in (bytes(flipped), good[:-1], good + b"!", b"\x00" * 8, bytes(placed)):
        with expect_error(MessageCorrupted):
            await broker.send(topic, 0, [good, bad])
    assert (await broker.send(topic, 0, [good]))[0].queue_offset == 0


# -- where a new group starts ------------------------------------------------------------------


async def test_new_group_starts_at_latest(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    await broker.send(topic, 0, [out(scope, "before")])
    await wait_stored(broker, topic, {0: 1})
    await asyncio.sleep(0.02)  # store times are in ms: keep "before" strictly older than the group
    group = await new_group(broker, scope, consume_from=ConsumeFrom.LATEST)
    await asyncio.sleep(0.02)
    await broker.send(topic, 1, [out(scope, "after1")])
    await broker.send(topic, 0, [out(scope, "after0")])
    assert sorted(bodies(await pop_n(broker, group, topic, 2))) == [b"after0", b"after1"]
    await pop_none(broker, group, topic)


async def test_new_group_starts_at_earliest(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    await broker.send(topic, 0, [out(scope, "a"), out(scope, "b")])
    await broker.send(topic, 1, [out(scope, "c")])
    await wait_stored(broker, topic, {0: 2, 1: 1})
    group = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    assert sorted(bodies(await pop_n(broker, group, topic, 3))) == [b"a", b"b", b"c"]


async def test_new_group_starts_at_timestamp(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    await broker.send(topic, 0, [out(scope, "old")])
    await wait_stored(broker, topic, {0: 1})
    await asyncio.sleep(0.03)
    since_ms = time.time_ns() // 1_000_000
    await asyncio.sleep(0.03)
    await broker.send(topic, 0, [out(scope, "new1"), out(scope, "new2")])
    await wait_stored(broker, topic, {0: 3})
    group = await new_group(broker, scope, consume_from=ConsumeFrom.TIMESTAMP, consume_from_timestamp_ms=since_ms)
    assert bodies(await pop_n(broker, group, topic, 2)) == [b"new1", b"new2"]
    await pop_none(broker, group, topic)


# -- pop and ack -------------------------------------------------------------------------------


async def test_pop_delivers_each_message_once(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    topic = await new_topic(broker, scope, queues=4)
    group = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    sent: dict[str, bytes] = {}
    for q in range(4):
        for i in range(3):
            one = out(scope, f"q{q}m{i}", tag="T", keys=(f"k{q}",), properties={"q": str(q)})
            sent[one.message_id] = one
            await broker.send(topic, q, [one])
    before_ms = time.time_ns() // 1_000_000
    got = await pop_n(broker, group, topic, 12, invisible_ms=SHORT_INVISIBLE_MS)
    assert sorted(m.message_id for m in got) == sorted(sent)
    for m in got:
        original = sent[m.message_id]
        assert (m.topic, m.body, m.tag, m.keys, m.properties) == (
            topic, original.body, original.tag, original.keys, original.properties,
        )  # fmt: skip
        assert m.delivery_attempt == 1 and m.receipt_handle
        assert m.invisible_until_ms >= before_ms + SHORT_INVISIBLE_MS
        assert m.queue_offset == int(m.body.decode()[-1])  # per-queue offsets 0, 1, 2
    assert len({m.receipt_handle for m in got}) == 12
    await ack_all(broker, group, topic, got)
    await elapse(SHORT_INVISIBLE_MS / 1000 * 1.5)  # past the invisibility: acked stays acked
    await pop_none(broker, group, topic)
    results = await broker.ack(group, topic, [got[0].receipt_handle])
    assert isinstance(results[0].error, InvalidReceiptHandle)


async def test_ack_rejects_bad_handles(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    other_topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    other_group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, "a"), out(scope, "b")])
    first, second = await pop_n(broker, group, topic, 2)
    # receipt.py: "<broker name>~<payload>"; a handle of another broker must not be taken for ours.
    foreign = "other-broker~" + first.receipt_handle.rpartition("~")[2]
    attempts = [
        (group, topic, "garbage"),
        (group, topic, ""),
        (group, topic, foreign),
        (other_group, topic, first.receipt_handle),
        (group, other_topic, first.receipt_handle),
    ]
    for g, t, handle in attempts:
        [result] = await broker.ack(g, t, [handle])
        assert result.receipt_handle == handle and not result.ok
        # The error itself, the same class from both implementations (the remote one rebuilds it)
        assert isinstance(result.error, InvalidReceiptHandle) and result.error.message
    # Mixed batch: per-entry results, in order; the failed entries do not spoil the good one.
    results = await broker.ack(group, topic, ["nope", first.receipt_handle, first.receipt_handle])
    assert [type(r.error) for r in results] == [InvalidReceiptHandle, type(None), InvalidReceiptHandle]
    with expect_error(ConsumerGroupNotFound):
        await broker.ack(scope.group(), topic, [second.receipt_handle])
    await ack_all(broker, group, topic, [second])


async def test_topic_permissions(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    await broker.update_topic(TopicSpec(topic, 1, permission=Permission.READ))
    with expect_error(Forbidden):
        await broker.send(topic, 0, [out(scope)])
    await broker.update_topic(TopicSpec(topic, 1, permission=Permission.WRITE))
    await broker.send(topic, 0, [out(scope, "w")])
    with expect_error(Forbidden):
        await broker.pop(pop_request(group, topic))
    await broker.update_topic(TopicSpec(topic, 1))
    assert bodies(await pop_n(broker, group, topic, 1)) == [b"w"]


async def test_pop_rejects_bad_requests(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope)
    with expect_error(ConsumerGroupNotFound):
        await broker.pop(pop_request(scope.group(), topic))
    with expect_error(TopicNotFound):
        await broker.pop(pop_request(group, scope.topic()))
    with expect_error(BadRequest):
        await broker.pop(pop_request(group, topic, queue_id=2))
    with expect_error(IllegalInvisibleTime):
        await broker.pop(pop_request(group, topic, invisible_ms=MIN_INVISIBLE_MS - 1))


# -- invisibility, invisible-duration changes, nack --------------------------------------------


async def test_expired_invisibility_redelivers(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    sent = out(scope, "payload", tag="TagA", keys=("k1", "k2"), properties={"a": "1", "b": "two"})
    await broker.send(topic, 0, [sent])
    [first] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    assert first.delivery_attempt == 1
    await elapse(SHORT_INVISIBLE_MS / 1000)
    [again] = await pop_n(broker, group, topic, 1, invisible_ms=LONG_INVISIBLE_MS)
    assert again.delivery_attempt == 2
    assert (again.message_id, again.body, again.tag, again.keys, again.properties) == (
        sent.message_id, sent.body, sent.tag, sent.keys, sent.properties,
    )  # fmt: skip
    assert (again.queue_id, again.queue_offset) == (first.queue_id, first.queue_offset)
    assert again.receipt_handle != first.receipt_handle
    [stale] = await broker.ack(group, topic, [first.receipt_handle])
    assert isinstance(stale.error, InvalidReceiptHandle)
    await ack_all(broker, group, topic, [again])
    await eventually(lambda: group_settled(broker, group, topic), "lag 0 after the ack")


async def test_change_invisible_duration(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, "m")])
    [m] = await pop_n(broker, group, topic, 1)
    shorter = await broker.change_invisible_duration(group, topic, m.receipt_handle, SHORT_INVISIBLE_MS)
    assert shorter and shorter != m.receipt_handle
    [old] = await broker.ack(group, topic, [m.receipt_handle])
    assert isinstance(old.error, InvalidReceiptHandle)
    with expect_error(InvalidReceiptHandle):
        await broker.change_invisible_duration(group, topic, m.receipt_handle, SHORT_INVISIBLE_MS)
    await elapse(SHORT_INVISIBLE_MS / 1000)
    [again] = await pop_n(broker, group, topic, 1)  # the shorter duration took effect
    assert again.delivery_attempt == 2 and again.message_id == m.message_id
    with expect_error(IllegalInvisibleTime):
        await broker.change_invisible_duration(group, topic, again.receipt_handle, 100 * 24 * 3600 * 1000)
    longer = await broker.change_invisible_duration(group, topic, again.receipt_handle, LONG_INVISIBLE_MS)
    await elapse(SHORT_INVISIBLE_MS * 2 / 1000)
    await pop_none(broker, group, topic)
    [res] = await broker.ack(group, topic, [longer])
    assert res.ok


async def test_renew_extends_invisibility_and_keeps_the_handle(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, "m")])
    [m] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    results = await broker.renew(group, topic, [m.receipt_handle, "garbage"], LONG_INVISIBLE_MS)
    assert [type(r.error) for r in results] == [type(None), InvalidReceiptHandle]
    await elapse(SHORT_INVISIBLE_MS * 2 / 1000)
    await pop_none(broker, group, topic)  # not redelivered: renewed
    with expect_error(IllegalInvisibleTime):
        await broker.renew(group, topic, [m.receipt_handle], 0)
    await ack_all(broker, group, topic, [m])  # the handle from the delivery still acks


async def test_shorter_deadline_behind_a_longer_one_is_redelivered(
    broker: BrokerApi, scope: Scope, elapse: Elapse
) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, "held")])
    [held] = await pop_n(broker, group, topic, 1)  # in flight for LONG_INVISIBLE_MS
    await pop_none(broker, group, topic, quiet_ms=50)  # the broker has looked at the due messages since
    await broker.send(topic, 0, [out(scope, "short")])
    [short] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)  # due before "held"
    await elapse(SHORT_INVISIBLE_MS / 1000)
    [again] = await pop_n(broker, group, topic, 1)
    assert (short.body, again.body, again.delivery_attempt) == (b"short", b"short", 2)
    await ack_all(broker, group, topic, [held, again])
    await pop_none(broker, group, topic, quiet_ms=50)  # nothing in flight now
    await broker.send(topic, 0, [out(scope, "after")])
    [after] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    await elapse(SHORT_INVISIBLE_MS / 1000)
    [after_again] = await pop_n(broker, group, topic, 1)
    assert (after.body, after_again.body, after_again.delivery_attempt) == (b"after", b"after", 2)


@pytest.mark.parametrize(
    "policy",
    [
        RetryPolicy(BackoffKind.CUSTOMIZED, customized_ms=(400, 700)),
        RetryPolicy(BackoffKind.EXPONENTIAL, initial_ms=350, max_ms=5_000, multiplier=2.0),
    ],
    ids=["customized", "exponential"],
)
async def test_nack_waits_for_the_retry_policy(
    broker: BrokerApi, scope: Scope, policy: RetryPolicy, elapse: Elapse
) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope, retry_policy=policy)
    await broker.send(topic, 0, [out(scope, "m")])
    [m] = await pop_n(broker, group, topic, 1)
    for attempt in (1, 2):
        delay_ms = policy.delay_ms(attempt)
        assert await broker.nack(group, topic, m.receipt_handle)
        await pop_none(broker, group, topic, quiet_ms=delay_ms // 4)  # invisible for the retry delay
        await elapse(delay_ms / 1000)
        [m] = await pop_n(broker, group, topic, 1)  # then visible again
        assert m.delivery_attempt == attempt + 1
    await ack_all(broker, group, topic, [m])


# -- dead letters ------------------------------------------------------------------------------


async def dlq_messages(api: BrokerApi, scope: Scope, group: str, n: int) -> list[StoredMessage]:
    reader = await new_group(api, scope, consume_from=ConsumeFrom.EARLIEST)
    await eventually(lambda: _has_topic(api, dlq_topic(group)), f"{dlq_topic(group)} exists")
    return await pop_n(api, reader, dlq_topic(group), n)


async def _has_topic(api: BrokerApi, name: str) -> bool:
    return name in [t.name for t in await api.list_topics()]


async def test_exhausted_messages_go_to_the_dead_letter_topic(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    policy = RetryPolicy(BackoffKind.CUSTOMIZED, customized_ms=(50,))
    group = await new_group(broker, scope, max_delivery_attempts=2, retry_policy=policy)
    sent = [
        out(scope, "nacked", tag="T1", keys=("k1",), properties={"p": "1"}),
        out(scope, "expired", tag="T2", keys=("k2", "k3"), properties={"p": "2"}),
        out(scope, "fine"),
    ]
    await broker.send(topic, 0, sent)
    by_body = {m.body: m for m in await pop_n(broker, group, topic, 3, invisible_ms=SHORT_INVISIBLE_MS)}
    await ack_all(broker, group, topic, [by_body[b"fine"]])
    await broker.nack(group, topic, by_body[b"nacked"].receipt_handle)
    second = await pop_n(broker, group, topic, 2, invisible_ms=SHORT_INVISIBLE_MS)
    assert {(m.body, m.delivery_attempt) for m in second} == {(b"nacked", 2), (b"expired", 2)}
    nacked = next(m for m in second if m.body == b"nacked")
    await broker.nack(group, topic, nacked.receipt_handle)  # the last attempt failed too
    dead = {m.message_id: m for m in await dlq_messages(broker, scope, group, 2)}
    for original in sent[:2]:
        m = dead[original.message_id]
        assert (m.body, m.tag, m.keys, m.properties) == (
            original.body,
            original.tag,
            original.keys,
            original.properties,
        )
    await pop_none(broker, group, topic)
    await eventually(lambda: group_settled(broker, group, topic), "lag 0 once everything is dead-lettered")


async def test_forward_to_dead_letter(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope)
    sent = out(scope, "poison", tag="bad", keys=("k",), properties={"why": "poison"})
    await broker.send(topic, 1, [sent])
    [m] = await pop_n(broker, group, topic, 1)
    await broker.forward_to_dead_letter(group, topic, m.receipt_handle)
    [stale] = await broker.ack(group, topic, [m.receipt_handle])
    assert isinstance(stale.error, InvalidReceiptHandle)
    with expect_error(InvalidReceiptHandle):
        await broker.forward_to_dead_letter(group, topic, m.receipt_handle)
    [dead] = await dlq_messages(broker, scope, group, 1)
    assert (dead.message_id, dead.body, dead.tag, dead.keys, dead.properties) == (
        sent.message_id, sent.body, sent.tag, sent.keys, sent.properties,
    )  # fmt: skip
    await eventually(lambda: group_settled(broker, group, topic), "lag 0 after dead-lettering")


# -- FIFO --------------------------------------------------------------------------------------


async def test_fifo_group_orders_each_message_group(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, types=FIFO_TYPES)
    group = await new_group(broker, scope, fifo=True)
    await broker.send(topic, 0, [fifo(scope, mg, f"{mg}{i}") for i in range(3) for mg in ("A", "B")])
    heads = await pop_n(broker, group, topic, 2)
    assert sorted(bodies(heads)) == [b"A0", b"B0"]
    await pop_none(broker, group, topic)  # A1, B1 are withheld while A0, B0 are in flight
    a0 = next(m for m in heads if m.body == b"A0")
    b0 = next(m for m in heads if m.body == b"B0")
    await ack_all(broker, group, topic, [a0])
    [a1] = await pop_n(broker, group, topic, 1)  # A flows while B0 is still in flight
    assert a1.body == b"A1" and a1.delivery_attempt == 1
    await broker.change_invisible_duration(group, topic, b0.receipt_handle, 0)  # B0 expires now
    [b0_again] = await pop_n(broker, group, topic, 1)
    assert (b0_again.body, b0_again.delivery_attempt) == (b"B0", 2)  # redelivered before B1
    await ack_all(broker, group, topic, [a1, b0_again])
    rest = await pop_n(broker, group, topic, 2)
    assert sorted(bodies(rest)) == [b"A2", b"B1"]
    await ack_all(broker, group, topic, rest)
    [b2] = await pop_n(broker, group, topic, 1)
    assert b2.body == b"B2"
    await ack_all(broker, group, topic, [b2])
    await eventually(lambda: group_settled(broker, group, topic), "lag 0 after the FIFO run")


async def test_fifo_expiry_redelivers_before_successors(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    topic = await new_topic(broker, scope, queues=2, types=FIFO_TYPES)
    group = await new_group(broker, scope, fifo=True)
    await broker.send(topic, 1, [fifo(scope, "G", f"G{i}") for i in range(3)])
    [g0] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    assert g0.body == b"G0"
    await pop_none(broker, group, topic, quiet_ms=50)  # G1 waits while G0 is in flight
    await elapse(SHORT_INVISIBLE_MS / 1000)
    seen = [(m.body, m.delivery_attempt) for m in await pop_n(broker, group, topic, 1)]
    assert seen == [(b"G0", 2)]


async def test_fifo_dead_letter_releases_the_next_message(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, types=FIFO_TYPES)
    group = await new_group(broker, scope, fifo=True, max_delivery_attempts=1)
    await broker.send(topic, 0, [fifo(scope, "G", "G0"), fifo(scope, "G", "G1")])
    [g0] = await pop_n(broker, group, topic, 1, invisible_ms=SHORT_INVISIBLE_MS)
    [g1] = await pop_n(broker, group, topic, 1)  # G0 expired with no attempts left: dead-lettered
    assert (g0.body, g1.body, g1.delivery_attempt) == (b"G0", b"G1", 1)
    [dead] = await dlq_messages(broker, scope, group, 1)
    assert dead.message_id == g0.message_id


async def test_normal_group_on_fifo_topic_is_not_ordered(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, types=FIFO_TYPES)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [fifo(scope, "A", f"A{i}") for i in range(3)])
    assert bodies(await pop_n(broker, group, topic, 3)) == [b"A0", b"A1", b"A2"]


# -- filters -----------------------------------------------------------------------------------


async def test_tag_filter(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope)
    tags = ["A", "C", None, "B", "AB", "A", "C"]
    for i, tag in enumerate(tags):
        await broker.send(topic, i % 2, [out(scope, f"{i}", tag=tag)])
    await wait_stored(broker, topic, {0: 4, 1: 3})
    spec = FilterSpec(FilterKind.TAG, "A || B")
    got = await pop_n(broker, group, topic, 3, filter=spec)
    assert sorted((m.tag, m.body) for m in got) == [("A", b"0"), ("A", b"5"), ("B", b"3")]
    await ack_all(broker, group, topic, got)
    await pop_none(broker, group, topic, filter=spec)
    await eventually(lambda: group_settled(broker, group, topic), "filtered-out messages do not hold the lag")


async def test_sql_filter(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    props = [{"region": "eu", "amount": "150"}, {"region": "us", "amount": "500"}, {"region": "eu", "amount": "99"},
             {"amount": "1000"}, {"region": "eu", "amount": "100.5"}, {"region": "eu"}]  # fmt: skip
    await broker.send(topic, 0, [out(scope, f"{i}", properties=p) for i, p in enumerate(props)])
    await wait_stored(broker, topic, {0: len(props)})
    spec = FilterSpec(FilterKind.SQL, "region = 'eu' AND amount > 100")
    got = await pop_n(broker, group, topic, 2, filter=spec)
    assert bodies(got) == [b"0", b"4"]
    await ack_all(broker, group, topic, got)
    await pop_none(broker, group, topic, filter=spec)
    await eventually(lambda: group_settled(broker, group, topic), "filtered-out messages do not hold the lag")


async def test_invalid_filter_expressions(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    for spec in (FilterSpec(FilterKind.TAG, "A || || B"), FilterSpec(FilterKind.SQL, "a >"),
                 FilterSpec(FilterKind.SQL, "a == 1")):  # fmt: skip
        with expect_error(IllegalFilterExpression):
            await broker.pop(pop_request(group, topic, filter=spec))
        with expect_error(IllegalFilterExpression):
            await broker.pull(group, topic, 0, 0, 1, spec)


# -- long polling ------------------------------------------------------------------------------


async def test_long_poll_returns_when_a_message_arrives(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope)
    long_poll_s = 8.0

    async def send_later() -> None:
        await asyncio.sleep(0.3)
        await broker.send(topic, 1, [out(scope, "late")])

    started = time.monotonic()
    sender = asyncio.create_task(send_later())
    got = await broker.pop(pop_request(group, topic, long_poll_ms=int(long_poll_s * 1000)))
    elapsed = time.monotonic() - started
    await sender
    assert bodies(got) == [b"late"]
    assert elapsed < long_poll_s / 2, f"long poll took {elapsed:.2f} s although a message arrived after 0.3 s"


async def test_empty_long_poll_waits_its_time(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    started = time.monotonic()
    assert await broker.pop(pop_request(group, topic, long_poll_ms=600)) == []
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 4.0, f"an empty 0.6 s long poll took {elapsed:.2f} s"


async def test_long_poll_wakes_on_ack_in_fifo_group(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, types=FIFO_TYPES)
    group = await new_group(broker, scope, fifo=True)
    await broker.send(topic, 0, [fifo(scope, "G", "G0"), fifo(scope, "G", "G1")])
    [g0] = await pop_n(broker, group, topic, 1)

    async def ack_later() -> None:
        await asyncio.sleep(0.3)
        await ack_all(broker, group, topic, [g0])

    started = time.monotonic()
    acker = asyncio.create_task(ack_later())
    got = await broker.pop(pop_request(group, topic, long_poll_ms=8000))
    await acker
    assert bodies(got) == [b"G1"] and time.monotonic() - started < 4.0


# -- group status ------------------------------------------------------------------------------


async def test_group_status_tracks_lag_in_flight_and_retries(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=3)
    group = await new_group(broker, scope)
    for q, n in enumerate((2, 0, 3)):
        if n:
            await broker.send(topic, q, [out(scope, f"{q}-{i}") for i in range(n)])
    await wait_stored(broker, topic, {0: 2, 2: 3})
    assert (await broker.topic_status(topic)).local_bytes >= 5 * len(b"0-0")  # records carry headers too
    got = await pop_n(broker, group, topic, 5)
    status = {q.queue_id: q for q in (await broker.group_status(group)).queues if q.topic == topic}
    assert {(q, s.in_flight, s.lag, s.max_offset, s.retrying) for q, s in status.items() if s.max_offset} == {
        (0, 2, 2, 2, 0), (2, 3, 3, 3, 0),
    }  # fmt: skip
    await broker.nack(group, topic, got[0].receipt_handle)  # delivered again: a retry
    again = await pop_n(broker, group, topic, 1)
    assert again[0].delivery_attempt == 2
    status = {q.queue_id: q for q in (await broker.group_status(group)).queues if q.topic == topic}
    assert {s.queue_id: s.retrying for s in status.values() if s.retrying} == {got[0].queue_id: 1}
    assert (await broker.topic_status(topic)).delivered == 6  # five deliveries and one retry
    await ack_all(broker, group, topic, got[1:] + again)
    await eventually(lambda: group_settled(broker, group, topic), "lag and in-flight 0 after the acks")
    status = {q.queue_id: q for q in (await broker.group_status(group)).queues if q.topic == topic}
    assert status[0].consumed_offset == 2 and status[2].consumed_offset == 3


async def test_broker_info_reports_version_uptime_disk_and_store(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=1)
    await broker.send(topic, 0, [out(scope, "x")])
    await wait_stored(broker, topic, {0: 1})
    info = await broker.broker_info()
    assert info.version and 0 < info.started_ms <= time.time() * 1000
    assert 0 < info.disk_used_bytes <= info.disk_total_bytes
    assert info.store_bytes > 0
    assert min(info.unflushed_bytes, info.dispatch_lag_bytes, info.dispatch_lag_ms) >= 0


# -- pull and offsets --------------------------------------------------------------------------


async def test_pull_and_offsets(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, "0", tag="A"), out(scope, "1", tag="B")])
    await wait_stored(broker, topic, {0: 2})
    await asyncio.sleep(0.03)
    middle_ms = time.time_ns() // 1_000_000
    await asyncio.sleep(0.03)
    await broker.send(topic, 0, [out(scope, str(i), tag="A") for i in range(2, 5)])
    await wait_stored(broker, topic, {0: 5})
    everything = FilterSpec()
    first = await broker.pull(group, topic, 0, 0, 3, everything)
    assert (bodies(first.messages), first.next_offset, first.min_offset, first.max_offset) == (
        [b"0", b"1", b"2"], 3, 0, 5,
    )  # fmt: skip
    assert [m.queue_offset for m in first.messages] == [0, 1, 2]
    rest = await broker.pull(group, topic, 0, first.next_offset, 10, everything)
    assert (bodies(rest.messages), rest.next_offset) == ([b"3", b"4"], 5)
    end = await broker.pull(group, topic, 0, 5, 10, everything)
    assert (end.messages, end.next_offset) == ([], 5)
    beyond = await broker.pull(group, topic, 0, 50, 10, everything)
    assert (beyond.messages, beyond.next_offset) == ([], 5)
    tagged = await broker.pull(group, topic, 0, 0, 10, FilterSpec(FilterKind.TAG, "B"))
    assert bodies(tagged.messages) == [b"1"]
    with expect_error(OffsetNotFound):
        await broker.get_offset(group, topic, 0)
    await broker.update_offset(group, topic, 0, 3)
    assert await broker.get_offset(group, topic, 0) == 3
    await broker.update_offset(group, topic, 0, 4)
    assert await broker.get_offset(group, topic, 0) == 4
    assert await broker.query_offset(topic, 0, OffsetPolicy.BEGINNING) == 0
    assert await broker.query_offset(topic, 0, OffsetPolicy.END) == 5
    assert await broker.query_offset(topic, 0, OffsetPolicy.TIMESTAMP, middle_ms) == 2
    assert await broker.query_offset(topic, 1, OffsetPolicy.END) == 0
    with expect_error(BadRequest):
        await broker.pull(group, topic, 2, 0, 10, everything)
    with expect_error(TopicNotFound):
        await broker.query_offset(scope.topic(), 0, OffsetPolicy.END)


async def test_pulls_count_as_deliveries_but_admin_browsing_does_not(broker: BrokerApi, scope: Scope) -> None:
    """A topic's rate out (`topic_status().delivered`) counts what consumers read, not the admin
    tool's or console's own reads (message search, dead-letter listing, tail without a group)."""
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, str(i)) for i in range(3)])
    await wait_stored(broker, topic, {0: 3})
    before = (await broker.topic_status(topic)).delivered
    for browser in ("sluice-admin-browse", "sluice-admin-dlq-browse"):
        assert len((await broker.pull(browser, topic, 0, 0, 10, FilterSpec())).messages) == 3
    assert (await broker.topic_status(topic)).delivered == before
    assert len((await broker.pull(group, topic, 0, 0, 10, FilterSpec())).messages) == 3
    assert (await broker.topic_status(topic)).delivered == before + 3


async def test_pull_long_polls(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope)

    async def send_later() -> None:
        await asyncio.sleep(0.3)
        await broker.send(topic, 0, [out(scope, "late")])

    started = time.monotonic()
    sender = asyncio.create_task(send_later())
    result = await broker.pull(group, topic, 0, 0, 10, FilterSpec(), long_poll_ms=8000)
    await sender
    assert bodies(result.messages) == [b"late"] and result.next_offset == 1
    assert time.monotonic() - started < 4.0


# -- lookups -----------------------------------------------------------------------------------


async def test_lookup_by_message_id_and_key(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    a = out(scope, "a", keys=("order-1", "shared"))
    b = out(scope, "b", keys=("shared",))
    await broker.send(topic, 0, [a])
    await broker.send(topic, 1, [b])
    await wait_stored(broker, topic, {0: 1, 1: 1})

    async def found() -> bool:
        return len(await broker.find_messages_by_key(topic, "shared")) == 2

    await eventually(found, "both messages indexed by key")
    [by_id] = await broker.get_message(topic, a.message_id)
    assert (by_id.message_id, by_id.body, by_id.keys, by_id.queue_id, by_id.queue_offset) == (
        a.message_id, b"a", ("order-1", "shared"), 0, 0,
    )  # fmt: skip
    assert await broker.get_message(topic, scope.message_id()) == []
    assert bodies(await broker.find_messages_by_key(topic, "order-1")) == [b"a"]
    assert sorted(bodies(await broker.find_messages_by_key(topic, "shared"))) == [b"a", b"b"]
    assert await broker.find_messages_by_key(topic, "missing") == []
    assert await broker.get_message(await new_topic(broker, scope), a.message_id) == []


async def test_tier_calls_without_tiering_explain_how_to_enable_it(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope)
    status = await broker.tier_status()
    assert (status.enabled, status.store, status.topics) == (False, "", ())
    for call in (broker.tier_upload_now(topic, 5.0), broker.tier_evict_local(topic)):
        with pytest.raises(PreconditionFailed, match=r"\[broker.tiering\] bucket"):
            await call


# -- operations: offset reset, group status of topics never consumed, client reports -------------


async def test_reset_offset_moves_consumption_and_forgets_in_flight(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope)
    await broker.send(topic, 0, [out(scope, str(i)) for i in range(4)])
    await wait_stored(broker, topic, {0: 4})
    held = await pop_n(broker, group, topic, 4)  # all in flight, none acked
    reset = await broker.reset_offset(group, topic, 0, 1)
    assert (reset.topic, reset.queue_id, reset.previous, reset.offset) == (topic, 0, 0, 1)
    again = await pop_n(broker, group, topic, 3)  # offsets 1..3 again, as first deliveries
    assert bodies(again) == [b"1", b"2", b"3"] and {m.delivery_attempt for m in again} == {1}
    stale = await broker.ack(group, topic, [held[0].receipt_handle])
    assert not stale[0].ok  # the reset forgot it: its handle no longer acks anything
    await ack_all(broker, group, topic, again)
    assert (await broker.reset_offset(group, topic, 0, 99)).offset == 4  # clamped to the stored range
    assert await broker.get_offset(group, topic, 0) == 4  # the pull offset moved too
    await pop_none(broker, group, topic)
    with expect_error(BadRequest):
        await broker.reset_offset(group, topic, 2, 0)
    with expect_error(BadRequest):
        await broker.reset_offset(group, topic, 0, -1)
    with expect_error(ConsumerGroupNotFound):
        await broker.reset_offset(scope.group(), topic, 0, 0)
    with expect_error(TopicNotFound):
        await broker.reset_offset(group, scope.topic(), 0, 0)


async def test_group_status_counts_named_topics_never_consumed(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, queues=2)
    group = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    await broker.send(topic, 1, [out(scope, "a"), out(scope, "b")])
    await wait_stored(broker, topic, {1: 2})
    assert [q for q in (await broker.group_status(group)).queues if q.topic == topic] == []
    named = {q.queue_id: q.lag for q in (await broker.group_status(group, [topic, scope.topic()])).queues}
    assert named == {0: 0, 1: 2}  # from the group's start position; an unknown topic is left out


async def test_group_status_counts_the_body_bytes_of_ready_messages(
    broker: BrokerApi, scope: Scope, elapse: Elapse
) -> None:
    """`ready_bytes` (asked for): the bodies of the never-delivered messages and of the requeued
    ones; in-flight and acknowledged messages do not count (an AMQP queue's x-max-length-bytes)."""
    topic = await new_topic(broker, scope)
    group = await new_group(broker, scope, consume_from=ConsumeFrom.EARLIEST)
    if isinstance(broker, LocalBroker):  # reads of more than one record go to a worker thread
        broker.engine.ready_bytes.inline_max = 1

    async def ready() -> tuple[int, int]:
        [s] = [q for q in (await broker.group_status(group, [topic], ready_bytes=True)).queues if q.topic == topic]
        return s.ready, s.ready_bytes

    assert await ready() == (0, 0)
    await broker.send(topic, 0, [out(scope, b"a" * 10), out(scope, b"b" * 200), out(scope, b"c" * 3000)])
    await wait_stored(broker, topic, {0: 3})
    assert await ready() == (3, 3210)
    [plain] = [q for q in (await broker.group_status(group, [topic])).queues if q.topic == topic]
    assert (plain.ready, plain.ready_bytes) == (3, 0)  # not asked for
    first, second = await pop_n(broker, group, topic, 2)
    assert await ready() == (1, 3000)
    await broker.change_invisible_duration(group, topic, second.receipt_handle, SHORT_INVISIBLE_MS)
    await elapse(SHORT_INVISIBLE_MS / 1000 + 0.05)
    assert await ready() == (2, 3200)  # requeued: ready again
    await ack_all(broker, group, topic, [first])
    await broker.send(topic, 0, [out(scope, b"d" * 4000)])
    await wait_stored(broker, topic, {0: 4})
    assert await ready() == (3, 7200)
    got = await pop_n(broker, group, topic, 3)
    assert sorted(len(m.body) for m in got) == [200, 3000, 4000]
    assert await ready() == (0, 0)
    await ack_all(broker, group, topic, got)
    assert await ready() == (0, 0)


async def test_client_reports_replace_and_expire(broker: BrokerApi, scope: Scope, elapse: Elapse) -> None:
    proxy = f"proxy-{scope.topic()}"
    one = ConnectedClient("c1", "PYTHON", "5.1.2", "SIMPLE_CONSUMER", "127.0.0.1:5000", proxy, "g", ("t",), 1)
    two = ConnectedClient("c2", "NODE_JS", "1.0", "PRODUCER", "127.0.0.1:5001", proxy, "", ("t", "u"), 2)
    await broker.report_clients(proxy, [one, two], 60_000)
    assert {c for c in await broker.list_clients() if c.proxy == proxy} == {one, two}
    await broker.report_clients(proxy, [two], 200)
    assert [c for c in await broker.list_clients() if c.proxy == proxy] == [two]
    await elapse(0.3)  # past the report's time to live
    assert [c for c in await broker.list_clients() if c.proxy == proxy] == []
    with expect_error(BadRequest):
        await broker.report_clients(proxy, [one], 0)
    with expect_error(BadRequest):
        await broker.report_clients("", [one], 1000)
