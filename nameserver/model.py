"""The NameServer's vocabulary as plain dataclasses: what a broker registers and what a route is.

No protobuf here: a proxy or an admin tool depends on these types without gRPC details, and the
registry works on them alone. All types are frozen; sequences are tuples, sorted as documented.

Invariants of a valid registration (`validate_registration`): cluster and broker names match
`NAME_PATTERN`; the address is `host:port`; topic names are valid (system topics allowed), unique,
with 1..`MAX_QUEUES_PER_TOPIC` queues, a known permission and at least one message type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from common.addresses import is_wildcard
from common.errors import BadRequest
from common.model import MessageType, Permission, TopicInfo, validate_topic_name

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,127}$")
MAX_QUEUES_PER_TOPIC = 65_536
MAX_PORT = 65_535


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """Everything a NameServer knows about one broker; the topic list is complete, not a delta.

    `instance_id` names one run of the broker process and `sequence` increases with every
    registration that run sends: a NameServer keeps the topics of the highest sequence it saw, so
    a heartbeat overtaken by a newer report cannot bring back an old topic list. Both are stamped
    by `BrokerRegistrar`; empty/0 means "unordered" (always applied).
    """

    cluster_name: str
    broker_name: str
    address: str
    topics: tuple[TopicInfo, ...] = ()
    instance_id: str = ""
    sequence: int = 0
    # Where clients reach the proxy in the broker's own process (a merged node); "" if none.
    client_endpoint: str = ""
    # The replication epoch of the group's primary that sent it (0: no group). The registry holds
    # the highest epoch per broker name and refuses a lower one (a deposed primary's, late).
    epoch: int = 0


class RegisterOutcome(Enum):
    """What a registration did to the registry (for logs and tests)."""

    NEW = "new"  # the broker was unknown (or had expired)
    CHANGED = "changed"  # known broker, different address, cluster or topics
    HEARTBEAT = "heartbeat"  # known broker, same content: only its liveness was refreshed
    STALE = "stale"  # older than what is held for the same instance: liveness refreshed, topics kept


@dataclass(frozen=True, slots=True)
class BrokerQueues:
    """One broker's share of a topic: queues [0, queue_count) of the topic live on it."""

    broker_name: str
    address: str
    cluster_name: str
    queue_count: int
    permission: Permission
    message_types: frozenset[MessageType]
    client_endpoint: str = ""  # the broker's merged node's client endpoint, as registered


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Where a topic lives. `brokers` is sorted by broker name and never empty."""

    topic: str
    brokers: tuple[BrokerQueues, ...]
    # Answered by a NameServer that started moments ago (less than its `young_s`): a broker
    # missing here may just not have re-registered yet (docs/nameserver.md).
    young: bool = False


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    cluster_name: str
    broker_name: str
    address: str
    topic_count: int
    last_heartbeat_age_s: float
    client_endpoint: str = ""


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    broker_names: tuple[str, ...]  # sorted
    queue_count: int  # over all brokers holding the topic
    message_types: frozenset[MessageType]  # union over those brokers


def split_address(text: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets: `[::1]:9876`) as (host, port); ValueError if malformed."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"address {text!r} is not host:port")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"address {text!r} has an unclosed IPv6 bracket")
    elif ":" in host:
        raise ValueError(f"address {text!r}: put an IPv6 host in brackets, e.g. [::1]:9876")
    port = int(port_text)
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"address {text!r}: port {port} is out of range 1..{MAX_PORT}")
    return host, port


def format_address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def validate_name(kind: str, name: str) -> str:
    """A cluster or broker name; BadRequest if empty or malformed."""
    if not name:
        raise BadRequest(f"{kind} name is empty")
    if not NAME_PATTERN.match(name):
        raise BadRequest(
            f"{kind} name {name[:64]!r} is invalid: use 1-127 characters from letters, digits, '.', '-', '_'"
        )
    return name


def validate_registration(registration: BrokerRegistration) -> None:
    """Raise a coded error (BadRequest, IllegalTopic) for anything a registry must not hold."""
    validate_name("cluster", registration.cluster_name)
    validate_name("broker", registration.broker_name)
    _validate_address(registration.broker_name, "", registration.address)
    if registration.client_endpoint:
        _validate_address(registration.broker_name, "client endpoint ", registration.client_endpoint)
    if registration.sequence < 0:
        raise BadRequest(f"broker {registration.broker_name}: sequence {registration.sequence} is negative")
    if registration.epoch < 0:
        raise BadRequest(f"broker {registration.broker_name}: epoch {registration.epoch} is negative")
    seen: set[str] = set()
    for topic in registration.topics:
        validate_topic_name(topic.name, allow_system=True)
        if topic.name in seen:
            raise BadRequest(f"broker {registration.broker_name}: topic {topic.name!r} is listed twice")
        seen.add(topic.name)
        _validate_topic(registration.broker_name, topic)


def _validate_address(broker_name: str, what: str, address: str) -> None:
    """A registered address is `host:port` of a machine others can dial: a wildcard host (a broker
    listening on 0.0.0.0 with no advertised address) would send every reader to its own machine."""
    try:
        host, _ = split_address(address)
    except ValueError as exc:
        raise BadRequest(f"broker {broker_name}: {what}{exc}") from None
    if is_wildcard(host):
        raise BadRequest(f"broker {broker_name}: {what}{address} names no machine others can dial; start it "
                         "with --advertise HOST (or advertise in its config table)")  # fmt: skip


def _validate_topic(broker_name: str, topic: TopicInfo) -> None:
    where = f"broker {broker_name}, topic {topic.name}"
    if not 1 <= topic.queue_count <= MAX_QUEUES_PER_TOPIC:
        raise BadRequest(f"{where}: queue count {topic.queue_count} is out of range 1..{MAX_QUEUES_PER_TOPIC}")
    if not isinstance(topic.permission, Permission):
        raise BadRequest(f"{where}: unknown permission {topic.permission!r}")
    if not topic.message_types:
        raise BadRequest(f"{where}: accepts no message type; give at least one")
    for message_type in topic.message_types:
        if not isinstance(message_type, MessageType):
            raise BadRequest(f"{where}: unknown message type {message_type!r}")


def merge_routes(routes: list[TopicRoute]) -> TopicRoute:
    """One route from several NameServers' answers for a topic: every broker any of them holds
    live (a broker's entry from the first answer that has it), young only if every answer is."""
    brokers: dict[str, BrokerQueues] = {}
    for route in routes:
        for b in route.brokers:
            brokers.setdefault(b.broker_name, b)
    return TopicRoute(routes[0].topic, tuple(brokers[name] for name in sorted(brokers)),
                      young=all(r.young for r in routes))  # fmt: skip
