"""MQTT 5.0 properties (section 2.2.2): the table of identifiers, and their codec.

A property list is a Variable Byte Integer length and then properties, each an identifier
(a Variable Byte Integer, all of them one byte today) and a value of the identifier's type. Decoded,
a list is a `Props` dict from identifier to value; the two properties that may repeat hold lists:
User Property (0x26) a list of (name, value) pairs in order, Subscription Identifier (0x0B) a list of
ints. An identifier not valid for the packet, or a value not of its type, is a Malformed Packet; a
property given twice where it may not repeat, or a value the specification forbids (a Receive
Maximum of 0, ...), a Protocol Error.
"""

from __future__ import annotations

import struct
from typing import Any

from proxy.mqtt.codec import Cursor, binary, utf8, varint
from proxy.mqtt.codes import malformed, protocol_error

Props = dict[int, Any]
EMPTY: Props = {}

PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_ID = 0x0B
SESSION_EXPIRY = 0x11
ASSIGNED_CLIENT_ID = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTH_METHOD = 0x15
AUTH_DATA = 0x16
REQUEST_PROBLEM_INFO = 0x17
WILL_DELAY = 0x18
REQUEST_RESPONSE_INFO = 0x19
RESPONSE_INFO = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_AVAILABLE = 0x28
SUBSCRIPTION_IDS_AVAILABLE = 0x29
SHARED_AVAILABLE = 0x2A

BYTE, U16, U32, VARINT, TEXT, BINARY, PAIR = range(7)

# Packet kinds a property may appear in (WILL: the will properties of a CONNECT).
CONNECT, CONNACK, PUBLISH, ACK, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH, WILL = range(11)
_ACKS = {ACK, SUBACK, UNSUBACK}

# identifier -> (type, packets where it is valid)
TABLE: dict[int, tuple[int, frozenset[int]]] = {
    PAYLOAD_FORMAT: (BYTE, frozenset({PUBLISH, WILL})),
    MESSAGE_EXPIRY: (U32, frozenset({PUBLISH, WILL})),
    CONTENT_TYPE: (TEXT, frozenset({PUBLISH, WILL})),
    RESPONSE_TOPIC: (TEXT, frozenset({PUBLISH, WILL})),
    CORRELATION_DATA: (BINARY, frozenset({PUBLISH, WILL})),
    SUBSCRIPTION_ID: (VARINT, frozenset({PUBLISH, SUBSCRIBE})),
    SESSION_EXPIRY: (U32, frozenset({CONNECT, CONNACK, DISCONNECT})),
    ASSIGNED_CLIENT_ID: (TEXT, frozenset({CONNACK})),
    SERVER_KEEP_ALIVE: (U16, frozenset({CONNACK})),
    AUTH_METHOD: (TEXT, frozenset({CONNECT, CONNACK, AUTH})),
    AUTH_DATA: (BINARY, frozenset({CONNECT, CONNACK, AUTH})),
    REQUEST_PROBLEM_INFO: (BYTE, frozenset({CONNECT})),
    WILL_DELAY: (U32, frozenset({WILL})),
    REQUEST_RESPONSE_INFO: (BYTE, frozenset({CONNECT})),
    RESPONSE_INFO: (TEXT, frozenset({CONNACK})),
    SERVER_REFERENCE: (TEXT, frozenset({CONNACK, DISCONNECT})),
    REASON_STRING: (TEXT, frozenset({CONNACK, DISCONNECT, AUTH, *_ACKS})),
    RECEIVE_MAXIMUM: (U16, frozenset({CONNECT, CONNACK})),
    TOPIC_ALIAS_MAXIMUM: (U16, frozenset({CONNECT, CONNACK})),
    TOPIC_ALIAS: (U16, frozenset({PUBLISH})),
    MAXIMUM_QOS: (BYTE, frozenset({CONNACK})),
    RETAIN_AVAILABLE: (BYTE, frozenset({CONNACK})),
    USER_PROPERTY: (PAIR, frozenset(range(11))),
    MAXIMUM_PACKET_SIZE: (U32, frozenset({CONNECT, CONNACK})),
    WILDCARD_AVAILABLE: (BYTE, frozenset({CONNACK})),
    SUBSCRIPTION_IDS_AVAILABLE: (BYTE, frozenset({CONNACK})),
    SHARED_AVAILABLE: (BYTE, frozenset({CONNACK})),
}
_REPEATABLE = {USER_PROPERTY, SUBSCRIPTION_ID}
# Values that must be 0 or 1, and values that must not be 0 (Protocol Errors otherwise).
_BOOLEAN = {PAYLOAD_FORMAT, REQUEST_PROBLEM_INFO, REQUEST_RESPONSE_INFO}
_NONZERO = {RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, TOPIC_ALIAS, SUBSCRIPTION_ID}
_U16S = struct.Struct(">H")
_U32S = struct.Struct(">I")


def decode(cur: Cursor, kind: int) -> Props:
    """The property list at the cursor, for a packet of `kind`."""
    length = cur.varint()
    if length == 0:
        return EMPTY
    end = cur.pos + length
    if end > cur.end:
        raise malformed(f"a property length of {length} runs past the packet's end")
    props: Props = {}
    inner = Cursor(cur.data, cur.pos, end)
    while inner.pos < end:
        ident = inner.varint()
        entry = TABLE.get(ident)
        if entry is None or kind not in entry[1]:
            raise malformed(f"property 0x{ident:02X} is not valid in this packet")
        kind_of_value = entry[0]
        value: Any
        if kind_of_value == BYTE:
            value = inner.u8()
        elif kind_of_value == U16:
            value = inner.u16()
        elif kind_of_value == U32:
            value = inner.u32()
        elif kind_of_value == VARINT:
            value = inner.varint()
        elif kind_of_value == TEXT:
            value = inner.text(f"property 0x{ident:02X}")
        elif kind_of_value == BINARY:
            value = inner.binary()
        else:
            value = (inner.text("a user property's name"), inner.text("a user property's value"))
        if ident in _BOOLEAN and value > 1:
            raise protocol_error(f"property 0x{ident:02X} must be 0 or 1, not {value}")
        if ident in _NONZERO and value == 0:
            raise protocol_error(f"property 0x{ident:02X} must not be 0")
        if ident in _REPEATABLE:
            props.setdefault(ident, []).append(value)
        elif ident in props:
            raise protocol_error(f"property 0x{ident:02X} is given twice")
        else:
            props[ident] = value
    if inner.pos != end:
        raise malformed("the last property runs past the property length")
    cur.pos = end
    return props


def encode(props: Props) -> bytes:
    """The property list of `props` (length included); identifiers in ascending order."""
    if not props:
        return b"\x00"
    parts: list[bytes] = []
    for ident in sorted(props):
        value = props[ident]
        kind = TABLE[ident][0]
        values = value if ident in _REPEATABLE else (value,)
        for v in values:
            parts.append(bytes((ident,)))
            if kind == BYTE:
                parts.append(bytes((v,)))
            elif kind == U16:
                parts.append(_U16S.pack(v))
            elif kind == U32:
                parts.append(_U32S.pack(v))
            elif kind == VARINT:
                parts.append(varint(v))
            elif kind == TEXT:
                parts.append(utf8(v))
            elif kind == BINARY:
                parts.append(binary(v))
            else:
                parts.append(utf8(v[0]) + utf8(v[1]))
    body = b"".join(parts)
    return varint(len(body)) + body
