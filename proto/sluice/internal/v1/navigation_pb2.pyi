from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProxyLoad(_message.Message):
    __slots__ = ("in_flight_requests", "connected_clients")
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    in_flight_requests: int
    connected_clients: int
    def __init__(self, in_flight_requests: _Optional[int] = ..., connected_clients: _Optional[int] = ...) -> None: ...

class ProxyRegistration(_message.Message):
    __slots__ = ("proxy_id", "endpoints", "zone", "namespaces", "draining", "load", "instance_id", "sequence")
    class EndpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    endpoints: _containers.ScalarMap[str, str]
    zone: str
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    load: ProxyLoad
    instance_id: str
    sequence: int
    def __init__(self, proxy_id: _Optional[str] = ..., endpoints: _Optional[_Mapping[str, str]] = ..., zone: _Optional[str] = ..., namespaces: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ..., load: _Optional[_Union[ProxyLoad, _Mapping]] = ..., instance_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class RegisterProxyRequest(_message.Message):
    __slots__ = ("registration",)
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    registration: ProxyRegistration
    def __init__(self, registration: _Optional[_Union[ProxyRegistration, _Mapping]] = ...) -> None: ...

class RegisterProxyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterProxyRequest(_message.Message):
    __slots__ = ("proxy_id", "instance_id", "sequence")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    instance_id: str
    sequence: int
    def __init__(self, proxy_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class UnregisterProxyResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class GetEndpointsRequest(_message.Message):
    __slots__ = ("namespace", "network", "zone", "limit")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    network: str
    zone: str
    limit: int
    def __init__(self, namespace: _Optional[str] = ..., network: _Optional[str] = ..., zone: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ProxyEndpoint(_message.Message):
    __slots__ = ("proxy_id", "zone", "endpoint", "load")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    zone: str
    endpoint: str
    load: ProxyLoad
    def __init__(self, proxy_id: _Optional[str] = ..., zone: _Optional[str] = ..., endpoint: _Optional[str] = ..., load: _Optional[_Union[ProxyLoad, _Mapping]] = ...) -> None: ...

class GetEndpointsResponse(_message.Message):
    __slots__ = ("endpoints", "proxies")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyEndpoint]
    def __init__(self, endpoints: _Optional[_Iterable[str]] = ..., proxies: _Optional[_Iterable[_Union[ProxyEndpoint, _Mapping]]] = ...) -> None: ...

class ListProxiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProxyStatus(_message.Message):
    __slots__ = ("proxy_id", "endpoints", "zone", "namespaces", "draining", "load", "last_heartbeat_age_s")
    class EndpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    endpoints: _containers.ScalarMap[str, str]
    zone: str
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    load: ProxyLoad
    last_heartbeat_age_s: float
    def __init__(self, proxy_id: _Optional[str] = ..., endpoints: _Optional[_Mapping[str, str]] = ..., zone: _Optional[str] = ..., namespaces: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ..., load: _Optional[_Union[ProxyLoad, _Mapping]] = ..., last_heartbeat_age_s: _Optional[float] = ...) -> None: ...

class ListProxiesResponse(_message.Message):
    __slots__ = ("proxies",)
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyStatus]
    def __init__(self, proxies: _Optional[_Iterable[_Union[ProxyStatus, _Mapping]]] = ...) -> None: ...
