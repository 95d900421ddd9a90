from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicEntry(_message.Message):
    __slots__ = ("name", "queue_count", "permission", "message_types")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_count: int
    permission: int
    message_types: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., queue_count: _Optional[int] = ..., permission: _Optional[int] = ..., message_types: _Optional[_Iterable[int]] = ...) -> None: ...

class BrokerRegistration(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "address", "topics", "instance_id", "sequence", "client_endpoint", "epoch")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    address: str
    topics: _containers.RepeatedCompositeFieldContainer[TopicEntry]
    instance_id: str
    sequence: int
    client_endpoint: str
    epoch: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., address: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[TopicEntry, _Mapping]]] = ..., instance_id: _Optional[str] = ..., sequence: _Optional[int] = ..., client_endpoint: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("registration",)
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    registration: BrokerRegistration
    def __init__(self, registration: _Optional[_Union[BrokerRegistration, _Mapping]] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("broker_name", "instance_id")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    instance_id: str
    def __init__(self, broker_name: _Optional[str] = ..., instance_id: _Optional[str] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class GetRouteRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class BrokerQueues(_message.Message):
    __slots__ = ("broker_name", "address", "cluster_name", "queue_count", "permission", "message_types", "client_endpoint")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    address: str
    cluster_name: str
    queue_count: int
    permission: int
    message_types: _containers.RepeatedScalarFieldContainer[int]
    client_endpoint: str
    def __init__(self, broker_name: _Optional[str] = ..., address: _Optional[str] = ..., cluster_name: _Optional[str] = ..., queue_count: _Optional[int] = ..., permission: _Optional[int] = ..., message_types: _Optional[_Iterable[int]] = ..., client_endpoint: _Optional[str] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "brokers", "young")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    YOUNG_FIELD_NUMBER: _ClassVar[int]
    topic: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerQueues]
    young: bool
    def __init__(self, topic: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerQueues, _Mapping]]] = ..., young: _Optional[bool] = ...) -> None: ...

class GetRouteResponse(_message.Message):
    __slots__ = ("route",)
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    route: TopicRoute
    def __init__(self, route: _Optional[_Union[TopicRoute, _Mapping]] = ...) -> None: ...

class ListBrokersRequest(_message.Message):
    __slots__ = ("cluster_name",)
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    def __init__(self, cluster_name: _Optional[str] = ...) -> None: ...

class BrokerStatus(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "address", "topic_count", "last_heartbeat_age_s", "client_endpoint")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    address: str
    topic_count: int
    last_heartbeat_age_s: float
    client_endpoint: str
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., address: _Optional[str] = ..., topic_count: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ..., client_endpoint: _Optional[str] = ...) -> None: ...

class ListBrokersResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerStatus]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerStatus, _Mapping]]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopicSummary(_message.Message):
    __slots__ = ("name", "broker_names", "queue_count", "message_types")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAMES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    name: str
    broker_names: _containers.RepeatedScalarFieldContainer[str]
    queue_count: int
    message_types: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., broker_names: _Optional[_Iterable[str]] = ..., queue_count: _Optional[int] = ..., message_types: _Optional[_Iterable[int]] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicSummary]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicSummary, _Mapping]]] = ...) -> None: ...
