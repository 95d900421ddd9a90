"""One error hierarchy for all of Sluice.

Every error a client can cause, or a component can report across a process boundary, is a
`SluiceError` subclass that carries its `apache.rocketmq.v2.Code` and whether retrying can help.
Edges turn exceptions into what they send in exactly one function each: the public gRPC proxy in
`proxy.grpc.status.status_of`, the internal services in `proto.rpc.wire_error` (a call's status
and each entry of a batch alike); anything that is not a `SluiceError` becomes
INTERNAL_SERVER_ERROR there and is logged with its traceback. Inside, per-entry results (an
`AckResult`, a send's outcome) carry the exception itself, never a bare code.

The internal RPC carries (code, message) and `error_for_code` rebuilds the same class on the
other side, so the proxy behaves the same with a Local or a Cluster backend.
"""

from __future__ import annotations

from common.codes import Code


class SluiceError(Exception):
    """Base of every coded error. `message` is meant for a person: say what was wrong and what to do."""

    code: Code = Code.INTERNAL_SERVER_ERROR
    retriable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__

    def __str__(self) -> str:
        return self.message


# -- client input -------------------------------------------------------------------------------


class BadRequest(SluiceError):
    code = Code.BAD_REQUEST


class IllegalTopic(BadRequest):
    code = Code.ILLEGAL_TOPIC


class IllegalConsumerGroup(BadRequest):
    code = Code.ILLEGAL_CONSUMER_GROUP


class IllegalMessageTag(BadRequest):
    code = Code.ILLEGAL_MESSAGE_TAG


class IllegalMessageKey(BadRequest):
    code = Code.ILLEGAL_MESSAGE_KEY


class IllegalMessageGroup(BadRequest):
    code = Code.ILLEGAL_MESSAGE_GROUP


class IllegalMessagePropertyKey(BadRequest):
    code = Code.ILLEGAL_MESSAGE_PROPERTY_KEY


class IllegalMessageId(BadRequest):
    code = Code.ILLEGAL_MESSAGE_ID


class InvalidTransactionId(BadRequest):
    code = Code.INVALID_TRANSACTION_ID


class IllegalFilterExpression(BadRequest):
    code = Code.ILLEGAL_FILTER_EXPRESSION


class IllegalInvisibleTime(BadRequest):
    code = Code.ILLEGAL_INVISIBLE_TIME


class IllegalDeliveryTime(BadRequest):
    code = Code.ILLEGAL_DELIVERY_TIME


class InvalidReceiptHandle(BadRequest):
    code = Code.INVALID_RECEIPT_HANDLE


class MessageTypeConflict(BadRequest):
    """The message's type is not one the topic accepts."""

    code = Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


class IllegalLiteTopic(BadRequest):
    code = Code.ILLEGAL_LITE_TOPIC


class ClientIdRequired(BadRequest):
    code = Code.CLIENT_ID_REQUIRED


class IllegalPollingTime(BadRequest):
    code = Code.ILLEGAL_POLLING_TIME


class IllegalOffset(BadRequest):
    code = Code.ILLEGAL_OFFSET


class MessageBodyTooLarge(BadRequest):
    code = Code.MESSAGE_BODY_TOO_LARGE


class MessageBodyEmpty(BadRequest):
    code = Code.MESSAGE_BODY_EMPTY


class MessagePropertiesTooLarge(BadRequest):
    code = Code.MESSAGE_PROPERTIES_TOO_LARGE


# -- access -------------------------------------------------------------------------------------


class Unauthorized(SluiceError):
    code = Code.UNAUTHORIZED


class Forbidden(SluiceError):
    code = Code.FORBIDDEN


# -- lookups ------------------------------------------------------------------------------------


class NotFound(SluiceError):
    code = Code.NOT_FOUND


class MessageNotFound(NotFound):
    code = Code.MESSAGE_NOT_FOUND


class TopicNotFound(NotFound):
    code = Code.TOPIC_NOT_FOUND


class ConsumerGroupNotFound(NotFound):
    code = Code.CONSUMER_GROUP_NOT_FOUND


class OffsetNotFound(NotFound):
    code = Code.OFFSET_NOT_FOUND


# -- state and capacity ------------------------------------------------------------------------


class PreconditionFailed(SluiceError):
    code = Code.PRECONDITION_FAILED


class TooManyRequests(SluiceError):
    code = Code.TOO_MANY_REQUESTS
    retriable = True


