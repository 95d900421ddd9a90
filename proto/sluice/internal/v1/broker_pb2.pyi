from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConsumeFrom(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSUME_FROM_UNSPECIFIED: _ClassVar[ConsumeFrom]
    CONSUME_FROM_LATEST: _ClassVar[ConsumeFrom]
    CONSUME_FROM_EARLIEST: _ClassVar[ConsumeFrom]
    CONSUME_FROM_TIMESTAMP: _ClassVar[ConsumeFrom]

class BackoffKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKOFF_KIND_UNSPECIFIED: _ClassVar[BackoffKind]
    BACKOFF_KIND_EXPONENTIAL: _ClassVar[BackoffKind]
    BACKOFF_KIND_CUSTOMIZED: _ClassVar[BackoffKind]

class FilterKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILTER_KIND_UNSPECIFIED: _ClassVar[FilterKind]
    FILTER_KIND_TAG: _ClassVar[FilterKind]
    FILTER_KIND_SQL: _ClassVar[FilterKind]

class OffsetPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFSET_POLICY_UNSPECIFIED: _ClassVar[OffsetPolicy]
    OFFSET_POLICY_BEGINNING: _ClassVar[OffsetPolicy]
    OFFSET_POLICY_END: _ClassVar[OffsetPolicy]
    OFFSET_POLICY_TIMESTAMP: _ClassVar[OffsetPolicy]
CONSUME_FROM_UNSPECIFIED: ConsumeFrom
CONSUME_FROM_LATEST: ConsumeFrom
CONSUME_FROM_EARLIEST: ConsumeFrom
CONSUME_FROM_TIMESTAMP: ConsumeFrom
BACKOFF_KIND_UNSPECIFIED: BackoffKind
BACKOFF_KIND_EXPONENTIAL: BackoffKind
BACKOFF_KIND_CUSTOMIZED: BackoffKind
FILTER_KIND_UNSPECIFIED: FilterKind
FILTER_KIND_TAG: FilterKind
FILTER_KIND_SQL: FilterKind
OFFSET_POLICY_UNSPECIFIED: OffsetPolicy
OFFSET_POLICY_BEGINNING: OffsetPolicy
OFFSET_POLICY_END: OffsetPolicy
OFFSET_POLICY_TIMESTAMP: OffsetPolicy

class RetryPolicy(_message.Message):
    __slots__ = ("kind", "initial_ms", "max_ms", "multiplier", "customized_ms")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INITIAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    CUSTOMIZED_MS_FIELD_NUMBER: _ClassVar[int]
    kind: BackoffKind
    initial_ms: int
    max_ms: int
    multiplier: float
    customized_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[_Union[BackoffKind, str]] = ..., initial_ms: _Optional[int] = ..., max_ms: _Optional[int] = ..., multiplier: _Optional[float] = ..., customized_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class TopicSpec(_message.Message):
    __slots__ = ("name", "queue_count", "message_types", "permission", "max_priority", "lite_expiration_s", "max_lite_topics")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LITE_EXPIRATION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_LITE_TOPICS_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    message_types: _containers.RepeatedScalarFieldContainer[int]
    permission: int
    max_priority: int
    lite_expiration_s: int
    max_lite_topics: int
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ..., message_types: _Optional[_Iterable[int]] = ..., permission: _Optional[int] = ..., max_priority: _Optional[int] = ..., lite_expiration_s: _Optional[int] = ..., max_lite_topics: _Optional[int] = ...) -> None: ...

