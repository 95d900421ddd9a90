"""Transactions survive crashes: nothing acknowledged is lost, nothing is committed twice.

1. A broker process is SIGKILLed while commits are in flight, then restarted on the same data dir:
   pending half messages are still pending, every commit acknowledged before the kill is visible
   exactly once, an in-flight commit is either done or still pending (and a repeated commit then
   completes it exactly once), rolled-back messages never appear.
2. The two windows inside one commit (marked COMMITTING but not yet appended; appended but the
   pending entry not yet deleted) are reproduced in-process and reopened: the commit is finished at
   startup, exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from pathlib import Path

import pytest

from broker.client.api import (
    BrokerApi,
    ConsumeFrom,
    GroupSpec,
    PopRequest,
    SendResult,
    StoredMessage,
    TopicSpec,
    TransactionResolution,
    TransactionSource,
)
from broker.client.remote import RemoteBroker
from broker.config import BrokerConfig, TransactionConfig
from broker.local import LocalBroker
from broker.transaction.pending import HalfState
from common.errors import SluiceError
from common.model import MessageType
from tests.helpers.broker_fixtures import SLUICE_ARGV, to_toml
from tests.helpers.procs import LOOPBACK, ChildProcess, free_port, start_process
from tests.helpers.records import outgoing

NAME = "txn-crash"
TOPIC, GROUP = "txn-crash-topic", "txn-crash-group"
SETTINGS = {"name": NAME, "transaction": {"default_recovery_ms": 600_000}}  # no check-backs during the test
COMMIT, ROLLBACK = TransactionResolution.COMMIT, TransactionResolution.ROLLBACK
CLIENT = TransactionSource.CLIENT
START_TIMEOUT_S = 20.0
TIMEOUT_S = 120.0


def start_broker(root: Path, port: int, n: int) -> ChildProcess:
    config = root / "broker.toml"
    config.write_text(to_toml({"broker": SETTINGS}))
    argv = [*SLUICE_ARGV, "broker", "--config", str(config), "--port", str(port), "--data-dir", str(root / "data")]
    return start_process(argv, port=port, log_path=root / f"broker-{n}.log", name=NAME, timeout_s=START_TIMEOUT_S)


def half(i: int) -> bytes:
    return outgoing(body=f"m{i}".encode(), message_id=f"ID{i:04d}", message_type=MessageType.TRANSACTION)


async def end(api: BrokerApi, sent: SendResult, resolution: TransactionResolution) -> None:
    await api.end_transaction(TOPIC, sent.message_id, sent.transaction_id, resolution, CLIENT)


async def drain(api: BrokerApi, expected: int) -> list[StoredMessage]:
    """Pop and ack until `expected` messages arrived, then one more empty long poll."""
    got: list[StoredMessage] = []
    for _ in range(200):
        batch = await api.pop(PopRequest(GROUP, TOPIC, max_messages=32, invisible_ms=60_000, long_poll_ms=500))
        if batch:
            await api.ack(GROUP, TOPIC, [m.receipt_handle for m in batch])
        got += batch
        if len(got) >= expected and not batch:
            return got
    raise AssertionError(f"only {len(got)} of {expected} messages popped")


@pytest.mark.slow
def test_sigkill_during_commits(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(_sigkill_during_commits(tmp_path), TIMEOUT_S))


async def _sigkill_during_commits(root: Path) -> None:
    port = free_port()
    child = await asyncio.to_thread(start_broker, root, port, 1)
    api = RemoteBroker(NAME, f"{LOOPBACK}:{port}")
    try:
        await api.create_topic(TopicSpec(TOPIC, 2, frozenset({MessageType.TRANSACTION})))
        await api.create_group(GroupSpec(GROUP, consume_from=ConsumeFrom.EARLIEST))
        sent = [(await api.send(TOPIC, i % 2, [half(i)]))[0] for i in range(40)]
        committed, rolled_back, racing = sent[:20], sent[20:30], sent[30:]
        await asyncio.gather(*(end(api, s, COMMIT) for s in committed), *(end(api, s, ROLLBACK) for s in rolled_back))
        assert (await api.topic_status(TOPIC)).half_messages == 10

        async def commit_quietly(s: SendResult) -> None:
            with contextlib.suppress(SluiceError):  # the broker died under it: uncertain
                await end(api, s, COMMIT)

        tasks = [asyncio.create_task(commit_quietly(s)) for s in racing]
        await asyncio.sleep(random.Random(7).uniform(0.0, 0.05))
        child.signal(signal.SIGKILL)
        await asyncio.to_thread(child.popen.wait, START_TIMEOUT_S)
        await asyncio.gather(*tasks)
    finally:
        await api.close()

    child = await asyncio.to_thread(start_broker, root, port, 2)
    api = RemoteBroker(NAME, f"{LOOPBACK}:{port}")
    try:
        assert (await api.topic_status(TOPIC)).half_messages <= 10
        for s in racing:  # a repeated commit completes what the kill interrupted, or is a no-op
            await end(api, s, COMMIT)
        assert (await api.topic_status(TOPIC)).half_messages == 0
        got = await drain(api, 30)
        ids = sorted(m.message_id for m in got)
        assert ids == sorted(s.message_id for s in committed + racing), "every commit exactly once, no rollback"
        assert {m.message_type for m in got} == {MessageType.TRANSACTION}
    finally:
        await api.close()
        child.stop()


def test_an_interrupted_commit_is_finished_once_at_startup(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(_interrupted_commit(tmp_path), TIMEOUT_S))


async def _interrupted_commit(root: Path) -> None:
    config = BrokerConfig(name=NAME, data_dir=root / "data", transaction=TransactionConfig(default_recovery_ms=600_000))
    broker = LocalBroker(config)
    await broker.start()
    await broker.create_topic(TopicSpec(TOPIC, 1, frozenset({MessageType.TRANSACTION})))
    await broker.create_group(GroupSpec(GROUP, consume_from=ConsumeFrom.EARLIEST))
    before_append, after_append = [(await broker.send(TOPIC, 0, [half(i)]))[0] for i in range(2)]
    service = broker.transactions
    for sent in (before_append, after_append):
        entry = next(e for e in service.pending.entries.values() if e.message_id == sent.message_id)
        entry.state = HalfState.COMMITTING
        service.pending.update(entry)  # the crash comes right after this write ...
    # ... or right after the committed copy was appended, before the pending entry was deleted:
    entry = next(e for e in service.pending.entries.values() if e.message_id == after_append.message_id)
    copy = service._committed(broker.store.read_at(entry.position, entry.size), entry, after_append.transaction_id)
    await broker.store.append([copy])
    await broker.close()

    broker = LocalBroker(config)
    await broker.start()
    try:
        assert broker.half_message_backlog() == 0
        got = await drain(broker, 2)
        assert sorted(m.message_id for m in got) == [before_append.message_id, after_append.message_id]
        for sent in (before_append, after_append):  # and a late repeat of the commit changes nothing
            await end(broker, sent, COMMIT)
        assert await broker.pop(PopRequest(GROUP, TOPIC, invisible_ms=60_000, long_poll_ms=300)) == []
    finally:
        await broker.close()