class LiteTopicQuotaExceeded(SluiceError):
    """A bind topic already holds as many lite topics as it may (its `max_lite_topics`)."""

    code = Code.LITE_TOPIC_QUOTA_EXCEEDED


class LiteSubscriptionQuotaExceeded(SluiceError):
    """A lite consumer would subscribe to more lite topics than its quota."""

    code = Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED


class RequestTimeout(SluiceError):
    code = Code.REQUEST_TIMEOUT
    retriable = True


class ProxyTimeout(SluiceError):
    code = Code.PROXY_TIMEOUT
    retriable = True


class Unavailable(SluiceError):
    """A dependency (a broker, the NameServer, S3) cannot be reached now; retrying later can help."""

    code = Code.HA_NOT_AVAILABLE
    retriable = True


class Unreachable(Unavailable):
    """A broker's transport failed (no connection, or it broke): raised by the internal RPC's client
    side only (proto/rpc.py), never sent over the wire."""


class NotPrimary(Unavailable):
    """A member of a broker group refused a call because it is not (or no longer) the group's
    primary: a replica, a fenced or deposed primary, one draining for a switchover. Nothing was
    acknowledged; the group's primary can take the call (a proxy finds it and retries there:
    proxy/core/producer.py). Over the internal RPC it travels as HA_NOT_AVAILABLE with a message
    ending in `SUFFIX`, which `error_for_code` recognises."""

    SUFFIX = "; retry on the group's primary"

    def __init__(self, message: str = "") -> None:
        super().__init__(message if message.endswith(self.SUFFIX) else message + self.SUFFIX)


class TooFewInSync(Unavailable):
    """A broker group's primary refused a write because fewer than `min_insync` members are in
    sync: replicas cut off or down, or, right after a failover, not yet caught up with the new
    primary. A send refused so was not acknowledged (and, refused before it was written, not
    stored); once a replica is back in sync the primary takes it, so a proxy retries it there
    within the client's deadline (proxy/core/failover.py). Over the internal RPC it travels as
    HA_NOT_AVAILABLE with a message ending in `SUFFIX`, which `error_for_code` recognises."""

    SUFFIX = "; retry when the group's replicas are back in sync"

    def __init__(self, message: str = "") -> None:
        super().__init__(message if message.endswith(self.SUFFIX) else message + self.SUFFIX)


class NotThisServer(Unavailable):
    """The address answers, but as another kind of server (gRPC UNIMPLEMENTED: it has none of the
    calls asked for): a wrong address, such as a proxy's client port given as a NameServer."""


class Unsupported(SluiceError):
    code = Code.UNSUPPORTED


# -- storage ------------------------------------------------------------------------------------


class MessageCorrupted(SluiceError):
    """A stored record failed its checks (magic, length, CRC). Raised for reads; never silently skipped."""

    code = Code.MESSAGE_CORRUPTED


class StoreCorrupted(SluiceError):
    """The store cannot be opened safely; the message says where and how an operator can proceed."""

    code = Code.INTERNAL_SERVER_ERROR


class StoreClosed(SluiceError):
    code = Code.HA_NOT_AVAILABLE
    retriable = True


class InternalError(SluiceError):
    code = Code.INTERNAL_SERVER_ERROR


def code_of(exc: BaseException) -> Code:
    """The protocol code for any exception: its own for a SluiceError, INTERNAL_SERVER_ERROR otherwise."""
    if isinstance(exc, SluiceError):
        return exc.code
    return Code.INTERNAL_SERVER_ERROR


def _registry() -> dict[Code, type[SluiceError]]:
    # Breadth-first from the base: the most general class that owns a code represents it
    # (BadRequest for BAD_REQUEST rather than QueueNotFound, which shares the code).
    table: dict[Code, type[SluiceError]] = {}
    pending: list[type[SluiceError]] = [SluiceError]
    while pending:
        cls = pending.pop(0)
        table.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    table[Code.INTERNAL_SERVER_ERROR] = InternalError  # not the bare base class (nor StoreCorrupted)
    return table


_BY_CODE = _registry()


def error_for_code(code: int, message: str) -> SluiceError:
    """Rebuild the error class for a code received over the internal RPC."""
    try:
        cls = _BY_CODE[Code(code)]
    except (ValueError, KeyError):
        cls = InternalError
    if cls is Unavailable:
        cls = next((c for c in (NotPrimary, TooFewInSync) if message.endswith(c.SUFFIX)), cls)
    return cls(message)
