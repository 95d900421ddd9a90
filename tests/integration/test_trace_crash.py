"""The message trace survives a SIGKILLed broker process: whatever the trace writer flushed before
the kill is there after the restart (RocksDB's write-ahead log), through the internal RPC."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from broker.client.api import CallContext, GroupSpec, PopRequest, TopicSpec, TraceKind
from broker.client.remote import RemoteBroker
from tests.helpers.broker_fixtures import ServerProcess, start_broker_process
from tests.helpers.records import outgoing

WAIT_S = 20.0
SETTINGS = {"name": "trace-crash", "auto_create": True, "store": {"commitlog": {"flush_policy": "sync"}}}
WANTED = [TraceKind.SENT, TraceKind.DELIVERED, TraceKind.ACKED]


async def _trace(address: str, message_id: str) -> list[tuple[TraceKind, str, str]]:
    remote = RemoteBroker("trace-crash", address)
    try:
        return [(e.kind, e.group, e.client_id) for e in await remote.message_trace(message_id)]
    finally:
        await remote.close()


async def _produce_and_consume(address: str) -> str:
    remote = RemoteBroker("trace-crash", address)
    try:
        await remote.create_topic(TopicSpec("crash-topic", 1))
        await remote.create_group(GroupSpec("crash-group"))
        await remote.pop(PopRequest("crash-group", "crash-topic", max_messages=1))  # the group's cursor starts here
        msg = outgoing(b"survives", "TRACE-CRASH-1")
        await remote.send("crash-topic", 0, [msg], ctx=CallContext(client_id="cli-1"))
        got = await remote.pop(PopRequest("crash-group", "crash-topic", max_messages=1, long_poll_ms=5_000))
        assert [m.message_id for m in got] == [msg.message_id]
        assert [r.ok for r in await remote.ack("crash-group", "crash-topic", [got[0].receipt_handle])] == [True]
        return msg.message_id
    finally:
        await remote.close()


def test_flushed_trace_survives_sigkill(tmp_path: Path) -> None:
    broker: ServerProcess = start_broker_process(tmp_path, settings=SETTINGS)
    try:
        message_id = asyncio.run(asyncio.wait_for(_produce_and_consume(broker.address), WAIT_S))
        deadline = time.monotonic() + WAIT_S
        while [k for k, _, _ in asyncio.run(_trace(broker.address, message_id))] != WANTED:
            assert time.monotonic() < deadline, "the trace was not written"
            time.sleep(0.1)
        before = asyncio.run(_trace(broker.address, message_id))
        broker.child.signal(signal.SIGKILL)
        broker.child.popen.wait(timeout=WAIT_S)
    finally:
        broker.stop()
    restarted = start_broker_process(tmp_path, settings=SETTINGS)
    try:
        after = asyncio.run(asyncio.wait_for(_trace(restarted.address, message_id), WAIT_S))
    finally:
        restarted.stop()
    assert after == before == [(TraceKind.SENT, "", "cli-1"), (TraceKind.DELIVERED, "crash-group", ""),
                               (TraceKind.ACKED, "crash-group", "")]  # fmt: skip
