"""The AMQP frames' fast paths (proxy/amqp/frames.py) read and write what pamqp does: a
basic.publish, a basic.ack and a content header's properties read with struct give pamqp's
values, what they do not take goes to pamqp, a basic.deliver written with struct is pamqp's
bytes, and the buffered frame reader reads frames however the bytes arrive."""

from __future__ import annotations

import asyncio
import datetime
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, header
from pamqp import frame as pframe

from proxy.amqp import frames
from proxy.amqp.codes import AmqpError

names = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
exchange_names = st.from_regex(r"[a-zA-Z0-9\-_.:@#,/+ ]{0,40}", fullmatch=True)


def _payload(method: commands.Basic.Publish | commands.Basic.Ack | commands.Basic.Nack) -> bytes:
    return pframe.marshal(method, 1)[7:-1]


@given(exchange_names, names, st.booleans(), st.booleans())
def test_a_publish_reads_as_pamqp_reads_it(exchange: str, key: str, mandatory: bool, immediate: bool) -> None:
    payload = _payload(commands.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory,
                                              immediate=immediate))  # fmt: skip
    decoded = frames.decode_method(payload)
    assert isinstance(decoded, commands.Basic.Publish)
    assert frames.fast_publish(payload) == frames.publish_method(decoded)


@given(st.binary(max_size=40))
def test_whatever_a_publish_fast_path_takes_pamqp_takes_alike(tail: bytes) -> None:
    payload = b"\x00\x3c\x00\x28" + tail
    fast = frames.fast_publish(payload)
    if fast is not None:
        decoded = frames.decode_method(payload)
        assert isinstance(decoded, commands.Basic.Publish)
        assert fast == frames.publish_method(decoded)


def test_an_unusual_publish_is_left_to_pamqp() -> None:
    bad_name = b"\x00\x3c\x00\x28\x00\x00\x03a*b\x01q\x00"  # '*' is not allowed in exchange names
    ticket = b"\x00\x3c\x00\x28\x00\x01\x00\x01q\x00"
    for payload in (bad_name, ticket, b"\x00\x3c\x00\x28\x00\x00\x05ab"):
        assert frames.fast_publish(payload) is None


@given(st.integers(0, 2**63 - 1), st.booleans())
def test_an_ack_reads_as_pamqp_reads_it(tag: int, multiple: bool) -> None:
    payload = _payload(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))
    assert frames.fast_ack(payload) == (tag, multiple)
    assert frames.fast_ack(_payload(commands.Basic.Nack(delivery_tag=tag))) is None


@given(st.text(max_size=80), st.integers(1, 2**63 - 1), st.booleans(), exchange_names, names)
def test_a_deliver_is_the_bytes_pamqp_writes(tag: str, delivery_tag: int, redelivered: bool, ex: str, key: str) -> None:
    method = commands.Basic.Deliver(consumer_tag=tag, delivery_tag=delivery_tag, redelivered=redelivered,
                                    exchange=ex, routing_key=key)  # fmt: skip
    assert frames.deliver_bytes(5, tag, delivery_tag, redelivered, ex, key) == pframe.marshal(method, 5)


short = st.text(max_size=30)
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | short, content_encoding=st.none() | short,
    headers=st.none() | st.just({}) | st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=2),
    delivery_mode=st.none() | st.sampled_from([1, 2]), priority=st.none() | st.integers(0, 9),
    correlation_id=st.none() | short, reply_to=st.none() | short, expiration=st.none() | st.just("1000"),
    message_id=st.none() | short,
    timestamp=st.none() | st.datetimes(datetime.datetime(2000, 1, 1), datetime.datetime(2100, 1, 1),
                                       timezones=st.just(datetime.UTC)).map(lambda d: d.replace(microsecond=0)),
    message_type=st.none() | short, user_id=st.none() | short, app_id=st.none() | short,
)  # fmt: skip


@given(properties)
def test_content_header_properties_are_kept_as_sent(props: commands.Basic.Properties) -> None:
    payload = pframe.marshal(header.ContentHeader(0, 7, props), 1)[7:-1]
    got = frames.decode_header(payload)
    assert (got.class_id, got.body_size, got.properties) == (60, 7, payload[12:])


@given(st.binary(min_size=2, max_size=40))
def test_properties_the_fast_path_passes_pamqp_decodes(data: bytes) -> None:
    if frames._plain_properties(data):
        offset, flags = header.ContentHeader._get_flags(data)
        commands.Basic.Properties().unmarshal(flags, data[offset:])


@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 8]), st.integers(0, 9), st.binary(max_size=300)), max_size=12),
       st.lists(st.integers(1, 200), min_size=1, max_size=8))  # fmt: skip
def test_the_frame_reader_reads_frames_however_the_bytes_arrive(sent: list[tuple[int, int, bytes]],
                                                                cuts: list[int]) -> None:  # fmt: skip
    data = b"".join(struct.pack(">BHI", k, c, len(p)) + p + b"\xce" for k, c, p in sent)

    async def read_all() -> list[frames.Frame]:
        reader = asyncio.StreamReader()
        at, i = 0, 0
        while at < len(data):  # fed in pieces of the given sizes
            reader.feed_data(data[at : at + cuts[i % len(cuts)]])
            at, i = at + cuts[i % len(cuts)], i + 1
        reader.feed_eof()
        got = []
        framed = frames.FrameReader(reader)
        with pytest.raises(asyncio.IncompleteReadError):
            while True:
                got.append(await framed.next(4096))
        return got

    assert asyncio.run(read_all()) == [frames.Frame(k, c, p) for k, c, p in sent]


def test_the_frame_reader_refuses_what_read_frame_refuses() -> None:
    async def first(data: bytes) -> frames.Frame:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await frames.FrameReader(reader).next(4096)

    with pytest.raises(AmqpError, match="over the negotiated frame_max 4096"):
        asyncio.run(first(struct.pack(">BHI", 3, 1, 5000)))
    with pytest.raises(AmqpError, match="does not end with 0xCE"):
        asyncio.run(first(struct.pack(">BHI", 1, 1, 2) + b"ab\x00"))
