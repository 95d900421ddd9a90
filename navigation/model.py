"""Navigation's vocabulary as plain dataclasses: what a proxy announces and what a client asks.

No protobuf here: the registry, the HTTP routes and any caller work on these types alone. All
types are frozen; collections are tuples, frozensets or read-only mappings.

Invariants of a valid registration (`validate_registration`): the proxy id matches `ID_PATTERN`;
1..`MAX_NETWORKS` endpoints, each network name matching `LABEL_PATTERN` and each endpoint a
`host:port` safe to join with ';' (DNS name, IPv4 or bracketed IPv6; port 1..65535); the zone is
empty or a label; at most `MAX_NAMESPACES` namespaces, each matching `NAMESPACE_PATTERN`; load
figures in 0..`MAX_LOAD`; a non-negative sequence.

Load score (the ordering rule, see `load_score`): `in_flight_requests + connected_clients`, both
as last reported by the proxy. Lower is better. `access_points` narrows a ranked list to what the
official clients accept as one endpoints setting.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from common.addresses import is_wildcard
from common.errors import BadRequest

DEFAULT_NETWORK = "default"
ENDPOINT_SEPARATOR = ";"  # what the official clients accept between access points

ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,127}$")
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")  # networks and zones
# The proxy stores `topic` of namespace `ns` as `ns%topic`, and topic names allow letters, digits,
# '-', '_': a namespace with anything else could never name a topic.
NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,127}$")
_HOST_PATTERN = re.compile(r"^(?:[A-Za-z0-9-]{1,63}\.)*[A-Za-z0-9-]{1,63}\.?$")
_IPV6_PATTERN = re.compile(r"^\[[0-9A-Fa-f:.]{2,45}\]$")

MAX_NETWORKS = 16
MAX_NAMESPACES = 1024
MAX_LOAD = 1_000_000_000
MAX_PORT = 65_535
MAX_HOST_CHARS = 253


def _frozen_endpoints() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ProxyLoad:
    """A proxy's load as it reported it: requests being served and clients connected."""

    in_flight_requests: int = 0
    connected_clients: int = 0

    @property
    def score(self) -> int:
        return load_score(self)


def load_score(load: ProxyLoad) -> int:
    """The ordering figure: lower is less loaded. A client is roughly one stream plus its calls."""
    return load.in_flight_requests + load.connected_clients


@dataclass(frozen=True, slots=True)
class ProxyRegistration:
    """Everything navigation knows about one proxy; a registration replaces the previous one.

    `endpoints` maps a network name (`default`, `internal`, `public`, ...) to the `host:port`
    clients on that network dial. `namespaces` empty means every namespace, including the default
    (empty) one. `instance_id` names one run of the proxy process and `sequence` increases with
    every send of that run, so an overtaken heartbeat never brings back older state; both are
    stamped by `ProxyAnnouncer`; empty/0 means "unordered" (always applied).
    """

    proxy_id: str
    endpoints: Mapping[str, str] = field(default_factory=_frozen_endpoints)
    zone: str = ""
    namespaces: frozenset[str] = frozenset()
    draining: bool = False
    load: ProxyLoad = ProxyLoad()
    instance_id: str = ""
    sequence: int = 0

    def __post_init__(self) -> None:
        # A read-only copy: the registry holds registrations, callers must not mutate them under it.
        object.__setattr__(self, "endpoints", MappingProxyType(dict(self.endpoints)))
        object.__setattr__(self, "namespaces", frozenset(self.namespaces))

    def serves(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces


class RegisterOutcome(Enum):
    """What a registration did to the registry (for logs and tests)."""

    NEW = "new"  # the proxy was unknown (or had expired)
    CHANGED = "changed"  # known proxy, different endpoints, zone, namespaces or draining flag
    HEARTBEAT = "heartbeat"  # same content apart from load: liveness and load refreshed
    RESTARTED = "restarted"  # a different instance took over the id (restart, or two proxies share it)
    STALE = "stale"  # older than what is held (or than its unregistration): ignored


@dataclass(frozen=True, slots=True)
class EndpointQuery:
    """Which proxies a client may use: of `namespace`, reachable on `network`, preferring `zone`.

    `limit` 0 means every matching proxy.
    """

    namespace: str = ""
    network: str = DEFAULT_NETWORK
    zone: str = ""
    limit: int = 0


@dataclass(frozen=True, slots=True)
class ProxyEndpoint:
    """One entry of an answer: a proxy and its endpoint on the asked network."""

    proxy_id: str
    zone: str
    endpoint: str
    load: ProxyLoad


@dataclass(frozen=True, slots=True)
class ProxyStatus:
    """A live proxy as listed to operators."""

    proxy_id: str
    endpoints: Mapping[str, str]
    zone: str
    namespaces: frozenset[str]
    draining: bool
    load: ProxyLoad
    last_heartbeat_age_s: float


def distinct_endpoints(proxies: list[ProxyEndpoint]) -> list[str]:
    """The endpoints of ranked proxies, each once, at the rank of its best proxy.

    Several proxies share an endpoint when worker processes share one port (SO_REUSEPORT).
    """
    return list(dict.fromkeys(p.endpoint for p in proxies))


def access_points(endpoints: Sequence[str]) -> list[str]:
    """The ranked endpoints an official client accepts together as its access points.

    The Python client (rocketmq-python-client 5.x) takes the address kind of the FIRST address for
    all of them, refuses several DNS names, and cannot parse a bracketed IPv6 address (it splits
    on ':'): several access points work only as IP addresses. So: the best
    endpoint, followed by the others only when it and they are IPv4 addresses.
    """
    if not endpoints:
        return []
    if not _is_ipv4(endpoints[0]):
        return [endpoints[0]]
    return [e for e in endpoints if _is_ipv4(e)]


def endpoints_text(endpoints: Sequence[str]) -> str:
    """`host:port;host:port`: what an application passes to the official client's endpoints setting."""
    return ENDPOINT_SEPARATOR.join(endpoints)


def _is_ipv4(endpoint: str) -> bool:
    try:
        ipaddress.IPv4Address(endpoint.rpartition(":")[0])
    except ValueError:
        return False
    return True


# -- validation ---------------------------------------------------------------------------------


def split_endpoint(text: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) as (host, port); ValueError if malformed or unsafe to join."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or len(port_text) > 5:
        raise ValueError(f"endpoint {text[:80]!r} is not host:port")
    if host.startswith("["):
        if not _IPV6_PATTERN.match(host):
            raise ValueError(f"endpoint {text[:80]!r}: malformed IPv6 host; write it as [addr]:port")
    elif ":" in host:
        raise ValueError(f"endpoint {text[:80]!r}: put an IPv6 host in brackets, e.g. [::1]:8081")
    elif len(host) > MAX_HOST_CHARS or not _HOST_PATTERN.match(host):
        raise ValueError(f"endpoint {text[:80]!r}: host must be a DNS name or an IP address")
    port = int(port_text)
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"endpoint {text[:80]!r}: port {port} is out of range 1..{MAX_PORT}")
    return host, port


