"""The transaction part of the `BrokerApi` contract (docs/transactions.md), run against both implementations.

Half messages are invisible until committed, commit delivers exactly once with the message's id and
type, rollback discards, repeats are idempotent and contradictions refused, check-backs are handed
out for the requested topics only and counted, and a half message whose last check goes unanswered
is rolled back. Timings come from CONTRACT_SETTINGS (first check 200 ms after the send, then every
300 ms, at most 2), and the check-back test makes them pass with `elapse` (a jump of the local
broker's clock, conftest.py); waits are bounded conditions, never "within N ms" assertions.
"""

from __future__ import annotations

import asyncio
import functools

from broker.client.api import (
    BrokerApi,
    SendResult,
    TransactionResolution,
    TransactionSource,
)
from common.errors import BadRequest, InvalidTransactionId, MessageTypeConflict, TopicNotFound
from common.model import MessageType
from tests.contract.conftest import TXN_CHECK_INTERVAL_MS, TXN_MAX_CHECKS, TXN_RECOVERY_MS, Elapse, Scope
from tests.contract.test_broker_contract import (
    bodies,
    eventually,
    expect_error,
    new_group,
    new_topic,
    out,
    pop_n,
    pop_none,
)

TXN_TYPES = frozenset({MessageType.TRANSACTION})
COMMIT, ROLLBACK = TransactionResolution.COMMIT, TransactionResolution.ROLLBACK
CLIENT = TransactionSource.CLIENT
FAR_MS = 600_000  # a recovery duration that never comes due within a test


def half(scope: Scope, body: str, recovery_ms: int | None = None) -> bytes:
    sysprops = {} if recovery_ms is None else {"TRANSACTION_RECOVERY_MS": str(recovery_ms)}
    return out(scope, body, message_type=MessageType.TRANSACTION, system_properties=sysprops)


async def send_half(api: BrokerApi, topic: str, msg: bytes) -> SendResult:
    (result,) = await api.send(topic, 0, [msg])
    assert result.transaction_id, "a TRANSACTION send returns a transaction id"
    assert result.message_id == msg.message_id
    return result


async def backlog(api: BrokerApi, topic: str) -> int:
    return (await api.topic_status(topic)).half_messages


async def test_commit_makes_the_half_message_visible_once(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await new_topic(broker, scope, types=TXN_TYPES), await new_group(broker, scope)
    msg = half(scope, "order-1", FAR_MS)
    sent = await send_half(broker, topic, msg)
    assert await backlog(broker, topic) == 1
    await pop_none(broker, group, topic)
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, COMMIT, CLIENT)
    (got,) = await pop_n(broker, group, topic, 1)
    assert (got.body, got.message_id, got.message_type) == (b"order-1", msg.message_id, MessageType.TRANSACTION)
    assert await backlog(broker, topic) == 0
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, COMMIT, CLIENT)  # repeat: OK
    with expect_error(InvalidTransactionId):
        await broker.end_transaction(topic, msg.message_id, sent.transaction_id, ROLLBACK, CLIENT)
    await pop_none(broker, group, topic)


async def test_rollback_discards_the_half_message(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await new_topic(broker, scope, types=TXN_TYPES), await new_group(broker, scope)
    msg = half(scope, "never", FAR_MS)
    sent = await send_half(broker, topic, msg)
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, ROLLBACK, CLIENT)
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, ROLLBACK, CLIENT)  # repeat: OK
    with expect_error(InvalidTransactionId):
        await broker.end_transaction(topic, msg.message_id, sent.transaction_id, COMMIT, CLIENT)
    assert await backlog(broker, topic) == 0
    await pop_none(broker, group, topic)


async def test_unspecified_leaves_the_transaction_pending(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await new_topic(broker, scope, types=TXN_TYPES), await new_group(broker, scope)
    msg = half(scope, "later", FAR_MS)
    sent = await send_half(broker, topic, msg)
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, TransactionResolution.UNSPECIFIED,
                                 TransactionSource.SERVER_CHECK)  # fmt: skip
    assert await backlog(broker, topic) == 1
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, COMMIT, CLIENT)
    assert bodies(await pop_n(broker, group, topic, 1)) == [b"later"]


