"""MQTT control packets, 3.1.1 (protocol level 4) and 5.0 (level 5): the client's packets decoded,
the server's encoded. Pure functions over proxy/mqtt/codec.py and proxy/mqtt/properties.py.

| type | packet | flags | from |
|---|---|---|---|
| 1 | CONNECT | 0 | client |
| 2 | CONNACK | 0 | server |
| 3 | PUBLISH | DUP (bit 3), QoS (bits 2-1), RETAIN (bit 0) | both |
| 4, 5, 7 | PUBACK, PUBREC, PUBCOMP | 0 | both |
| 6 | PUBREL | 0b0010 | both |
| 8 | SUBSCRIBE | 0b0010 | client |
| 9 | SUBACK | 0 | server |
| 10 | UNSUBSCRIBE | 0b0010 | client |
| 11 | UNSUBACK | 0 | server |
| 12, 13 | PINGREQ, PINGRESP | 0 | client, server |
| 14 | DISCONNECT | 0 | both (server-sent only in 5.0) |
| 15 | AUTH | 0 | both (5.0 only) |

Anything else (a reserved type or flag, QoS 3, a field cut short, bytes left over) is a Malformed
Packet; a server packet sent by a client, a packet id of 0, an empty SUBSCRIBE, a Protocol Error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from proxy.mqtt import properties as P
from proxy.mqtt.codec import Cursor, binary, packet, utf8, varint
from proxy.mqtt.codes import UNSUPPORTED_PROTOCOL_VERSION, MqttError, malformed, protocol_error

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
V311, V5 = 4, 5
NAMES = {CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK", PUBREC: "PUBREC",
         PUBREL: "PUBREL", PUBCOMP: "PUBCOMP", SUBSCRIBE: "SUBSCRIBE", SUBACK: "SUBACK",
         UNSUBSCRIBE: "UNSUBSCRIBE", UNSUBACK: "UNSUBACK", PINGREQ: "PINGREQ", PINGRESP: "PINGRESP",
         DISCONNECT: "DISCONNECT", AUTH: "AUTH"}  # fmt: skip
_FLAGS_0010 = {PUBREL, SUBSCRIBE, UNSUBSCRIBE}
_SERVER_ONLY = {CONNACK, SUBACK, UNSUBACK, PINGRESP}
_U16 = struct.Struct(">H")
PINGRESP_BYTES = b"\xd0\x00"


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    version: int
    clean: bool
    keep_alive: int
    client_id: str
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL or PUBCOMP (`kind`)."""

    kind: int
    packet_id: int
    reason: int = 0
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    entries: list[tuple[str, SubOptions]]
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    filters: list[str]
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class Disconnect:
    reason: int = 0
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    reason: int = 0
    props: P.Props = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    pass


Packet = Connect | Publish | Ack | Subscribe | Unsubscribe | Disconnect | Auth | PingReq
_PING = PingReq()


# -- decoding ------------------------------------------------------------------------------------


def decode(first: int, body: bytes, version: int) -> Packet:
    """The client packet of fixed-header byte `first` and `body`, once the connection's protocol
    `version` is known (CONNECT itself: `decode_connect`)."""
    kind, flags = first >> 4, first & 0x0F
    if kind == PUBLISH:
        return decode_publish(flags, body, version)
    expected = 0b0010 if kind in _FLAGS_0010 else 0
    if flags != expected:
        raise malformed(f"{NAMES.get(kind, kind)} with reserved flags 0x{flags:X} (must be 0x{expected:X})")
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        return _decode_ack(kind, body, version)
    if kind == SUBSCRIBE:
        return _decode_subscribe(body, version)
    if kind == UNSUBSCRIBE:
        return _decode_unsubscribe(body, version)
    if kind == PINGREQ:
        if body:
            raise malformed("PINGREQ has no body")
        return _PING
    if kind == DISCONNECT:
        return _decode_disconnect(body, version)
    if kind == AUTH and version == V5:
        cur = Cursor(body)
        auth = Auth() if not body else Auth(cur.u8(), P.decode(cur, P.AUTH) if cur.left() else P.EMPTY)
        _finished(cur, "AUTH")
        return auth
    if kind == CONNECT:
        raise protocol_error("a second CONNECT on one connection")
    if kind in _SERVER_ONLY:
        raise protocol_error(f"{NAMES[kind]} is sent by servers, not clients")
    raise malformed(f"packet type {kind} is reserved")


def _finished(cur: Cursor, what: str) -> None:
    if cur.left():
        raise malformed(f"{cur.left()} bytes follow the end of a {what}")


