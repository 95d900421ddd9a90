"""AMQP reply codes and the one map from Sluice's errors to them.

A channel error (soft) closes one channel with `channel.close`; a connection error (hard) closes
the connection with `connection.close`. Reply texts start with the code's name, as RabbitMQ's do
("NOT_FOUND - no queue 'q' in vhost '/'"), so clients and people read the same thing from both.
"""

from __future__ import annotations

from common.errors import (
    BadRequest,
    Forbidden,
    NotFound,
    PreconditionFailed,
    SluiceError,
)

REPLY_SUCCESS = 200
NO_ROUTE = 312
CONNECTION_FORCED = 320
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

NAMES = {
    REPLY_SUCCESS: "OK", NO_ROUTE: "NO_ROUTE", CONNECTION_FORCED: "CONNECTION_FORCED",
    ACCESS_REFUSED: "ACCESS_REFUSED", NOT_FOUND: "NOT_FOUND", RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED", FRAME_ERROR: "FRAME_ERROR", SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID", CHANNEL_ERROR: "CHANNEL_ERROR", UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR", NOT_ALLOWED: "NOT_ALLOWED", NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}  # fmt: skip

# Codes that close the connection (the spec's hard errors); the others close a channel.
_HARD = {CONNECTION_FORCED, FRAME_ERROR, SYNTAX_ERROR, COMMAND_INVALID, CHANNEL_ERROR, UNEXPECTED_FRAME,
         RESOURCE_ERROR, NOT_ALLOWED, NOT_IMPLEMENTED, INTERNAL_ERROR}  # fmt: skip

_MAX_TEXT = 255  # reply-text is a short string


def reply_text(code: int, detail: str) -> str:
    text = f"{NAMES.get(code, str(code))} - {detail}"
    return text.encode()[:_MAX_TEXT].decode(errors="ignore")


class AmqpError(Exception):
    """A reply to send: the channel's or the connection's close, naming the method that failed."""

    def __init__(self, code: int, detail: str, method: tuple[int, int] = (0, 0)) -> None:
        super().__init__(reply_text(code, detail))
        self.code = code
        self.text = reply_text(code, detail)
        self.method = method

    @property
    def hard(self) -> bool:
        return self.code in _HARD


def from_sluice(exc: SluiceError) -> AmqpError:
    """The AMQP reply to an error of the brokers: what the client did wrong is a channel error,
    a failure on our side closes the connection with INTERNAL_ERROR (the client reconnects)."""
    if isinstance(exc, NotFound):
        return AmqpError(NOT_FOUND, exc.message)
    if isinstance(exc, PreconditionFailed):
        return AmqpError(PRECONDITION_FAILED, exc.message)
    if isinstance(exc, Forbidden):
        return AmqpError(ACCESS_REFUSED, exc.message)
    if isinstance(exc, BadRequest):
        return AmqpError(PRECONDITION_FAILED, exc.message)
    return AmqpError(INTERNAL_ERROR, f"the broker failed: {exc.message}")
