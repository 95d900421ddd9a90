"""MQTT reason codes (5.0, section 2.4) and 3.1.1 CONNACK return codes, and the gateway's one error.

`MqttError` carries the 5.0 reason code the specification names for a condition; the connection
turns it into what the client's protocol version can hear (proxy/mqtt/connection.py): a 5.0 client
gets a CONNACK or DISCONNECT with that code and the message as its Reason String, a 3.1.1 client
the CONNACK return code that corresponds (`CONNACK_V3`), or the connection closed where 3.1.1 has
no packet for it. Every refusal is one of these; nothing a client sends reaches a traceback.
"""

from __future__ import annotations

from common.errors import (
    BadRequest,
    Forbidden,
    IllegalLiteTopic,
    IllegalTopic,
    LiteSubscriptionQuotaExceeded,
    LiteTopicQuotaExceeded,
    MessageTypeConflict,
    SluiceError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)

SUCCESS = 0x00
DISCONNECT_WITH_WILL = 0x04
NO_SUBSCRIPTION_EXISTED = 0x11
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_ID_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
SERVER_SHUTTING_DOWN = 0x8B

# 3.1.1 CONNACK return codes.
V3_ACCEPTED = 0x00
V3_BAD_PROTOCOL = 0x01
V3_IDENTIFIER_REJECTED = 0x02
V3_SERVER_UNAVAILABLE = 0x03
V3_BAD_CREDENTIALS = 0x04
V3_NOT_AUTHORIZED = 0x05

# The 3.1.1 CONNACK return code for a 5.0 CONNACK reason (the closest one; 0x03 for the rest).
CONNACK_V3 = {
    SUCCESS: V3_ACCEPTED,
    UNSUPPORTED_PROTOCOL_VERSION: V3_BAD_PROTOCOL,
    CLIENT_ID_NOT_VALID: V3_IDENTIFIER_REJECTED,
    BAD_USERNAME_OR_PASSWORD: V3_BAD_CREDENTIALS,
    NOT_AUTHORIZED: V3_NOT_AUTHORIZED,
    BAD_AUTHENTICATION_METHOD: V3_NOT_AUTHORIZED,
}

NAMES = {value: name for name, value in globals().items() if name.isupper() and isinstance(value, int)
         and not name.startswith("V3_") and name != "SUCCESS"}  # fmt: skip
NAMES[SUCCESS] = "SUCCESS"


class MqttError(Exception):
    """A condition the specification gives a reason code: `reason` (5.0 numbering) and a message a
    person understands (sent as the Reason String to 5.0 clients, logged in one line)."""

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{NAMES.get(self.reason, hex(self.reason))}: {self.message}"


def malformed(message: str) -> MqttError:
    return MqttError(MALFORMED_PACKET, message)


def protocol_error(message: str) -> MqttError:
    return MqttError(PROTOCOL_ERROR, message)


def from_sluice(exc: SluiceError) -> MqttError:
    """The one map from the brokers' errors to MQTT reason codes (a PUBACK's, a SUBACK entry's, a
    DISCONNECT's): what the client may change is named, a failure on our side is 0x80/0x88."""
    if isinstance(exc, IllegalTopic | IllegalLiteTopic | MessageTypeConflict):
        return MqttError(TOPIC_NAME_INVALID, exc.message)
    if isinstance(exc, Forbidden | Unauthorized):
        return MqttError(NOT_AUTHORIZED, exc.message)
    if isinstance(exc, LiteTopicQuotaExceeded | LiteSubscriptionQuotaExceeded | TooManyRequests):
        return MqttError(QUOTA_EXCEEDED, exc.message)
    if isinstance(exc, BadRequest):
        return MqttError(IMPLEMENTATION_SPECIFIC_ERROR, exc.message)
    if isinstance(exc, Unavailable):
        return MqttError(SERVER_UNAVAILABLE, exc.message)
    return MqttError(UNSPECIFIED_ERROR, f"the broker failed: {exc.message}")
