"""A publish a broker does not store is never dropped in silence (proxy/amqp/channel.py): a refusal
of the message closes its channel with the refusal's code and no confirm; a failure of the broker
is nacked in confirm mode, fails tx.commit in a transaction, and otherwise closes the connection
with 541; each is counted. One channel and its connection over a queue store that refuses or
fails (the e2e tests cannot make a broker fail on cue)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from pamqp import base, commands
from pamqp import frame as pframe

from common import metrics
from common.errors import MessageBodyTooLarge, SluiceError, Unavailable
from proxy.amqp import topology
from proxy.amqp.channel import NOT_STORED, REFUSED, Channel
from proxy.amqp.codes import AmqpError
from proxy.amqp.connection import Connection
from proxy.amqp.frames import BODY, HEADER, METHOD, Frame, method_bytes
from proxy.amqp.meta import MetaDoc, QueueMeta
from proxy.amqp.queues import Publish
from proxy.config import AmqpConfig

QUEUE = "jobs"


class _Transport:
    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        raise AssertionError("the connection was aborted (a channel task failed)")


class _Writer:
    """What the connection writes, kept (a StreamWriter's part the gateway uses)."""

    def __init__(self) -> None:
        self.data = b""
        self.transport = _Transport()

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 1)

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.data += data

    def methods(self) -> list[object]:
        out: list[object] = []
        at = 0
        while at < len(self.data):
            used, _, value = pframe.unmarshal(self.data[at:])
            out.append(value)
            at += used
        return out


class _Meta:
    def __init__(self) -> None:
        self.doc = MetaDoc()
        topology.declare_queue(self.doc, "/", topology.QueueDeclare(QUEUE, False, True, False, False, {}), "c1", "b")

    async def refresh(self) -> None:
        return None


class _Store:
    """Refuses or fails every send with `error` (None: stores)."""

    def __init__(self, error: SluiceError | None) -> None:
        self.error = error
        self.sent: list[bytes] = []

    async def send(self, q: QueueMeta, records: list[bytes]) -> None:
        if self.error is not None:
            raise self.error
        self.sent += records


class _Bridge:
    def refusal(self, topic: str, p: Publish) -> SluiceError | None:
        return None


def _gateway(error: SluiceError | None) -> SimpleNamespace:
    return SimpleNamespace(config=AmqpConfig(), meta=_Meta(), store=_Store(error), bridge=_Bridge(), dead=None)


def _method(method: base.Frame) -> Frame:
    return Frame(METHOD, 1, method_bytes(1, method)[7:-1])  # the payload: no frame header, no end octet


def _publish(body: bytes) -> list[Frame]:
    header = (
        (60).to_bytes(2, "big") + b"\x00\x00" + len(body).to_bytes(8, "big") + commands.Basic.Properties().marshal()
    )
    return [_method(commands.Basic.Publish(exchange="", routing_key=QUEUE)), Frame(HEADER, 1, header),
            Frame(BODY, 1, body)]  # fmt: skip


@dataclass
class _Ran:
    writer: _Writer
    conn: Connection
    commit_error: AmqpError | None = None  # what tx.commit answered (mode "tx")


async def _run(error: SluiceError | None, mode: str) -> _Ran:
    """One publish on channel 1 (`mode`: plain, confirm or tx with its commit) over a store that
    answers every send with `error`; what was written once the channel's tasks had their turns."""
    writer = _Writer()
    ran = _Ran(writer, Connection(_gateway(error), asyncio.StreamReader(), writer, "c1"))  # type: ignore[arg-type]
    ch = Channel(ran.conn, 1)
    ran.conn.channels[1] = ch
    select = {"confirm": commands.Confirm.Select(), "tx": commands.Tx.Select()}.get(mode)
    if select is not None:
        await ch.handle(_method(select))
    for f in _publish(b"payload"):
        await ch.handle(f)
    if mode == "tx":
        with pytest.raises(AmqpError) as commit:
            await ch.handle(_method(commands.Tx.Commit()))
        ran.commit_error = commit.value
    for _ in range(20):  # the publisher's round, then the tasks it started
        await asyncio.sleep(0)
    ran.conn._write_out()
    return ran


@pytest.fixture(autouse=True)
def _counting() -> Iterator[None]:
    metrics.configure(metrics.MetricsConfig(enabled=True))
    metrics.AMQP_PUBLISHES_REFUSED.values.clear()
    yield
    metrics.AMQP_PUBLISHES_REFUSED.values.clear()


def _counted() -> dict[tuple[str, ...], float]:
    return dict(metrics.AMQP_PUBLISHES_REFUSED.values)


@pytest.mark.parametrize("mode", ["plain", "confirm"])
def test_a_refused_publish_closes_its_channel_without_a_confirm(mode: str) -> None:
    async def go() -> None:
        ran = await _run(MessageBodyTooLarge("message body is 9 bytes; this broker accepts at most 8"), mode)
        sent = ran.writer.methods()
        closes = [m for m in sent if isinstance(m, commands.Channel.Close)]
        assert [(c.reply_code, c.class_id, c.method_id) for c in closes] == [(406, 60, 40)]
        assert "this broker accepts at most 8" in closes[0].reply_text
        assert not [m for m in sent if isinstance(m, commands.Basic.Ack | commands.Basic.Nack)]
        assert not ran.conn._failed.done()
        assert _counted() == {("/", REFUSED): 1.0}

    asyncio.run(go())


def test_a_failed_store_without_confirms_closes_the_connection() -> None:
    """Before: logged, and the publish was gone without a word to the client."""

    async def go() -> None:
        conn = (await _run(Unavailable("broker b is down"), "plain")).conn
        assert conn._failed.done()
        err = conn._failed.result()
        assert (err.code, err.method) == (541, (60, 40)) and "broker b is down" in err.text
        assert _counted() == {("/", NOT_STORED): 1.0}

    asyncio.run(go())


def test_a_failed_store_is_nacked_in_confirm_mode_and_fails_a_commit() -> None:
    async def go() -> None:
        confirmed = await _run(Unavailable("broker b is down"), "confirm")
        assert [type(m).__name__ for m in confirmed.writer.methods()] == ["SelectOk", "Nack"]
        assert not confirmed.conn._failed.done()
        committed = await _run(Unavailable("broker b is down"), "tx")
        assert committed.commit_error is not None and committed.commit_error.code == 541
        assert not committed.conn._failed.done()
        assert _counted() == {("/", NOT_STORED): 2.0}

    asyncio.run(go())


def test_a_refused_publish_fails_its_transaction_with_the_refusal() -> None:
    async def go() -> None:
        ran = await _run(MessageBodyTooLarge("message body is 9 bytes; this broker accepts at most 8"), "tx")
        assert ran.commit_error is not None and ran.commit_error.code == 406

    asyncio.run(go())


def test_a_stored_publish_is_confirmed() -> None:
    async def go() -> None:
        ran = await _run(None, "confirm")
        assert [type(m).__name__ for m in ran.writer.methods()] == ["SelectOk", "Ack"]
        assert not ran.conn._failed.done() and _counted() == {}

    asyncio.run(go())