async def test_end_transaction_checks_its_arguments(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, types=TXN_TYPES)
    other = await new_topic(broker, scope, types=TXN_TYPES)
    msg = half(scope, "guarded", FAR_MS)
    sent = await send_half(broker, topic, msg)
    foreign = "another-broker~" + sent.transaction_id.rpartition("~")[2]
    for bad_id in ("", "garbage", f"{broker.name}~tnot*base64", foreign):
        with expect_error(InvalidTransactionId):
            await broker.end_transaction(topic, msg.message_id, bad_id, COMMIT, CLIENT)
    with expect_error(InvalidTransactionId):  # issued for another topic
        await broker.end_transaction(other, msg.message_id, sent.transaction_id, COMMIT, CLIENT)
    with expect_error(InvalidTransactionId):  # issued for another message
        await broker.end_transaction(topic, scope.message_id(), sent.transaction_id, ROLLBACK, CLIENT)
    assert await backlog(broker, topic) == 1, "a refused EndTransaction changes nothing"
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, ROLLBACK, CLIENT)


async def test_transaction_sends_are_validated(broker: BrokerApi, scope: Scope) -> None:
    normal_only = await new_topic(broker, scope)
    with expect_error(MessageTypeConflict):
        await broker.send(normal_only, 0, [half(scope, "x")])
    mixed = await new_topic(broker, scope, types=frozenset({MessageType.NORMAL, MessageType.TRANSACTION}))
    with expect_error(BadRequest):
        await broker.send(mixed, 0, [out(scope, "plain"), half(scope, "x")])
    assert await backlog(broker, mixed) == 0


async def test_check_backs_are_counted_then_unanswered_ones_roll_back(
    broker: BrokerApi, scope: Scope, elapse: Elapse
) -> None:
    topic = await new_topic(broker, scope, types=TXN_TYPES)
    unrelated = await new_topic(broker, scope, types=TXN_TYPES)
    due = half(scope, "orphan")  # the configured default recovery duration
    later = half(scope, "not-yet", FAR_MS)
    sent = await send_half(broker, topic, due)
    await send_half(broker, topic, later)
    checks = []

    async def claimed(n: int) -> bool:
        assert await broker.claim_transaction_checks([unrelated], 10) == []
        assert await broker.claim_transaction_checks([topic], 0) == []
        checks.extend(await broker.claim_transaction_checks([topic], 10))
        return len(checks) >= n

    await elapse(TXN_RECOVERY_MS / 1000)  # the first check-back is due
    await eventually(lambda: claimed(1), "the first check-back handed out")
    for n in range(2, TXN_MAX_CHECKS + 1):
        await elapse(TXN_CHECK_INTERVAL_MS / 1000)  # the next one is due
        await eventually(functools.partial(claimed, n), f"check-back {n} handed out")
    assert [c.check for c in checks] == list(range(1, TXN_MAX_CHECKS + 1))
    assert {c.transaction_id for c in checks} == {sent.transaction_id}, "only the due half message is checked"
    m = checks[0].message
    assert (m.topic, m.queue_id, m.body, m.message_id, m.message_type) == (
        topic, 0, b"orphan", due.message_id, MessageType.TRANSACTION)  # fmt: skip

    async def rolled_back() -> bool:
        return await backlog(broker, topic) == 1  # only `later` is left

    await elapse(TXN_CHECK_INTERVAL_MS / 1000)  # the last check-back's answer is overdue
    await eventually(rolled_back, "the unanswered half message rolled back")
    assert await broker.claim_transaction_checks([topic], 10) == []
    with expect_error(InvalidTransactionId):
        await broker.end_transaction(topic, due.message_id, sent.transaction_id, COMMIT, TransactionSource.SERVER_CHECK)


async def test_a_deleted_topic_cannot_receive_a_commit(broker: BrokerApi, scope: Scope) -> None:
    topic = await new_topic(broker, scope, types=TXN_TYPES)
    msg = half(scope, "homeless", FAR_MS)
    sent = await send_half(broker, topic, msg)
    await broker.delete_topic(topic)
    with expect_error(TopicNotFound):
        await broker.end_transaction(topic, msg.message_id, sent.transaction_id, COMMIT, CLIENT)
    await broker.end_transaction(topic, msg.message_id, sent.transaction_id, ROLLBACK, CLIENT)


async def test_concurrent_commits_deliver_once(broker: BrokerApi, scope: Scope) -> None:
    topic, group = await new_topic(broker, scope, types=TXN_TYPES), await new_group(broker, scope)
    msg = half(scope, "raced", FAR_MS)
    sent = await send_half(broker, topic, msg)
    sources = [CLIENT, TransactionSource.SERVER_CHECK] * 4  # the producer and its checker answer at once
    await asyncio.gather(*(broker.end_transaction(topic, msg.message_id, sent.transaction_id, COMMIT, s)
                           for s in sources))  # fmt: skip
    assert bodies(await pop_n(broker, group, topic, 1)) == [b"raced"]
    await pop_none(broker, group, topic)
