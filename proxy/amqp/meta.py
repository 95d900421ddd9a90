"""The AMQP metadata: exchanges, queues and bindings per vhost, and its JSON encoding.

The whole of it is one document (`MetaDoc`), kept by one broker (broker/amqp_meta_store.py) and
cached by every proxy (proxy/amqp/metastore.py). Each queue has a number allocated once
(`next_id`, never reused): its messages live in the RocketMQ topic `AMQP_Q<n>` (one queue) and
are consumed by the group `AMQP_G<n>`, so a queue deleted and declared again starts empty.
The built-in exchanges (the default one and `amq.*`) are implied in every vhost, never stored.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from common.errors import StoreCorrupted

if TYPE_CHECKING:
    from broker.client.api import GroupStatus

DIRECT, FANOUT, TOPIC, HEADERS = "direct", "fanout", "topic", "headers"
EXCHANGE_TYPES = (DIRECT, FANOUT, TOPIC, HEADERS)

# name -> type of the exchanges every vhost has, as in RabbitMQ.
BUILTIN_EXCHANGES = {"": DIRECT, "amq.direct": DIRECT, "amq.fanout": FANOUT, "amq.topic": TOPIC,
                     "amq.headers": HEADERS, "amq.match": HEADERS}  # fmt: skip

Args = dict[str, Any]

AMQP_CLIENT_TYPE = "AMQP"  # an AMQP connection's client type in the proxies' client reports
TOPIC_ARG = "x-sluice-topic"  # an exchange argument: the RocketMQ topic the exchange maps to (crossmap.py)
DEFAULT_VHOST = "/"


def namespace_of(vhost: str) -> str:
    """The Sluice namespace of a vhost: `/` is the default namespace, any other vhost the
    namespace of its name (docs/amqp.md)."""
    return "" if vhost == DEFAULT_VHOST else vhost


def jsonable(value: object) -> object:
    """An AMQP field value as JSON (arguments are compared on redeclare and stored): bytes and
    values without a JSON form become strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def arguments(table: object) -> Args:
    """A method's arguments table as stored and compared."""
    return {str(k): jsonable(v) for k, v in table.items()} if isinstance(table, dict) else {}


@dataclass(frozen=True)
class ExchangeMeta:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Args = field(default_factory=dict)

    @property
    def topic(self) -> str | None:
        """The RocketMQ topic (short name, in the vhost's namespace) it maps to; None: not mapped."""
        value = self.arguments.get(TOPIC_ARG)
        return value if isinstance(value, str) and value else None


def bridge_group(vhost: str, exchange: str) -> str:
    """The consumer group that carries a mapped topic's RocketMQ sends to the exchange's queues
    (in the vhost's namespace, as the topic)."""
    digest = hashlib.sha1(f"{vhost}\0{exchange}".encode()).hexdigest()[:20]
    return f"AMQP_X{digest}"


@dataclass(frozen=True)
class QueueMeta:
    name: str
    id: int
    broker: str  # the broker holding its topic
    durable: bool = True
    exclusive_owner: str = ""  # the owning connection's id; "" when not exclusive
    auto_delete: bool = False
    arguments: Args = field(default_factory=dict)
    used_ms: int = 0  # epoch ms of its last declare, basic.get or consumer (kept for x-expires only)

    @property
    def topic(self) -> str:
        return f"AMQP_Q{self.id}"

    def _int_arg(self, name: str) -> int | None:
        value = self.arguments.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def message_ttl_ms(self) -> int | None:
        return self._int_arg("x-message-ttl")

    @property
    def max_length(self) -> int | None:
        return self._int_arg("x-max-length")

    @property
    def max_length_bytes(self) -> int | None:
        return self._int_arg("x-max-length-bytes")

    @property
    def overflow(self) -> str:
        value = self.arguments.get("x-overflow")
        return value if isinstance(value, str) else "drop-head"

    @property
    def max_priority(self) -> int | None:
        """x-max-priority: a priority queue (higher priorities delivered first); None: not one."""
        return self._int_arg("x-max-priority")

    @property
    def expires_ms(self) -> int | None:
        return self._int_arg("x-expires")

    @property
    def delivery_limit(self) -> int | None:
        return self._int_arg("x-delivery-limit")

    @property
    def dead_letter_exchange(self) -> str | None:
        value = self.arguments.get("x-dead-letter-exchange")
        return value if isinstance(value, str) else None

    @property
    def dead_letter_routing_key(self) -> str | None:
        value = self.arguments.get("x-dead-letter-routing-key")
        return value if isinstance(value, str) else None

    @property
    def group(self) -> str:
        return f"AMQP_G{self.id}"


def queue_counts(status: GroupStatus, q: QueueMeta) -> tuple[int, int, int]:
    """(ready, unacknowledged, ready body bytes) of the queue from its group's status: the sums over
    its topic's queues (the bytes are 0 unless the status was asked for them)."""
    mine = [s for s in status.queues if s.topic == q.topic]
    return sum(s.ready for s in mine), sum(s.in_flight - s.due for s in mine), sum(s.ready_bytes for s in mine)


@dataclass(frozen=True)
class BindingMeta:
    exchange: str  # the source
    queue: str  # the destination: a queue, or an exchange when `to_exchange`
    routing_key: str
    arguments: Args = field(default_factory=dict)
    to_exchange: bool = False


@dataclass
class VhostMeta:
    exchanges: dict[str, ExchangeMeta] = field(default_factory=dict)
    queues: dict[str, QueueMeta] = field(default_factory=dict)
    bindings: list[BindingMeta] = field(default_factory=list)

    def exchange_type(self, name: str) -> str | None:
        if name in BUILTIN_EXCHANGES:
            return BUILTIN_EXCHANGES[name]
        found = self.exchanges.get(name)
        return None if found is None else found.type


@dataclass
class MetaDoc:
    version: int = 0
    next_id: int = 1
    vhosts: dict[str, VhostMeta] = field(default_factory=dict)

    def vhost(self, name: str) -> VhostMeta:
        found = self.vhosts.get(name)  # (`setdefault` built an empty VhostMeta on every call: once per publish batch)
        if found is None:
            found = self.vhosts[name] = VhostMeta()
        return found


def encode(doc: MetaDoc) -> bytes:
    body = {
        "next_id": doc.next_id,
        "vhosts": {
            name: {
                "exchanges": [asdict(e) for e in v.exchanges.values()],
                "queues": [asdict(q) for q in v.queues.values()],
                "bindings": [asdict(b) for b in v.bindings],
            }
            for name, v in doc.vhosts.items()
        },
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode(version: int, data: bytes) -> MetaDoc:
    if not data:
        return MetaDoc(version)
    try:
        body = json.loads(data)
        vhosts = {
            name: VhostMeta(
                exchanges={e["name"]: ExchangeMeta(**e) for e in v["exchanges"]},
                queues={q["name"]: QueueMeta(**q) for q in v["queues"]},
                bindings=[BindingMeta(**b) for b in v["bindings"]],
            )
            for name, v in body["vhosts"].items()
        }
        return MetaDoc(version, int(body["next_id"]), vhosts)
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreCorrupted(f"AMQP metadata version {version} is malformed: {type(exc).__name__}: {exc}") from None