def validate_proxy_id(proxy_id: str) -> str:
    if not proxy_id:
        raise BadRequest("proxy id is empty")
    if not ID_PATTERN.match(proxy_id):
        raise BadRequest(
            f"proxy id {proxy_id[:64]!r} is invalid: use 1-127 characters from letters, digits, '.', ':', '-', '_'"
        )
    return proxy_id


def validate_label(kind: str, value: str, *, allow_empty: bool) -> str:
    """A network or zone name; empty allowed only where it means "none"."""
    if not value and allow_empty:
        return value
    if not value:
        raise BadRequest(f"{kind} is empty")
    if not LABEL_PATTERN.match(value):
        raise BadRequest(f"{kind} {value[:64]!r} is invalid: use 1-63 characters from letters, digits, '.', '-', '_'")
    return value


def validate_namespace(namespace: str) -> str:
    """A namespace; empty is the default namespace."""
    if namespace and not NAMESPACE_PATTERN.match(namespace):
        raise BadRequest(
            f"namespace {namespace[:64]!r} is invalid: use 1-127 characters from letters, digits, '-', '_'"
        )
    return namespace


def validate_query(query: EndpointQuery, *, max_limit: int) -> EndpointQuery:
    validate_namespace(query.namespace)
    validate_label("network", query.network, allow_empty=False)
    validate_label("zone", query.zone, allow_empty=True)
    if not 0 <= query.limit <= max_limit:
        raise BadRequest(f"limit {query.limit} is out of range 0..{max_limit} (0 means no limit)")
    return query


def validate_registration(registration: ProxyRegistration) -> None:
    """Raise BadRequest for anything a registry must not hold."""
    proxy_id = validate_proxy_id(registration.proxy_id)
    where = f"proxy {proxy_id}"
    if not registration.endpoints:
        raise BadRequest(f"{where}: no endpoint; give at least one network -> host:port")
    if len(registration.endpoints) > MAX_NETWORKS:
        raise BadRequest(f"{where}: {len(registration.endpoints)} networks, at most {MAX_NETWORKS} allowed")
    for network, endpoint in registration.endpoints.items():
        validate_label(f"{where}: network", network, allow_empty=False)
        try:
            host, _ = split_endpoint(endpoint)
        except ValueError as exc:
            raise BadRequest(f"{where}, network {network}: {exc}") from None
        if is_wildcard(host):
            raise BadRequest(f"{where}, network {network}: endpoint {endpoint} names no machine a client can dial; "
                             "start the proxy with --advertise HOST:PORT")  # fmt: skip
    validate_label(f"{where}: zone", registration.zone, allow_empty=True)
    if len(registration.namespaces) > MAX_NAMESPACES:
        raise BadRequest(f"{where}: {len(registration.namespaces)} namespaces, at most {MAX_NAMESPACES} allowed")
    for namespace in registration.namespaces:
        if not namespace:
            raise BadRequest(f"{where}: an empty namespace in the list; an empty list means every namespace")
        validate_namespace(namespace)
    load = registration.load
    for name, value in (("in_flight_requests", load.in_flight_requests), ("connected_clients", load.connected_clients)):
        if not 0 <= value <= MAX_LOAD:
            raise BadRequest(f"{where}: {name} {value} is out of range 0..{MAX_LOAD}")
    if registration.sequence < 0:
        raise BadRequest(f"{where}: sequence {registration.sequence} is negative")