def decode_connect(first: int, body: bytes) -> Connect:
    """A CONNECT. An unsupported protocol level raises MqttError(UNSUPPORTED_PROTOCOL_VERSION) with
    the level read (`.reason`), which the caller answers with the CONNACK its version knows."""
    if first != CONNECT << 4:
        if first >> 4 == CONNECT:
            raise malformed(f"CONNECT with reserved flags 0x{first & 0xF:X}")
        raise protocol_error(f"the first packet must be CONNECT, not {NAMES.get(first >> 4, first >> 4)}")
    cur = Cursor(body)
    name = cur.text("the protocol name")
    level = cur.u8()
    if name != "MQTT" or level not in (V311, V5):
        if name not in ("MQTT", "MQIsdp"):
            raise protocol_error(f"protocol name {name[:16]!r} is not MQTT")
        raise MqttError(UNSUPPORTED_PROTOCOL_VERSION,
                        f"protocol level {level} is not supported (4: MQTT 3.1.1, 5: MQTT 5.0)")  # fmt: skip
    flags = cur.u8()
    if flags & 0x01:
        raise malformed("CONNECT's reserved flag is set")
    has_will, will_qos, will_retain = bool(flags & 0x04), (flags >> 3) & 0x03, bool(flags & 0x20)
    has_password, has_username = bool(flags & 0x40), bool(flags & 0x80)
    if will_qos == 3:
        raise malformed("the will QoS is 3")
    if not has_will and (will_qos or will_retain):
        raise malformed("will QoS or will retain set without a will")
    if level == V311 and has_password and not has_username:
        raise malformed("a password without a user name (MQTT 3.1.1)")
    keep_alive = cur.u16()
    props = P.decode(cur, P.CONNECT) if level == V5 else P.EMPTY
    client_id = cur.text("the client identifier")
    will = None
    if has_will:
        will_props = P.decode(cur, P.WILL) if level == V5 else P.EMPTY
        will = Will(cur.text("the will topic"), cur.binary(), will_qos, will_retain, will_props)
    username = cur.text("the user name") if has_username else None
    password = cur.binary() if has_password else None
    _finished(cur, "CONNECT")
    return Connect(level, bool(flags & 0x02), keep_alive, client_id, will, username, password, props)