class GroupSpec(_message.Message):
    __slots__ = ("name", "fifo", "max_delivery_attempts", "retry_policy", "consume_from", "consume_from_timestamp_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FROM_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FROM_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fifo: bool
    max_delivery_attempts: int
    retry_policy: RetryPolicy
    consume_from: ConsumeFrom
    consume_from_timestamp_ms: int
    def __init__(self, name: _Optional[str] = ..., fifo: _Optional[bool] = ..., max_delivery_attempts: _Optional[int] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., consume_from: _Optional[_Union[ConsumeFrom, str]] = ..., consume_from_timestamp_ms: _Optional[int] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("spec", "created_ms")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    spec: GroupSpec
    created_ms: int
    def __init__(self, spec: _Optional[_Union[GroupSpec, _Mapping]] = ..., created_ms: _Optional[int] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset", "acked_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    acked_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., acked_offset: _Optional[int] = ...) -> None: ...

class TopicStatus(_message.Message):
    __slots__ = ("spec", "queues", "half_messages", "pending_timers", "local_bytes", "delivered")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    HALF_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PENDING_TIMERS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    spec: TopicSpec
    queues: _containers.RepeatedCompositeFieldContainer[QueueStatus]
    half_messages: int
    pending_timers: int
    local_bytes: int
    delivered: int
    def __init__(self, spec: _Optional[_Union[TopicSpec, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueStatus, _Mapping]]] = ..., half_messages: _Optional[int] = ..., pending_timers: _Optional[int] = ..., local_bytes: _Optional[int] = ..., delivered: _Optional[int] = ...) -> None: ...

class GroupQueueStatus(_message.Message):
    __slots__ = ("topic", "queue_id", "consumed_offset", "max_offset", "lag", "in_flight", "retrying", "ready", "due", "ready_bytes")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RETRYING_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DUE_FIELD_NUMBER: _ClassVar[int]
    READY_BYTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    consumed_offset: int
    max_offset: int
    lag: int
    in_flight: int
    retrying: int
    ready: int
    due: int
    ready_bytes: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., consumed_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., retrying: _Optional[int] = ..., ready: _Optional[int] = ..., due: _Optional[int] = ..., ready_bytes: _Optional[int] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("info", "queues")
    INFO_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    info: GroupInfo
    queues: _containers.RepeatedCompositeFieldContainer[GroupQueueStatus]
    def __init__(self, info: _Optional[_Union[GroupInfo, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[GroupQueueStatus, _Mapping]]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("message_id", "queue_id", "queue_offset", "transaction_id", "recall_handle")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str
    recall_handle: str
    def __init__(self, message_id: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., transaction_id: _Optional[str] = ..., recall_handle: _Optional[str] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("record", "store_host", "delivery_attempt", "receipt_handle", "invisible_until_ms")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    record: bytes
    store_host: str
    delivery_attempt: int
    receipt_handle: str
    invisible_until_ms: int
    def __init__(self, record: _Optional[bytes] = ..., store_host: _Optional[str] = ..., delivery_attempt: _Optional[int] = ..., receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class FilterSpec(_message.Message):
    __slots__ = ("kind", "expression")
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    kind: FilterKind
    expression: str
    def __init__(self, kind: _Optional[_Union[FilterKind, str]] = ..., expression: _Optional[str] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("receipt_handle", "ok", "error_code", "error_message")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    ok: bool
    error_code: int
    error_message: str
    def __init__(self, receipt_handle: _Optional[str] = ..., ok: _Optional[bool] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class PullResult(_message.Message):
    __slots__ = ("messages", "next_offset", "min_offset", "max_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TopicSpec
    def __init__(self, spec: _Optional[_Union[TopicSpec, _Mapping]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TopicSpec
    def __init__(self, spec: _Optional[_Union[TopicSpec, _Mapping]] = ...) -> None: ...

class UpdateTopicRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TopicSpec
    def __init__(self, spec: _Optional[_Union[TopicSpec, _Mapping]] = ...) -> None: ...

class UpdateTopicResponse(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TopicSpec
    def __init__(self, spec: _Optional[_Union[TopicSpec, _Mapping]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTopicRequest(_message.Message):
    __slots__ = ("name", "auto_create", "like")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AUTO_CREATE_FIELD_NUMBER: _ClassVar[int]
    LIKE_FIELD_NUMBER: _ClassVar[int]
    name: str
    auto_create: bool
    like: TopicSpec
    def __init__(self, name: _Optional[str] = ..., auto_create: _Optional[bool] = ..., like: _Optional[_Union[TopicSpec, _Mapping]] = ...) -> None: ...

class GetTopicResponse(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TopicSpec
    def __init__(self, spec: _Optional[_Union[TopicSpec, _Mapping]] = ...) -> None: ...

class ListTopicSpecsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicSpecsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicSpec]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicSpec, _Mapping]]] = ...) -> None: ...

class TopicStatusRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TopicStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: TopicStatus
    def __init__(self, status: _Optional[_Union[TopicStatus, _Mapping]] = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: GroupSpec
    def __init__(self, spec: _Optional[_Union[GroupSpec, _Mapping]] = ...) -> None: ...

class CreateGroupResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: GroupInfo
    def __init__(self, info: _Optional[_Union[GroupInfo, _Mapping]] = ...) -> None: ...

class UpdateGroupRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: GroupSpec
    def __init__(self, spec: _Optional[_Union[GroupSpec, _Mapping]] = ...) -> None: ...

class UpdateGroupResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: GroupInfo
    def __init__(self, info: _Optional[_Union[GroupInfo, _Mapping]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ("name", "auto_create", "like")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AUTO_CREATE_FIELD_NUMBER: _ClassVar[int]
    LIKE_FIELD_NUMBER: _ClassVar[int]
    name: str
    auto_create: bool
    like: GroupSpec
    def __init__(self, name: _Optional[str] = ..., auto_create: _Optional[bool] = ..., like: _Optional[_Union[GroupSpec, _Mapping]] = ...) -> None: ...

class GetGroupResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: GroupInfo
    def __init__(self, info: _Optional[_Union[GroupInfo, _Mapping]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class GroupStatusRequest(_message.Message):
    __slots__ = ("name", "topics", "ready_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    READY_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    ready_bytes: bool
    def __init__(self, name: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., ready_bytes: _Optional[bool] = ...) -> None: ...

class GroupStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: GroupStatus
    def __init__(self, status: _Optional[_Union[GroupStatus, _Mapping]] = ...) -> None: ...

class CallContext(_message.Message):
    __slots__ = ("request_id", "client_id", "namespace", "remaining_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    client_id: str
    namespace: str
    remaining_ms: int
    def __init__(self, request_id: _Optional[str] = ..., client_id: _Optional[str] = ..., namespace: _Optional[str] = ..., remaining_ms: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "records", "context")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    records: _containers.RepeatedScalarFieldContainer[bytes]
    context: CallContext
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., records: _Optional[_Iterable[bytes]] = ..., context: _Optional[_Union[CallContext, _Mapping]] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ...) -> None: ...

class SendBatchRequest(_message.Message):
    __slots__ = ("sends",)
    SENDS_FIELD_NUMBER: _ClassVar[int]
    sends: _containers.RepeatedCompositeFieldContainer[SendRequest]
    def __init__(self, sends: _Optional[_Iterable[_Union[SendRequest, _Mapping]]] = ...) -> None: ...

class SendOutcome(_message.Message):
    __slots__ = ("results", "error_code", "error_message")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    error_code: int
    error_message: str
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class SendBatchResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[SendOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[SendOutcome, _Mapping]]] = ...) -> None: ...

class PopRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "max_messages", "invisible_ms", "filter", "long_poll_ms", "lite_client", "lite_window")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LONG_POLL_MS_FIELD_NUMBER: _ClassVar[int]
    LITE_CLIENT_FIELD_NUMBER: _ClassVar[int]
    LITE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    max_messages: int
    invisible_ms: int
    filter: FilterSpec
    long_poll_ms: int
    lite_client: str
    lite_window: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., max_messages: _Optional[int] = ..., invisible_ms: _Optional[int] = ..., filter: _Optional[_Union[FilterSpec, _Mapping]] = ..., long_poll_ms: _Optional[int] = ..., lite_client: _Optional[str] = ..., lite_window: _Optional[int] = ...) -> None: ...

class PopResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handles")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class ChangeInvisibleDurationRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle", "invisible_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    invisible_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_ms: _Optional[int] = ...) -> None: ...

class ChangeInvisibleDurationResponse(_message.Message):
    __slots__ = ("receipt_handle",)
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    def __init__(self, receipt_handle: _Optional[str] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("receipt_handle",)
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    def __init__(self, receipt_handle: _Optional[str] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handles", "invisible_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    invisible_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., invisible_ms: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class ForwardToDeadLetterRequest(_message.Message):
    __slots__ = ("group", "topic", "receipt_handle")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    receipt_handle: str
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., receipt_handle: _Optional[str] = ...) -> None: ...

class ForwardToDeadLetterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset", "max_messages", "filter", "long_poll_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LONG_POLL_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    filter: FilterSpec
    long_poll_ms: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., filter: _Optional[_Union[FilterSpec, _Mapping]] = ..., long_poll_ms: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: PullResult
    def __init__(self, result: _Optional[_Union[PullResult, _Mapping]] = ...) -> None: ...

class GetOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class GetOffsetResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class UpdateOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class UpdateOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryOffsetRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "policy", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    policy: OffsetPolicy
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., policy: _Optional[_Union[OffsetPolicy, str]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class QueryOffsetResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class ReadRowsRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "end_offset", "max_messages", "max_bytes")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    end_offset: int
    max_messages: int
    max_bytes: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadRowsResponse(_message.Message):
    __slots__ = ("rows", "count", "next_offset", "min_offset", "max_offset")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    rows: bytes
    count: int
    next_offset: int
    min_offset: int
    max_offset: int
    def __init__(self, rows: _Optional[bytes] = ..., count: _Optional[int] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("topic", "message_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class GetMessageResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ...) -> None: ...

class FindMessagesByKeyRequest(_message.Message):
    __slots__ = ("topic", "key", "limit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    limit: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class FindMessagesByKeyResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("topic", "message_id", "transaction_id", "resolution", "source")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    transaction_id: str
    resolution: int
    source: int
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., resolution: _Optional[int] = ..., source: _Optional[int] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClaimTransactionChecksRequest(_message.Message):
    __slots__ = ("topics", "max_checks")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    max_checks: int
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., max_checks: _Optional[int] = ...) -> None: ...

class TransactionCheck(_message.Message):
    __slots__ = ("transaction_id", "message", "check")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    message: StoredMessage
    check: int
    def __init__(self, transaction_id: _Optional[str] = ..., message: _Optional[_Union[StoredMessage, _Mapping]] = ..., check: _Optional[int] = ...) -> None: ...

class ClaimTransactionChecksResponse(_message.Message):
    __slots__ = ("checks",)
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    checks: _containers.RepeatedCompositeFieldContainer[TransactionCheck]
    def __init__(self, checks: _Optional[_Iterable[_Union[TransactionCheck, _Mapping]]] = ...) -> None: ...

class MessageTraceRequest(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class TraceEvent(_message.Message):
    __slots__ = ("kind", "time_ms", "topic", "queue_id", "queue_offset", "message_id", "group", "attempt", "client_id", "detail")
    class DetailEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    time_ms: int
    topic: str
    queue_id: int
    queue_offset: int
    message_id: str
    group: str
    attempt: int
    client_id: str
    detail: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., time_ms: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., message_id: _Optional[str] = ..., group: _Optional[str] = ..., attempt: _Optional[int] = ..., client_id: _Optional[str] = ..., detail: _Optional[_Mapping[str, str]] = ...) -> None: ...

class MessageTraceResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TraceEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[TraceEvent, _Mapping]]] = ...) -> None: ...

class TierQueueStatus(_message.Message):
    __slots__ = ("queue_id", "local_min", "local_max", "tiered_min", "tiered_end")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_MIN_FIELD_NUMBER: _ClassVar[int]
    LOCAL_MAX_FIELD_NUMBER: _ClassVar[int]
    TIERED_MIN_FIELD_NUMBER: _ClassVar[int]
    TIERED_END_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    local_min: int
    local_max: int
    tiered_min: int
    tiered_end: int
    def __init__(self, queue_id: _Optional[int] = ..., local_min: _Optional[int] = ..., local_max: _Optional[int] = ..., tiered_min: _Optional[int] = ..., tiered_end: _Optional[int] = ...) -> None: ...

class TierTopicStatus(_message.Message):
    __slots__ = ("topic", "queues", "lag_messages", "lag_s", "bytes", "objects", "last_error", "failures", "last_upload_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_UPLOAD_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: _containers.RepeatedCompositeFieldContainer[TierQueueStatus]
    lag_messages: int
    lag_s: float
    bytes: int
    objects: int
    last_error: str
    failures: int
    last_upload_ms: int
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[TierQueueStatus, _Mapping]]] = ..., lag_messages: _Optional[int] = ..., lag_s: _Optional[float] = ..., bytes: _Optional[int] = ..., objects: _Optional[int] = ..., last_error: _Optional[str] = ..., failures: _Optional[int] = ..., last_upload_ms: _Optional[int] = ...) -> None: ...

class TierStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStatusResponse(_message.Message):
    __slots__ = ("enabled", "store", "topics", "puts", "put_bytes", "gets", "get_bytes")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    PUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    GET_BYTES_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    store: str
    topics: _containers.RepeatedCompositeFieldContainer[TierTopicStatus]
    puts: int
    put_bytes: int
    gets: int
    get_bytes: int
    def __init__(self, enabled: _Optional[bool] = ..., store: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[TierTopicStatus, _Mapping]]] = ..., puts: _Optional[int] = ..., put_bytes: _Optional[int] = ..., gets: _Optional[int] = ..., get_bytes: _Optional[int] = ...) -> None: ...

class TierUploadNowRequest(_message.Message):
    __slots__ = ("topic", "timeout_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    timeout_ms: int
    def __init__(self, topic: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TierUploadNowResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: TierTopicStatus
    def __init__(self, status: _Optional[_Union[TierTopicStatus, _Mapping]] = ...) -> None: ...

class TierEvictLocalRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class TierEvictLocalResponse(_message.Message):
    __slots__ = ("topic", "messages", "segments")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: int
    segments: int
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[int] = ..., segments: _Optional[int] = ...) -> None: ...

class GetSecurityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSecurityResponse(_message.Message):
    __slots__ = ("version", "document")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    document: bytes
    def __init__(self, version: _Optional[int] = ..., document: _Optional[bytes] = ...) -> None: ...

class PutSecurityRequest(_message.Message):
    __slots__ = ("version", "document")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    document: bytes
    def __init__(self, version: _Optional[int] = ..., document: _Optional[bytes] = ...) -> None: ...

class PutSecurityResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("topic", "recall_handle")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    recall_handle: str
    def __init__(self, topic: _Optional[str] = ..., recall_handle: _Optional[str] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class ResetOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ResetOffsetResponse(_message.Message):
    __slots__ = ("previous", "offset")
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    previous: int
    offset: int
    def __init__(self, previous: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ConnectedClient(_message.Message):
    __slots__ = ("client_id", "language", "version", "client_type", "address", "proxy", "group", "topics", "last_seen_ms", "detail")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    language: str
    version: str
    client_type: str
    address: str
    proxy: str
    group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    last_seen_ms: int
    detail: str
    def __init__(self, client_id: _Optional[str] = ..., language: _Optional[str] = ..., version: _Optional[str] = ..., client_type: _Optional[str] = ..., address: _Optional[str] = ..., proxy: _Optional[str] = ..., group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., last_seen_ms: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ReportClientsRequest(_message.Message):
    __slots__ = ("proxy", "clients", "ttl_ms")
    PROXY_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    proxy: str
    clients: _containers.RepeatedCompositeFieldContainer[ConnectedClient]
    ttl_ms: int
    def __init__(self, proxy: _Optional[str] = ..., clients: _Optional[_Iterable[_Union[ConnectedClient, _Mapping]]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ReportClientsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClientsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClientsResponse(_message.Message):
    __slots__ = ("clients",)
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    clients: _containers.RepeatedCompositeFieldContainer[ConnectedClient]
    def __init__(self, clients: _Optional[_Iterable[_Union[ConnectedClient, _Mapping]]] = ...) -> None: ...

class LiteOffset(_message.Message):
    __slots__ = ("policy", "offset", "tail_n", "timestamp_ms")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TAIL_N_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    policy: int
    offset: int
    tail_n: int
    timestamp_ms: int
    def __init__(self, policy: _Optional[int] = ..., offset: _Optional[int] = ..., tail_n: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class SyncLiteSubscriptionRequest(_message.Message):
    __slots__ = ("group", "topic", "client_id", "action", "lite_topics", "version", "offset", "quota", "filters")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPICS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    client_id: str
    action: int
    lite_topics: _containers.RepeatedScalarFieldContainer[str]
    version: int
    offset: LiteOffset
    quota: int
    filters: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., client_id: _Optional[str] = ..., action: _Optional[int] = ..., lite_topics: _Optional[_Iterable[str]] = ..., version: _Optional[int] = ..., offset: _Optional[_Union[LiteOffset, _Mapping]] = ..., quota: _Optional[int] = ..., filters: _Optional[bool] = ...) -> None: ...

class SyncLiteSubscriptionResponse(_message.Message):
    __slots__ = ("subscribed",)
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    subscribed: int
    def __init__(self, subscribed: _Optional[int] = ...) -> None: ...

class ListLiteTopicsRequest(_message.Message):
    __slots__ = ("topic", "group", "limit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    limit: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class LiteTopicInfo(_message.Message):
    __slots__ = ("name", "backlog", "last_write_ms", "created_ms", "subscribers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITE_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    backlog: int
    last_write_ms: int
    created_ms: int
    subscribers: int
    def __init__(self, name: _Optional[str] = ..., backlog: _Optional[int] = ..., last_write_ms: _Optional[int] = ..., created_ms: _Optional[int] = ..., subscribers: _Optional[int] = ...) -> None: ...

class ListLiteTopicsResponse(_message.Message):
    __slots__ = ("topic", "count", "topics")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    count: int
    topics: _containers.RepeatedCompositeFieldContainer[LiteTopicInfo]
    def __init__(self, topic: _Optional[str] = ..., count: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[LiteTopicInfo, _Mapping]]] = ...) -> None: ...

class ClaimLiteRemovalsRequest(_message.Message):
    __slots__ = ("client_ids",)
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, client_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class LiteRemoval(_message.Message):
    __slots__ = ("client_id", "group", "topic", "lite_topic")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group: str
    topic: str
    lite_topic: str
    def __init__(self, client_id: _Optional[str] = ..., group: _Optional[str] = ..., topic: _Optional[str] = ..., lite_topic: _Optional[str] = ...) -> None: ...

class ClaimLiteRemovalsResponse(_message.Message):
    __slots__ = ("removals",)
    REMOVALS_FIELD_NUMBER: _ClassVar[int]
    removals: _containers.RepeatedCompositeFieldContainer[LiteRemoval]
    def __init__(self, removals: _Optional[_Iterable[_Union[LiteRemoval, _Mapping]]] = ...) -> None: ...

class BrokerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerInfoResponse(_message.Message):
    __slots__ = ("version", "started_ms", "disk_used_bytes", "disk_total_bytes", "store_bytes", "unflushed_bytes", "dispatch_lag_bytes", "dispatch_lag_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNFLUSHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    version: str
    started_ms: int
    disk_used_bytes: int
    disk_total_bytes: int
    store_bytes: int
    unflushed_bytes: int
    dispatch_lag_bytes: int
    dispatch_lag_ms: int
    def __init__(self, version: _Optional[str] = ..., started_ms: _Optional[int] = ..., disk_used_bytes: _Optional[int] = ..., disk_total_bytes: _Optional[int] = ..., store_bytes: _Optional[int] = ..., unflushed_bytes: _Optional[int] = ..., dispatch_lag_bytes: _Optional[int] = ..., dispatch_lag_ms: _Optional[int] = ...) -> None: ...

class GetAmqpMetaRequest(_message.Message):
    __slots__ = ("newer_than",)
    NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    newer_than: int
    def __init__(self, newer_than: _Optional[int] = ...) -> None: ...

class GetAmqpMetaResponse(_message.Message):
    __slots__ = ("version", "document")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    document: bytes
    def __init__(self, version: _Optional[int] = ..., document: _Optional[bytes] = ...) -> None: ...

class PutAmqpMetaRequest(_message.Message):
    __slots__ = ("version", "document")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    document: bytes
    def __init__(self, version: _Optional[int] = ..., document: _Optional[bytes] = ...) -> None: ...

class PutAmqpMetaResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MqttGetRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MqttValue(_message.Message):
    __slots__ = ("found", "value")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class MqttGetResponse(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[MqttValue]
    def __init__(self, values: _Optional[_Iterable[_Union[MqttValue, _Mapping]]] = ...) -> None: ...

class MqttEntry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class MqttExpect(_message.Message):
    __slots__ = ("key", "present", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    present: bool
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., present: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class MqttWriteRequest(_message.Message):
    __slots__ = ("puts", "deletes", "expect")
    PUTS_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FIELD_NUMBER: _ClassVar[int]
    puts: _containers.RepeatedCompositeFieldContainer[MqttEntry]
    deletes: _containers.RepeatedScalarFieldContainer[bytes]
    expect: _containers.RepeatedCompositeFieldContainer[MqttExpect]
    def __init__(self, puts: _Optional[_Iterable[_Union[MqttEntry, _Mapping]]] = ..., deletes: _Optional[_Iterable[bytes]] = ..., expect: _Optional[_Iterable[_Union[MqttExpect, _Mapping]]] = ...) -> None: ...

class MqttWriteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MqttScanRequest(_message.Message):
    __slots__ = ("prefix", "after", "limit")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    after: bytes
    limit: int
    def __init__(self, prefix: _Optional[bytes] = ..., after: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class MqttScanResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[MqttEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[MqttEntry, _Mapping]]] = ...) -> None: ...
