"""The AMQP gateway's metadata rules without a server: topic-exchange matching, routing, declares
with RabbitMQ's checks and reply codes, the document's encoding, SASL responses, and frame decoding."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

import pytest
from pamqp import commands, encode
from pamqp import frame as pframe

from common.errors import StoreCorrupted
from common.security import SecurityDoc, User
from proxy.amqp import auth, topology
from proxy.amqp.codes import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    FRAME_ERROR,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    SYNTAX_ERROR,
    AmqpError,
)
from proxy.amqp.frames import content_bytes, decode_header, decode_method, read_frame
from proxy.amqp.meta import BindingMeta, MetaDoc, decode
from proxy.amqp.meta import encode as encode_doc
from proxy.amqp.routing import decode_headers, headers_match, route, topic_matches


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("kern.*", "kern.critical", True), ("kern.*", "kern", False), ("kern.*", "kern.a.b", False),
        ("#", "", True), ("#", "a.b.c", True), ("a.#", "a", True), ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True), ("a.#.z", "a.b", False), ("*.*", "a.b", True), ("*", "", True),
        ("*.critical", "kern.critical", True), ("#.x.#", "x", True), ("a.b", "a.b", True), ("a.b", "a.c", False),
    ],
)  # fmt: skip
def test_topic_matching(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches


def _declare_queue(doc: MetaDoc, name: str, owner: str = "c1", **kw: object) -> None:
    d = topology.QueueDeclare(name, bool(kw.get("passive", False)), bool(kw.get("durable", True)),
                              bool(kw.get("exclusive", False)), False, {})  # fmt: skip
    topology.declare_queue(doc, "/", d, owner, "broker-a")


def _declare_exchange(doc: MetaDoc, name: str, kind: str, *, durable: bool = True, passive: bool = False) -> None:
    topology.declare_exchange(doc, "/", topology.ExchangeDeclare(name, kind, passive, durable, False, False, {}))


def _code(call: Callable[..., object], *args: object, **kw: object) -> int:
    with pytest.raises(AmqpError) as info:
        call(*args, **kw)
    return info.value.code


def test_routing_by_exchange_type_and_the_default_exchange() -> None:
    doc = MetaDoc()
    for q in ("q1", "q2"):
        _declare_queue(doc, q)
    _declare_exchange(doc, "logs", "fanout")
    _declare_exchange(doc, "direct", "direct")
    for q in ("q1", "q2"):
        topology.bind(doc, "/", BindingMeta("logs", q, ""), "c1")
    topology.bind(doc, "/", BindingMeta("direct", "q2", "error"), "c1")
    topology.bind(doc, "/", BindingMeta("direct", "q2", "error"), "c1")  # binding twice is one binding
    v = doc.vhost("/")
    assert [q.name for q in route(v, "logs", "anything")[0]] == ["q1", "q2"]
    assert [q.name for q in route(v, "direct", "error")[0]] == ["q2"]
    assert route(v, "direct", "info")[0] == []
    assert [q.name for q in route(v, "", "q1")[0]] == ["q1"]
    assert route(v, "", "missing")[0] == []
    assert len(v.bindings) == 3


def test_declares_check_like_rabbitmq() -> None:
    doc = MetaDoc()
    _declare_queue(doc, "q", durable=True)
    _declare_queue(doc, "q", durable=True)  # the same again: fine
    assert doc.next_id == 2
    assert _code(_declare_queue, doc, "q", durable=False) == PRECONDITION_FAILED  # durable differs
    assert _code(_declare_queue, doc, "missing", passive=True) == NOT_FOUND  # passive
    assert _code(_declare_queue, doc, "amq.mine") == ACCESS_REFUSED
    _declare_queue(doc, "mine", "c1", exclusive=True)
    with pytest.raises(AmqpError) as locked:
        topology.find_queue(doc, "/", "mine", "c2")
    assert locked.value.code == RESOURCE_LOCKED and "locked queue 'mine'" in locked.value.text
    _declare_exchange(doc, "amq.direct", "direct")  # a built-in as it is: fine
    assert _code(_declare_exchange, doc, "amq.direct", "fanout") == ACCESS_REFUSED
    assert _code(_declare_exchange, doc, "odd", "x-consistent-hash") == COMMAND_INVALID
    _declare_exchange(doc, "x", "topic")
    assert _code(_declare_exchange, doc, "x", "direct") == PRECONDITION_FAILED
    assert _code(topology.bind, doc, "/", BindingMeta("", "q", "q"), "c1") == ACCESS_REFUSED
    assert _code(topology.bind, doc, "/", BindingMeta("nox", "q", ""), "c1") == NOT_FOUND
    topology.bind(doc, "/", BindingMeta("x", "q", "a.*"), "c1")
    assert _code(topology.delete_exchange, doc, "/", "x", True) == PRECONDITION_FAILED  # if-unused
    removed = topology.delete_queue(doc, "/", "q", "c1")
    assert removed is not None and removed.topic == "AMQP_Q1" and removed.group == "AMQP_G1"
    assert doc.vhost("/").bindings == []


def test_metadata_document_round_trips() -> None:
    doc = MetaDoc()
    _declare_queue(doc, "q")
    _declare_exchange(doc, "x", "topic")
    topology.bind(doc, "/", BindingMeta("x", "q", "a.#", {"k": [1, "v"]}), "c1")
    again = decode(7, encode_doc(doc))
    assert (again.version, again.next_id) == (7, doc.next_id)
    assert again.vhosts == doc.vhosts
    assert decode(0, b"") == MetaDoc()
    with pytest.raises(StoreCorrupted):
        decode(3, b'{"next_id": 1}')


def test_sasl_responses_and_who_may_log_in() -> None:
    assert auth.credentials("PLAIN", b"\x00guest\x00guest") == ("guest", "guest")
    assert auth.credentials("PLAIN", b"guest") is None
    table = encode.field_table({"LOGIN": "ann", "PASSWORD": "s3cret"})[4:]
    assert auth.credentials("AMQPLAIN", table) == ("ann", "s3cret")
    assert auth.credentials("AMQPLAIN", b"\x05LOG") is None
    assert auth.allowed("guest", "guest", "127.0.0.1", None)
    assert not auth.allowed("guest", "guest", "10.1.2.3", None)  # guest from loopback only
    doc = SecurityDoc(1, (User("ann", "s3cret"),))
    assert auth.allowed("ann", "s3cret", "10.1.2.3", doc)
    assert not auth.allowed("ann", "wrong", "127.0.0.1", doc)
    assert not auth.allowed("guest", "guest", "127.0.0.1", doc, guest=False)  # the proxy requires authentication
    assert auth.allowed("ann", "s3cret", "127.0.0.1", doc, guest=False)


def _read(data: bytes, frame_max: int = 4096) -> object:
    async def go() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader, frame_max)

    return asyncio.run(go())


def test_frames_are_checked_before_they_are_read() -> None:
    good = pframe.marshal(commands.Basic.Publish(exchange="x", routing_key="k"), 1)
    f = _read(good)
    method = decode_method(f.payload)  # type: ignore[attr-defined]
    assert isinstance(method, commands.Basic.Publish) and method.routing_key == "k"
    with pytest.raises(AmqpError) as big:
        _read(struct.pack(">BHI", 1, 1, 10_000) + b"x" * 10, frame_max=4096)
    assert big.value.code == FRAME_ERROR
    with pytest.raises(AmqpError) as end:
        _read(good[:-1] + b"\x00")
    assert end.value.code == FRAME_ERROR
    with pytest.raises(AmqpError) as syntax:
        decode_method(b"\x00\x3c\x00\x28")
    assert syntax.value.code == SYNTAX_ERROR
    assert _code(decode_method, b"\x27\x0f\x00\x01") == NOT_IMPLEMENTED


def test_content_header_properties_pass_through_unchanged() -> None:
    props = commands.Basic.Properties(content_type="text/plain", headers={"f": 1.5, "n": 2**40}, timestamp=None)
    body = b"x" * 10_000
    raw = pframe.marshal(pframe.header.ContentHeader(0, len(body), props), 1)
    header = decode_header(raw[7:-1])
    assert header.body_size == len(body)
    out = content_bytes(3, header.properties, body, 4096)
    assert out[7 + 12 : 7 + 12 + len(header.properties)] == header.properties  # the same bytes on delivery
    frames = []
    while out:
        size = struct.unpack(">I", out[3:7])[0]
        frames.append(out[: size + 8])
        out = out[size + 8 :]
    assert len(frames) == 1 + 3 and all(len(f) <= 4096 for f in frames)
    with pytest.raises(AmqpError) as bad:
        decode_header(b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\xff\xff")
    assert bad.value.code in (SYNTAX_ERROR, FRAME_ERROR)


class _Writer:
    """What a Connection writes, kept (the transport of a unit test)."""

    def __init__(self) -> None:
        self.data = b""

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 1)

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.data += data


def test_publish_bytes_in_flight_are_bounded_per_connection() -> None:
    from types import SimpleNamespace

    from proxy.amqp.connection import Connection
    from proxy.config import AmqpConfig

    async def go() -> None:
        writer = _Writer()
        gw = SimpleNamespace(config=AmqpConfig(max_connection_publish_bytes=100))
        conn = Connection(gw, asyncio.StreamReader(), writer, "c1")  # type: ignore[arg-type]
        conn.blocked_notify = True
        await conn.admit(60)
        await conn.admit(40)  # at the bound: admitted
        assert writer.data == b""
        over = asyncio.create_task(conn.admit(1))
        await asyncio.sleep(0)
        assert not over.done()
        assert isinstance(pframe.unmarshal(writer.data)[2], commands.Connection.Blocked)
        conn.release(60)
        await asyncio.wait_for(over, 1.0)
        assert isinstance(pframe.unmarshal(writer.data[-12:])[2], commands.Connection.Unblocked)

    asyncio.run(go())


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 3 * 4088, 3 * 4088 + 1, 100_000])
def test_content_frames_are_the_header_then_bodies_of_at_most_frame_max(size: int) -> None:
    """Written into one buffer when the body takes several frames: the same bytes as pamqp frames."""
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    props = commands.Basic.Properties(content_type="a").marshal()
    step = 4096 - 8
    want = pframe.marshal(pframe.header.ContentHeader(0, size, commands.Basic.Properties(content_type="a")), 5)
    want += b"".join(pframe.marshal(pframe.body.ContentBody(body[i : i + step]), 5) for i in range(0, size, step))
    assert bytes(content_bytes(5, props, body, 4096)) == want


def test_a_body_larger_than_the_connection_bound_is_admitted_alone() -> None:
    """A publish whose body alone passes `max_connection_publish_bytes` waits for the bodies in
    flight before it, then goes (before: it waited for a store that could only come after it, and
    its connection was never read again)."""
    from types import SimpleNamespace

    from proxy.amqp.connection import Connection
    from proxy.config import AmqpConfig

    async def go() -> None:
        gw = SimpleNamespace(config=AmqpConfig(max_connection_publish_bytes=100))
        conn = Connection(gw, asyncio.StreamReader(), _Writer(), "c1")  # type: ignore[arg-type]
        await asyncio.wait_for(conn.admit(250), 1.0)  # nothing else in flight
        conn.release(250)
        await conn.admit(10)
        big = asyncio.create_task(conn.admit(250))
        await asyncio.sleep(0)
        assert not big.done()  # the 10 bytes before it are not stored yet
        conn.release(10)
        await asyncio.wait_for(big, 1.0)

    asyncio.run(go())


def test_headers_exchanges_and_exchange_to_exchange_bindings() -> None:
    doc = MetaDoc()
    for q in ("pdf", "any", "all"):
        _declare_queue(doc, q)
    _declare_exchange(doc, "hdr", "headers")
    _declare_exchange(doc, "front", "fanout")
    _declare_exchange(doc, "back", "direct")
    topology.bind(doc, "/", BindingMeta("hdr", "pdf", "", {"format": "pdf"}), "c1")
    topology.bind(doc, "/", BindingMeta("hdr", "any", "", {"x-match": "any", "format": "zip", "kind": None}), "c1")
    topology.bind(doc, "/", BindingMeta("hdr", "all", "", {"format": "pdf", "kind": "report"}), "c1")
    topology.bind(doc, "/", BindingMeta("front", "back", "", to_exchange=True), "c1")
    topology.bind(doc, "/", BindingMeta("back", "front", "loop", to_exchange=True), "c1")  # a cycle
    topology.bind(doc, "/", BindingMeta("back", "pdf", "k"), "c1")
    v = doc.vhost("/")
    report = {"format": "pdf", "kind": "report"}
    assert [q.name for q in route(v, "hdr", "", lambda: report)[0]] == ["pdf", "any", "all"]
    assert [q.name for q in route(v, "hdr", "", lambda: {"format": "pdf"})[0]] == ["pdf"]
    assert [q.name for q in route(v, "hdr", "", lambda: {"kind": 1})[0]] == ["any"]
    assert [q.name for q in route(v, "front", "k")[0]] == ["pdf"]
    assert route(v, "front", "loop")[0] == []  # front -> back -> front: each exchange once
    assert headers_match({"x-match": "all-with-x", "x-a": 1}, {"x-a": 1})
    assert not headers_match({"x-match": "all-with-x", "x-a": 1}, {})
    props = commands.Basic.Properties(headers={"format": "pdf", "n": 3})
    raw = pframe.header.ContentHeader(0, 0, props).marshal()[12:]  # type: ignore[attr-defined]
    assert decode_headers(raw) == {"format": "pdf", "n": 3}
    assert decode_headers(b"") == {}


def test_routing_names_the_topics_of_every_mapped_exchange_reached() -> None:
    doc = MetaDoc()
    _declare_queue(doc, "q")
    for name, topic in (("front", None), ("mapped", "T1"), ("deeper", "T2")):
        args = {} if topic is None else {"x-sluice-topic": topic}
        topology.declare_exchange(doc, "/", topology.ExchangeDeclare(name, "fanout", False, True, False, False, args))
    topology.bind(doc, "/", BindingMeta("front", "mapped", "", to_exchange=True), "c1")
    topology.bind(doc, "/", BindingMeta("mapped", "deeper", "", to_exchange=True), "c1")
    topology.bind(doc, "/", BindingMeta("deeper", "front", "", to_exchange=True), "c1")  # a cycle
    topology.bind(doc, "/", BindingMeta("deeper", "q", ""), "c1")
    v = doc.vhost("/")
    queues, topics = route(v, "front", "k")
    assert ([q.name for q in queues], topics) == (["q"], ["T1", "T2"])  # in the order reached, each once
    assert route(v, "deeper", "k")[1] == ["T2", "T1"]  # deeper -> front -> mapped: each exchange once
    assert route(v, "", "q")[1] == []


def test_auto_delete_exchanges_go_with_their_last_binding() -> None:
    doc = MetaDoc()
    _declare_queue(doc, "q")
    topology.declare_exchange(doc, "/", topology.ExchangeDeclare("tmp", "direct", False, False, True, False, {}))
    topology.bind(doc, "/", BindingMeta("tmp", "q", "a"), "c1")
    topology.bind(doc, "/", BindingMeta("tmp", "q", "b"), "c1")
    topology.unbind(doc, "/", BindingMeta("tmp", "q", "a"), "c1")
    assert "tmp" in doc.vhost("/").exchanges
    topology.delete_queue(doc, "/", "q", "c1")
    assert "tmp" not in doc.vhost("/").exchanges


def test_expiry_and_dead_letter_headers() -> None:
    from proxy.amqp.deadletter import dead_properties, expires_at_ms, message_ttl_ms
    from proxy.amqp.meta import QueueMeta
    from proxy.amqp.queues import Delivery

    with_exp = commands.Basic.Properties(expiration="250", headers={"k": "v"}).marshal()
    assert message_ttl_ms(with_exp) == 250
    assert message_ttl_ms(commands.Basic.Properties(content_type="x").marshal()) is None
    assert message_ttl_ms(commands.Basic.Properties(expiration="soon").marshal()) is None
    q = QueueMeta("q", 1, "b", arguments={"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"})
    assert expires_at_ms(q, with_exp, 1_000) == 1_100  # the smaller of queue and message TTL
    assert expires_at_ms(QueueMeta("p", 2, "b"), with_exp, 1_000) == 1_250
    assert expires_at_ms(QueueMeta("p", 2, "b"), b"", 1_000) == 0
    d = Delivery("ex", "rk", with_exp, b"body", False, "h")
    once = dead_properties(with_exp, q, d, "expired")
    twice = dead_properties(once, q, d, "expired")
    props = commands.Basic.Properties()
    offset, flags = pframe.header.ContentHeader._get_flags(twice)  # type: ignore[attr-defined]
    props.unmarshal(flags, twice[offset:])
    [death] = props.headers["x-death"]
    assert (death["queue"], death["reason"], death["count"], death["exchange"]) == ("q", "expired", 2, "ex")
    assert death["routing-keys"] == ["rk"] and death["original-expiration"] == "250"
    assert props.expiration is None and props.headers["k"] == "v"
    assert props.headers["x-first-death-queue"] == "q" and props.headers["x-last-death-reason"] == "expired"


@pytest.mark.parametrize(
    ("arguments", "ok"),
    [
        ({"x-message-ttl": 0, "x-queue-type": "quorum", "x-delivery-limit": 3}, True),
        ({"x-dead-letter-exchange": "d", "x-dead-letter-routing-key": "k", "x-custom": [1]}, True),
        ({"x-message-ttl": -1}, False), ({"x-expires": 0}, False), ({"x-max-length": "10"}, False),
        ({"x-queue-type": "stream"}, False), ({"x-overflow": "drop-tail"}, False),
        ({"x-dead-letter-routing-key": "k"}, False), ({"x-dead-letter-exchange": 5}, False),
    ],
)  # fmt: skip
def test_queue_arguments_are_checked(arguments: dict[str, object], ok: bool) -> None:
    if ok:
        topology.check_queue_arguments(arguments, "queue 'q'")
    else:
        assert _code(topology.check_queue_arguments, arguments, "queue 'q'") == PRECONDITION_FAILED


def test_x_expires_counts_from_the_last_declare_and_touch() -> None:
    doc = MetaDoc()
    d = topology.QueueDeclare("exp", False, True, False, False, {"x-expires": 1000})
    queue = topology.declare_queue(doc, "/", d, "c1", "broker-a", now_ms=10_000)
    assert queue.used_ms == 10_000 and queue.expires_ms == 1000
    assert topology.expire_queue(doc, "/", queue, 10_999) is None  # not unused for long enough
    topology.declare_queue(doc, "/", d, "c1", "broker-a", now_ms=10_500)  # a redeclare is a use
    assert topology.expire_queue(doc, "/", queue, 11_000) is None
    touched = topology.touch_queue(doc, "/", queue, 11_200)  # a basic.get or a consumer
    assert touched.used_ms == 11_200 and topology.expire_queue(doc, "/", queue, 12_199) is None
    gone = topology.expire_queue(doc, "/", queue, 12_200)
    assert gone is not None and gone.id == queue.id and "exp" not in doc.vhost("/").queues


def test_x_expires_never_removes_another_queue_of_the_same_name() -> None:
    doc = MetaDoc()
    d = topology.QueueDeclare("q", False, True, False, False, {"x-expires": 1000})
    old = topology.declare_queue(doc, "/", d, "c1", "broker-a", now_ms=0)
    topology.delete_queue(doc, "/", "q", "c1")
    new = topology.declare_queue(doc, "/", d, "c1", "broker-a", now_ms=5_000)
    assert topology.expire_queue(doc, "/", old, 9_000) is None and doc.vhost("/").queues["q"] == new
    plain = topology.declare_queue(doc, "/", topology.QueueDeclare("p", False, True, False, False, {}), "c1", "b", 1)
    assert topology.expire_queue(doc, "/", plain, 10**12) is None and plain.used_ms == 0  # no x-expires: kept
