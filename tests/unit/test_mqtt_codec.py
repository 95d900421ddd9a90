"""The MQTT packet codec (proxy/mqtt/codec.py, packets.py, properties.py): round trips of every
client packet in both protocol versions, and the reason code each kind of bad input gets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.mqtt import codes as C
from proxy.mqtt import packets as K
from proxy.mqtt import properties as P
from proxy.mqtt.codec import Framer, varint
from proxy.mqtt.codes import MqttError

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
topic = text.filter(lambda t: t and "+" not in t and "#" not in t)
payload = st.binary(max_size=300)
user_props = st.lists(st.tuples(text, text), max_size=3)


def frame(raw: bytes, limit: int = 1 << 20) -> tuple[int, bytes]:
    (only,) = list(Framer(limit).feed(raw))
    return only


def roundtrip(pkt: K.Packet, version: int) -> K.Packet:
    first, body = frame(K.encode_client(pkt, version))
    if isinstance(pkt, K.Connect):
        return K.decode_connect(first, body)
    return K.decode(first, body, version)


@settings(max_examples=150, deadline=None)
@given(version=st.sampled_from([K.V311, K.V5]), t=topic, data=payload, qos=st.integers(0, 2), retain=st.booleans(),
       pid=st.integers(1, 65535), users=user_props, expiry=st.none() | st.integers(0, 2**32 - 1))  # fmt: skip
def test_publish_roundtrips(version: int, t: str, data: bytes, qos: int, retain: bool, pid: int,
                            users: list[tuple[str, str]], expiry: int | None) -> None:  # fmt: skip
    props: P.Props = {}
    if version == K.V5:
        if users:
            props[P.USER_PROPERTY] = users
        if expiry is not None:
            props[P.MESSAGE_EXPIRY] = expiry
    pkt = K.Publish(t, data, qos, retain, qos > 0 and retain, pid if qos else 0, props)
    assert roundtrip(pkt, version) == pkt


@settings(max_examples=100, deadline=None)
@given(version=st.sampled_from([K.V311, K.V5]), cid=text, clean=st.booleans(), keep=st.integers(0, 65535),
       will=st.none() | st.tuples(topic, payload, st.integers(0, 2), st.booleans()),
       user=st.none() | text, password=st.none() | st.binary(max_size=20))  # fmt: skip
def test_connect_roundtrips(version: int, cid: str, clean: bool, keep: int,
                            will: tuple[str, bytes, int, bool] | None, user: str | None,
                            password: bytes | None) -> None:  # fmt: skip
    if version == K.V311 and user is None:
        password = None
    w = None if will is None else K.Will(*will, props={P.WILL_DELAY: 3} if version == K.V5 else {})
    props = {P.SESSION_EXPIRY: 60, P.RECEIVE_MAXIMUM: 10} if version == K.V5 else {}
    pkt = K.Connect(version, clean, keep, cid, w, user, password, props)
    assert roundtrip(pkt, version) == pkt


@settings(max_examples=100, deadline=None)
@given(version=st.sampled_from([K.V311, K.V5]), pid=st.integers(1, 65535),
       entries=st.lists(st.tuples(text.filter(bool), st.integers(0, 2), st.booleans(), st.booleans(),
                                  st.integers(0, 2)), min_size=1, max_size=4))  # fmt: skip
def test_subscribe_and_unsubscribe_roundtrip(version: int, pid: int,
                                             entries: list[tuple[str, int, bool, bool, int]]) -> None:  # fmt: skip
    def options(qos: int, nl: bool, rap: bool, rh: int) -> K.SubOptions:
        return K.SubOptions(qos, nl, rap, rh) if version == K.V5 else K.SubOptions(qos)

    sub = K.Subscribe(pid, [(f, options(q, nl, rap, rh)) for f, q, nl, rap, rh in entries],
                      {P.SUBSCRIPTION_ID: [7]} if version == K.V5 else {})  # fmt: skip
    assert roundtrip(sub, version) == sub
    unsub = K.Unsubscribe(pid, [f for f, *_ in entries])
    assert roundtrip(unsub, version) == unsub


@pytest.mark.parametrize("kind", [K.PUBACK, K.PUBREC, K.PUBREL, K.PUBCOMP])
def test_acks_roundtrip_in_both_forms(kind: int) -> None:
    assert roundtrip(K.Ack(kind, 9), K.V311) == K.Ack(kind, 9)
    assert roundtrip(K.Ack(kind, 9, 0x10), K.V5) == K.Ack(kind, 9, 0x10)
    with_props = K.Ack(kind, 9, 0x80, {P.REASON_STRING: "no"})
    assert roundtrip(with_props, K.V5) == with_props


def test_framer_splits_a_stream_fed_byte_by_byte() -> None:
    raws = [K.encode_client(K.Publish("a/b", b"x" * n, 1, packet_id=1), K.V311) for n in (0, 5, 200, 20_000)]
    framer = Framer(1 << 20)
    got = [p for byte in b"".join(raws) for p in framer.feed(bytes([byte]))]
    assert [len(body) for _, body in got] == [len(frame(r)[1]) for r in raws]
    assert framer.buffered == 0


def test_varint_limits() -> None:
    assert varint(0) == b"\x00" and varint(127) == b"\x7f" and varint(128) == b"\x80\x01"
    assert varint(268_435_455) == b"\xff\xff\xff\x7f"


def reason_of(raw: bytes, version: int = K.V5, connect: bool = False, limit: int = 1 << 20) -> int:
    with pytest.raises(MqttError) as err:
        for first, body in Framer(limit).feed(raw):
            K.decode_connect(first, body) if connect else K.decode(first, body, version)
    return err.value.reason


def test_bad_input_gets_the_reason_the_specification_names() -> None:
    publish = K.encode_client(K.Publish("a", b"x", 1, packet_id=5), K.V5)
    assert reason_of(b"\x30\xff\xff\xff\xff\x01") == C.MALFORMED_PACKET  # a 5-byte remaining length
    assert reason_of(bytes([0x36]) + publish[1:]) == C.MALFORMED_PACKET  # QoS 3
    assert reason_of(bytes([0x38]) + publish[1:]) == C.MALFORMED_PACKET  # DUP at QoS 0
    assert reason_of(b"\x82\x05\x00\x01\x00\x01a") == C.MALFORMED_PACKET  # SUBSCRIBE without options
    assert reason_of(b"\x80\x06\x00\x01\x00\x00\x01a\x00") == C.MALFORMED_PACKET  # SUBSCRIBE flags 0
    assert reason_of(b"\xc1\x00") == C.MALFORMED_PACKET  # PINGREQ with a flag
    assert reason_of(b"\x00\x00") == C.MALFORMED_PACKET  # type 0
    assert reason_of(b"\xf0\x00", K.V311) == C.MALFORMED_PACKET  # AUTH in 3.1.1
    assert reason_of(b"\x20\x02\x00\x00") == C.PROTOCOL_ERROR  # CONNACK from a client
    assert reason_of(b"\x40\x02\x00\x00") == C.PROTOCOL_ERROR  # packet id 0
    assert reason_of(b"\x82\x03\x00\x01\x00") == C.PROTOCOL_ERROR  # SUBSCRIBE without a filter
    assert reason_of(b"\x82\x07\x00\x01\x00\x00\x01a\x03") == C.MALFORMED_PACKET  # QoS 3 subscription
    assert reason_of(b"\x82\x07\x00\x01\x00\x00\x01a\x30") == C.PROTOCOL_ERROR  # retain handling 3
    bad_utf8 = b"\x30\x05\x00\x02\xc3\x28x"
    assert reason_of(bad_utf8) == C.MALFORMED_PACKET
    assert reason_of(b"\x30\x05\x00\x02a\x00x", K.V311) == C.MALFORMED_PACKET  # U+0000 in a topic
    assert reason_of(K.encode_client(K.Publish("a", b"x" * 100), K.V311), limit=50) == C.PACKET_TOO_LARGE
    dup_prop = b"\x30\x09\x00\x01a\x04\x01\x00\x01\x00x"
    assert reason_of(dup_prop) == C.PROTOCOL_ERROR  # payload format indicator twice
    assert reason_of(b"\x30\x07\x00\x01a\x02\x11\x00x") == C.MALFORMED_PACKET  # session expiry in a PUBLISH


def test_connect_refusals() -> None:
    base = K.Connect(K.V311, True, 10, "c")
    raw = bytearray(K.encode_client(base, K.V311))
    raw[8] = 3  # protocol level 3
    assert reason_of(bytes(raw), connect=True) == C.UNSUPPORTED_PROTOCOL_VERSION
    raw = bytearray(K.encode_client(base, K.V311))
    raw[9] |= 0x01  # reserved flag
    assert reason_of(bytes(raw), connect=True) == C.MALFORMED_PACKET
    raw = bytearray(K.encode_client(base, K.V311))
    raw[9] |= 0x18  # will QoS 3 (and no will)
    assert reason_of(bytes(raw), connect=True) == C.MALFORMED_PACKET
    assert reason_of(K.encode_client(K.PingReq(), K.V311), connect=True) == C.PROTOCOL_ERROR
    assert reason_of(K.encode_client(base, K.V311) + b"x"[:0], K.V311) == C.PROTOCOL_ERROR  # a second CONNECT