def decode_publish(flags: int, body: bytes, version: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise malformed("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and not qos:
        raise malformed("PUBLISH with DUP set at QoS 0")
    cur = Cursor(body)
    topic = cur.text("the topic name")
    packet_id = 0
    if qos:
        packet_id = cur.u16()
        if not packet_id:
            raise protocol_error("PUBLISH with packet identifier 0")
    props = P.decode(cur, P.PUBLISH) if version == V5 else P.EMPTY
    return Publish(topic, cur.rest(), qos, bool(flags & 0x01), dup, packet_id, props)


def _decode_ack(kind: int, body: bytes, version: int) -> Ack:
    cur = Cursor(body)
    packet_id = cur.u16()
    if not packet_id:
        raise protocol_error(f"{NAMES[kind]} with packet identifier 0")
    reason, props = 0, P.EMPTY
    if version == V5 and cur.left():
        reason = cur.u8()
        if cur.left():
            props = P.decode(cur, P.ACK)
    _finished(cur, NAMES[kind])
    return Ack(kind, packet_id, reason, props)


def _decode_subscribe(body: bytes, version: int) -> Subscribe:
    cur = Cursor(body)
    packet_id = cur.u16()
    if not packet_id:
        raise protocol_error("SUBSCRIBE with packet identifier 0")
    props = P.decode(cur, P.SUBSCRIBE) if version == V5 else P.EMPTY
    if len(props.get(P.SUBSCRIPTION_ID, ())) > 1:
        raise protocol_error("SUBSCRIBE with more than one subscription identifier")
    entries: list[tuple[str, SubOptions]] = []
    while cur.left():
        topic_filter = cur.text("a topic filter")
        options = cur.u8()
        reserved = 0xC0 if version == V5 else 0xFC
        if options & reserved:
            raise malformed(f"subscription options 0x{options:02X} set reserved bits")
        qos = options & 0x03
        if qos == 3:
            raise malformed("a subscription asks for QoS 3")
        handling = (options >> 4) & 0x03
        if handling == 3:
            raise protocol_error("retain handling 3 is reserved")
        entries.append((topic_filter, SubOptions(qos, bool(options & 0x04), bool(options & 0x08), handling)))
    if not entries:
        raise protocol_error("SUBSCRIBE without a topic filter")
    return Subscribe(packet_id, entries, props)


def _decode_unsubscribe(body: bytes, version: int) -> Unsubscribe:
    cur = Cursor(body)
    packet_id = cur.u16()
    if not packet_id:
        raise protocol_error("UNSUBSCRIBE with packet identifier 0")
    props = P.decode(cur, P.UNSUBSCRIBE) if version == V5 else P.EMPTY
    filters: list[str] = []
    while cur.left():
        filters.append(cur.text("a topic filter"))
    if not filters:
        raise protocol_error("UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, filters, props)


def _decode_disconnect(body: bytes, version: int) -> Disconnect:
    if version != V5:
        if body:
            raise malformed("DISCONNECT has no body in MQTT 3.1.1")
        return Disconnect()
    cur = Cursor(body)
    if not body:
        return Disconnect()
    reason = cur.u8()
    props = P.decode(cur, P.DISCONNECT) if cur.left() else P.EMPTY
    _finished(cur, "DISCONNECT")
    return Disconnect(reason, props)


# -- encoding (the server's packets) --------------------------------------------------------------


def connack(version: int, session_present: bool, reason: int, props: P.Props = P.EMPTY) -> bytes:
    if version == V5:
        return packet(CONNACK << 4, bytes((int(session_present), reason)) + P.encode(props))
    return packet(CONNACK << 4, bytes((int(session_present), reason)))


def ack(kind: int, packet_id: int, version: int, reason: int = 0, props: P.Props = P.EMPTY) -> bytes:
    """PUBACK, PUBREC, PUBREL (flags 0b0010) or PUBCOMP. A 5.0 ack with reason 0 and no
    properties is the 3.1.1 form (the specification allows leaving both out)."""
    first = (kind << 4) | (0b0010 if kind == PUBREL else 0)
    if version != V5 or (not reason and not props):
        return bytes((first, 2)) + _U16.pack(packet_id)
    if not props:
        return bytes((first, 3)) + _U16.pack(packet_id) + bytes((reason,))
    return packet(first, _U16.pack(packet_id) + bytes((reason,)) + P.encode(props))


def publish(version: int, topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int,
            props: bytes = b"\x00") -> bytes:  # fmt: skip
    """A PUBLISH to a client; `topic` as its UTF-8 bytes and, for 5.0, `props` already encoded
    (`properties.encode`): the hot path builds each once per message, not per subscriber."""
    first = (PUBLISH << 4) | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    head = _U16.pack(len(topic)) + topic
    if qos:
        head += _U16.pack(packet_id)
    if version == V5:
        head += props
    size = len(head) + len(payload)
    if size < 128:
        return bytes((first, size)) + head + payload
    return bytes((first,)) + varint(size) + head + payload


def suback(version: int, packet_id: int, reasons: list[int], props: P.Props = P.EMPTY) -> bytes:
    body = _U16.pack(packet_id) + (P.encode(props) if version == V5 else b"") + bytes(reasons)
    return packet(SUBACK << 4, body)


def unsuback(version: int, packet_id: int, reasons: list[int], props: P.Props = P.EMPTY) -> bytes:
    if version != V5:
        return packet(UNSUBACK << 4, _U16.pack(packet_id))
    return packet(UNSUBACK << 4, _U16.pack(packet_id) + P.encode(props) + bytes(reasons))


def disconnect(reason: int, props: P.Props = P.EMPTY) -> bytes:
    """A server DISCONNECT (5.0 only: 3.1.1 servers close the connection instead)."""
    if not props:
        return packet(DISCONNECT << 4, bytes((reason,)))
    return packet(DISCONNECT << 4, bytes((reason,)) + P.encode(props))


def encode_client(pkt: Packet, version: int) -> bytes:
    """A client's packet (tests and the benchmark's own client: one codec for both sides)."""
    if isinstance(pkt, Connect):
        flags = (0x02 if pkt.clean else 0) | (0x80 if pkt.username is not None else 0)
        flags |= 0x40 if pkt.password is not None else 0
        payload = utf8(pkt.client_id)
        if pkt.will is not None:
            w = pkt.will
            flags |= 0x04 | (w.qos << 3) | (0x20 if w.retain else 0)
            payload += (P.encode(w.props) if pkt.version == V5 else b"") + utf8(w.topic) + binary(w.payload)
        if pkt.username is not None:
            payload += utf8(pkt.username)
        if pkt.password is not None:
            payload += binary(pkt.password)
        head = utf8("MQTT") + bytes((pkt.version, flags)) + _U16.pack(pkt.keep_alive)
        return packet(CONNECT << 4, head + (P.encode(pkt.props) if pkt.version == V5 else b"") + payload)
    if isinstance(pkt, Publish):
        props = P.encode(pkt.props) if version == V5 else b""
        return publish(version, pkt.topic.encode(), pkt.payload, pkt.qos, pkt.retain, pkt.dup, pkt.packet_id,
                       props)  # fmt: skip
    if isinstance(pkt, Ack):
        return ack(pkt.kind, pkt.packet_id, version, pkt.reason, pkt.props)
    if isinstance(pkt, Subscribe):
        body = _U16.pack(pkt.packet_id) + (P.encode(pkt.props) if version == V5 else b"")
        for topic_filter, o in pkt.entries:
            options = o.qos | (0x04 if o.no_local else 0) | (0x08 if o.retain_as_published else 0)
            body += utf8(topic_filter) + bytes((options | (o.retain_handling << 4),))
        return packet((SUBSCRIBE << 4) | 0b0010, body)
    if isinstance(pkt, Unsubscribe):
        body = _U16.pack(pkt.packet_id) + (P.encode(pkt.props) if version == V5 else b"")
        return packet((UNSUBSCRIBE << 4) | 0b0010, body + b"".join(utf8(f) for f in pkt.filters))
    if isinstance(pkt, Disconnect):
        if version != V5 or (not pkt.reason and not pkt.props):
            return packet(DISCONNECT << 4, b"")
        return disconnect(pkt.reason, pkt.props)
    if isinstance(pkt, Auth):
        return packet(AUTH << 4, bytes((pkt.reason,)) + P.encode(pkt.props))
    return bytes((PINGREQ << 4, 0))
