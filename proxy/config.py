"""Configuration of a proxy (`[proxy]` table of the TOML file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from broker.client.remote import (
    DEFAULT_KEEPALIVE_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    DEFAULT_MAX_PENDING_SENDS,
    DEFAULT_RECONNECT_BACKOFF_MAX_S,
    DEFAULT_TIMEOUT_S,
)
from common.addresses import check_advertise
from common.config import ConfigError
from common.http2.limits import Http2Limits
from common.served import ServedConfig

_HEADROOM_BYTES = 64 * 1024  # a message's properties, keys and framing beyond its body


@dataclass(frozen=True)
class ClientSettingsConfig:
    """What the proxy tells clients through Telemetry settings (see docs/proxy.md)."""

    # A little under 4 MiB: the Node client cannot receive a frame larger than 4 MiB.
    max_body_bytes: int = 4 * 1024 * 1024 - 64 * 1024
    producer_max_attempts: int = 3
    producer_backoff_initial_ms: int = 10
    producer_backoff_max_ms: int = 1_000
    long_polling_timeout_s: int = 20
    receive_batch_size: int = 32
    # Lite consumers (docs/lite-topics.md): lite topics one client may subscribe to, longest name.
    lite_subscription_quota: int = 10_000
    max_lite_topic_chars: int = 64
    # How often brokers are asked which lite topics they removed from this proxy's clients.
    lite_removal_poll_ms: int = 1_000


@dataclass(frozen=True)
class ReceiveConfig:
    # Invisibility of messages delivered to push consumers (auto renew), renewed while they are held.
    auto_renew_invisible_ms: int = 30_000
    # Renew an auto-renewed message when less than this remains of its invisibility.
    renew_ahead_ms: int = 10_000
    # Stop renewing after this long (the message then becomes visible again for redelivery).
    max_auto_renew_ms: int = 3 * 3600 * 1000
    renew_interval_ms: int = 1_000
    # Time kept free before the client's deadline when long polling.
    deadline_margin_ms: int = 800
    max_batch_messages: int = 32
    # Auto-renewed messages this proxy keeps invisible at once; beyond it a message is redelivered
    # after its invisibility instead of renewed.
    max_leases: int = 500_000


@dataclass(frozen=True)
class TransactionCheckConfig:
    """Orphan transaction check-back (docs/transactions.md): how this proxy asks brokers for due checks."""

    # How often each broker is asked for due check-backs of topics whose producers are connected here.
    poll_interval_ms: int = 1_000
    # Check-backs taken from one broker per poll (each is pushed onto one producer's Telemetry stream).
    max_checks_per_poll: int = 64


@dataclass(frozen=True)
class AuthConfig:
    """Request signatures and access rules (docs/security.md). Off: anonymous clients are served."""

    enabled: bool = False
    # How often the security document (users, rules, limits) is read from the brokers.
    policy_refresh_s: float = 2.0
    # A verified (access key, date-time, signature) is trusted this long without a new HMAC.
    signature_cache_s: float = 60.0
    signature_cache_max: int = 100_000
    decision_cache_max: int = 100_000

    def __post_init__(self) -> None:
        if self.policy_refresh_s <= 0 or self.signature_cache_s < 0:
            raise ValueError("auth policy_refresh_s must be positive and signature_cache_s not negative")
        if self.signature_cache_max < 1 or self.decision_cache_max < 1:
            raise ValueError("auth cache sizes must be at least 1")


@dataclass(frozen=True)
class FlowConfig:
    """Flow control (docs/flow-control.md)."""

    # Requests this proxy works on at once (long polls included); beyond it: TOO_MANY_REQUESTS.
    max_in_flight: int = 10_000
    # Proxies sharing the cluster's limits: each enforces limit / proxy_count.
    proxy_count: int = 1
    # A limit's bucket holds this many seconds of its rate (the burst a quiet tenant may send).
    burst_s: float = 1.0
    # Request bytes (as received) this proxy holds at once, in all and per client id; a request
    # beyond either is refused with TOO_MANY_REQUESTS (proxy/core/inflight.py).
    max_in_flight_bytes: int = 256 * 1024 * 1024
    max_client_in_flight_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.proxy_count < 1 or self.burst_s <= 0:
            raise ValueError("flow max_in_flight and proxy_count must be at least 1, burst_s positive")
        if not 0 < self.max_client_in_flight_bytes <= self.max_in_flight_bytes:
            raise ValueError("flow max_client_in_flight_bytes must be positive and at most max_in_flight_bytes")


@dataclass(frozen=True)
class InputLimitsConfig:
    """What the edge accepts in a request (`[proxy.input]`); see docs/proxy.md, "Input limits"."""

    # Messages in one SendMessage, entries in one AckMessage.
    max_messages_per_send: int = 1024
    max_ack_entries: int = 1024
    # A receipt handle (ChangeInvisibleDuration, ForwardToDLQ), transaction id or recall handle
    # longer than this is invalid (Sluice's are ~100 bytes); ack entries are checked one by one.
    max_handle_bytes: int = 1024
    # The x-mq-client-id header (official clients: host@pid@index@random).
    max_client_id_bytes: int = 1024
    # A long poll asking for more is shortened to this (it is also bounded by the call's deadline).
    max_long_polling_ms: int = 60_000
    # Topics or subscriptions one Telemetry Settings may name.
    max_settings_entries: int = 1024

    def __post_init__(self) -> None:
        if min(self.max_messages_per_send, self.max_ack_entries, self.max_handle_bytes, self.max_client_id_bytes,
               self.max_long_polling_ms, self.max_settings_entries) < 1:  # fmt: skip
            raise ValueError("every [proxy.input] limit must be at least 1")


@dataclass(frozen=True)
class BrokerClientConfig:
    """How a proxy of the separated topology calls its brokers (`[proxy.brokers]`)."""

    # Deadline of a call that has none from its client (admin calls, background work).
    timeout_s: float = DEFAULT_TIMEOUT_S
    reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S
    # Sends queued for one broker behind the request in flight; beyond it: TOO_MANY_REQUESTS.
    max_pending_sends: int = DEFAULT_MAX_PENDING_SENDS
    # The connection to each broker is pinged when nothing arrived on it this long (a quarter of it
    # while calls to the broker are in flight)...
    keepalive_s: float = DEFAULT_KEEPALIVE_S
    # ...and dropped when nothing answers this long after the ping: the calls in flight to a broker whose host
    # fell off the network (or that hangs) then fail with UNAVAILABLE and are retried elsewhere,
    # instead of waiting for their deadlines.
    keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.reconnect_backoff_max_s <= 0 or self.max_pending_sends < 1:
            raise ValueError("brokers timeout_s and reconnect_backoff_max_s must be positive, max_pending_sends >= 1")
        if self.keepalive_s <= 0 or self.keepalive_timeout_s <= 0:
            raise ValueError("brokers keepalive_s and keepalive_timeout_s must be positive")


@dataclass(frozen=True)
class SendHealthConfig:
    """`[proxy.send_health]`: when the producer's queue selection avoids a broker."""

    # A broker with a send in flight for longer than this, or whose send took longer, is avoided.
    slow_ms: int = 1_000
    # How long a broker is avoided after a failed or slow send (doubled on repeated failures).
    isolate_ms: int = 1_000
    isolate_max_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.slow_ms < 1 or self.isolate_ms < 1 or self.isolate_max_ms < self.isolate_ms:
            raise ValueError("send_health slow_ms and isolate_ms must be at least 1, isolate_max_ms >= isolate_ms")


@dataclass(frozen=True)
class ReachConfig:
    """`[proxy.reach]`: how the proxy watches the endpoints of other processes its routes list (other
    merged nodes, peer proxies), to leave out of routes those it cannot reach (proxy/reach.py)."""

    # How often each watched endpoint is probed (a TCP connection opened and closed).
    interval_s: float = 1.0
    # A probe whose connection is not open within this long failed.
    timeout_s: float = 1.0
    # Failed probes in a row before the endpoint is left out of routes (one answered brings it back).
    failures: int = 2
    # An endpoint no route answer named for this long is no longer watched.
    forget_s: float = 300.0
    # Endpoints watched at most (the one named longest ago goes first).
    watched_max: int = 1_024

    def __post_init__(self) -> None:
        if min(self.interval_s, self.timeout_s, self.forget_s) <= 0 or min(self.failures, self.watched_max) < 1:
            raise ValueError("reach interval_s, timeout_s and forget_s must be positive, failures and watched_max >= 1")


@dataclass(frozen=True)
class CacheConfig:
    """Sizes of the proxy's lookup caches (`[proxy.caches]`): a full cache starts over rather than grow."""

    # Topics whose queue selector and route are kept.
    topics_max: int = 100_000
    # Consumer groups known to exist (checked once per group, not per receive).
    groups_max: int = 100_000
    # (namespace, network) pairs whose advertised proxy endpoints are kept.
    endpoints_max: int = 10_000
    # Lite consumers (client, group, bind topic) remembered: their subscription counts per broker,
    # to hold each one to its quota across the brokers of its bind topic, and the brokers their lite
    # topics were placed over, to move them when the route changes (kept or forgotten together).
    lite_clients_max: int = 100_000

    def __post_init__(self) -> None:
        if min(self.topics_max, self.groups_max, self.endpoints_max, self.lite_clients_max) < 1:
            raise ValueError("cache sizes must be at least 1")


@dataclass(frozen=True)
class TlsConfig:
    """TLS on the client port: both files (PEM) given turns it on (clients set tls_enable)."""

    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls needs both cert_file and key_file (PEM), or neither")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    def read(self) -> tuple[bytes, bytes]:
        """(private key, certificate chain) as PEM bytes; ConfigError if either cannot be read."""
        try:
            return Path(self.key_file).read_bytes(), Path(self.cert_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"[proxy.tls] cannot read the certificate or key: {exc}") from None


@dataclass(frozen=True)
class AmqpConfig:
    """The AMQP 0-9-1 gateway (`[proxy.amqp]`, docs/amqp.md). Off unless `port` is 0 or more."""

    # -1: off (`sluice up` serves 5672 when it is free and neither the flag nor this key says
    # otherwise); 0 picks a free port.
    port: int = -1
    # Heartbeat interval offered in connection.tune (a client may ask for less; 0: none).
    heartbeat_s: int = 60
    # Largest frame offered in connection.tune (a client may ask for less, not below 4096).
    frame_max_bytes: int = 131_072
    # Most channels per connection offered in connection.tune.
    channel_max: int = 2047
    # A larger message is refused (channel error 406, counted), as RabbitMQ's max_message_size
    # does; 16 MiB is RabbitMQ 4's default (3.x allowed 128 MiB; docs/amqp.md says why not here).
    # The brokers' own limit ([broker.limits] max_body_bytes, 16 MiB too) must be at least this.
    max_body_bytes: int = 16 * 1024 * 1024
    # A delivered message is invisible to other consumers for this long, renewed every third of it
    # while its channel is open: the unacknowledged messages of a proxy that died come back after
    # at most this.
    delivery_lease_ms: int = 60_000
    # A delivery not acknowledged this long closes its channel with 406 PRECONDITION_FAILED and is
    # requeued, as RabbitMQ's consumer_timeout does (30 minutes there too).
    consumer_timeout_ms: int = 30 * 60 * 1000
    # One broker pop of a consumer waits this long for messages.
    long_poll_ms: int = 2_000
    # Messages one broker pop of a consumer takes at most (its prefetch may hold it to fewer).
    max_prefetch: int = 32
    # Publishes of one channel received but not yet stored; beyond it the connection is not read.
    max_channel_publishes: int = 1024
    # Bodies of one connection received but not yet stored; beyond it the connection is not read
    # (clients that ask are sent connection.blocked, then connection.unblocked).
    max_connection_publish_bytes: int = 64 * 1024 * 1024
    # How often the metadata (exchanges, queues, bindings) is re-read from its broker.
    meta_refresh_ms: int = 500
    # A client that has not opened its connection this long after connecting is disconnected.
    handshake_timeout_s: float = 10.0
    # Deadline of the broker calls the gateway makes.
    call_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.port < -1 or self.port > 65535:
            raise ValueError(f"amqp port must be -1 (off) or 0-65535, got {self.port}")
        if self.frame_max_bytes < 4096 or not 1 <= self.channel_max <= 65535 or self.heartbeat_s < 0:
            raise ValueError("amqp frame_max_bytes must be at least 4096, channel_max 1-65535, heartbeat_s >= 0")
        if min(self.max_body_bytes, self.delivery_lease_ms, self.consumer_timeout_ms, self.long_poll_ms,
               self.max_prefetch, self.max_channel_publishes, self.meta_refresh_ms,
               self.max_connection_publish_bytes) < 1:  # fmt: skip
            raise ValueError("amqp sizes and durations must be positive")
        if self.handshake_timeout_s <= 0 or self.call_timeout_s <= 0:
            raise ValueError("amqp handshake_timeout_s and call_timeout_s must be positive")

    @property
    def enabled(self) -> bool:
        return self.port >= 0


@dataclass(frozen=True)
class MqttConfig:
    """The MQTT 3.1.1 and 5.0 gateway (`[proxy.mqtt]`, docs/mqtt.md). Off unless `port` is 0 or more."""

    # -1: off (`sluice up` serves 1883 when it is free and neither the flag nor this key says
    # otherwise); 0 picks a free port. TLS when the proxy has a certificate ([proxy.tls]).
    port: int = -1
    # MQTT over WebSocket (subprotocol "mqtt", any path), for browser clients; -1: off.
    ws_port: int = -1
    # Listen with SO_REUSEPORT, sharing the ports with sibling processes: set by `sluice up --shards`
    # (every shard serves MQTT) and for proxy workers.
    shared_port: bool = False
    # Largest packet accepted (and announced as Maximum Packet Size): a larger one closes the
    # connection (0x95). The brokers' [broker.limits] max_body_bytes bounds what can be stored.
    max_packet_bytes: int = 4 * 1024 * 1024
    # QoS 1 and 2 messages in flight to one client (at most its own Receive Maximum).
    max_inflight: int = 32
    # QoS 1 and 2 PUBLISHes a client may have unacknowledged by the server (Receive Maximum sent in
    # CONNACK); more is a protocol error (DISCONNECT 0x93).
    receive_maximum: int = 1024
    # PUBLISHes of one connection read but not yet stored; beyond it the connection is not read.
    max_pending_publishes: int = 1024
    # Topic aliases a client may use on its PUBLISHes (Topic Alias Maximum sent in CONNACK).
    topic_alias_maximum: int = 64
    # A keep alive above this (and 0, "none") is lowered to it (Server Keep Alive in a 5.0 CONNACK).
    max_keep_alive_s: int = 3600
    # Session expiry: the longest a session is kept after its connection ends (5.0 clients ask for
    # less or more; 3.1.1 persistent sessions get this).
    max_session_expiry_s: int = 7 * 24 * 3600
    # Client identifiers longer than this are refused (0x85 / 3.1.1 return code 2).
    max_client_id_chars: int = 256
    # Subscriptions one session may hold, and topic filters in one SUBSCRIBE.
    max_subscriptions_per_session: int = 1000
    max_filters_per_subscribe: int = 100
    # Connections served at once by this proxy; more are refused (0x97 Quota exceeded / 3.1.1 code 3).
    max_connections: int = 100_000
    # A client that has not sent CONNECT this long after connecting is disconnected.
    connect_timeout_s: float = 10.0
    # A delivered QoS 1 or 2 message is invisible to the session's other connections this long,
    # renewed every third of it while its connection is open: what a proxy that died had in flight
    # comes back after at most this.
    delivery_lease_ms: int = 60_000
    # One broker pop of a session waits this long for messages.
    long_poll_ms: int = 20_000
    # Retained messages a SUBSCRIBE delivers at most (per filter), and read per page of the store.
    max_retained_per_subscribe: int = 10_000
    # MQTT topic prefixes mapped to bind topics other than their first level (docs/mqtt.md): e.g.
    # {"factory/line1/" = "line1"}; the longest prefix wins.
    bind_topics: dict[str, str] = field(default_factory=dict)
    # Make the bind topic (a LITE topic) an MQTT topic needs when no broker holds it (docs/mqtt.md,
    # "Bind topics"), whatever RocketMQ's auto-create says: MQTT clients cannot create topics. Off:
    # only bind topics an operator created are used (0x83 for the others).
    create_bind_topics: bool = True
    # How often the namespace's bind topics are listed for filters with a wildcard first level.
    bind_topics_refresh_ms: int = 5_000
    # How often each proxy reads the requests to close connections taken over on another proxy.
    kick_poll_ms: int = 500
    # How often each proxy's janitor runs (proxy/mqtt/janitor.py): it writes the proxy's heartbeat,
    # drops expired sessions and disconnects the sessions of proxies without a heartbeat for three
    # rounds (publishing their wills), at most 256 of each per round.
    janitor_interval_s: float = 10.0
    # How often $SYS topics are sent to the sessions that subscribe to them (0: $SYS off).
    sys_interval_s: float = 10.0
    # Deadline of the broker calls the gateway makes.
    call_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("port", "ws_port"):
            value = getattr(self, name)
            if value < -1 or value > 65535:
                raise ValueError(f"mqtt {name} must be -1 (off) or 0-65535, got {value}")
        if self.max_packet_bytes < 1024 or self.max_packet_bytes > 268_435_460:
            raise ValueError("mqtt max_packet_bytes must be between 1024 and 268435460 (MQTT's largest packet)")
        if not 1 <= self.receive_maximum <= 65535 or not 1 <= self.max_inflight <= 65535:
            raise ValueError("mqtt receive_maximum and max_inflight must be 1-65535")
        if not 0 <= self.topic_alias_maximum <= 65535 or not 1 <= self.max_keep_alive_s <= 65535:
            raise ValueError("mqtt topic_alias_maximum must be 0-65535, max_keep_alive_s 1-65535")
        if min(self.max_pending_publishes, self.max_client_id_chars, self.max_subscriptions_per_session,
               self.max_filters_per_subscribe, self.max_connections, self.delivery_lease_ms, self.long_poll_ms,
               self.max_retained_per_subscribe, self.bind_topics_refresh_ms, self.kick_poll_ms) < 1:  # fmt: skip
            raise ValueError("mqtt sizes and durations must be positive")
        if self.max_session_expiry_s < 0 or self.sys_interval_s < 0:
            raise ValueError("mqtt max_session_expiry_s and sys_interval_s must not be negative")
        if self.connect_timeout_s <= 0 or self.janitor_interval_s <= 0 or self.call_timeout_s <= 0:
            raise ValueError("mqtt connect_timeout_s, janitor_interval_s and call_timeout_s must be positive")

    @property
    def enabled(self) -> bool:
        return self.port >= 0 or self.ws_port >= 0


@dataclass(frozen=True)
class ProxyConfig(ServedConfig):
    """The `[proxy]` table: the keys every served process states (common/served.py), then the proxy's own."""

    # The client port (RocketMQ gRPC); its address, or `advertise`, is what routes list.
    port: int = 8081
    route_refresh_s: float = 5.0
    # Largest request the gRPC server accepts: one message of the body size clients are told
    # (settings.max_body_bytes) with room for its properties, or a small batch. Larger requests get
    # gRPC RESOURCE_EXHAUSTED as soon as their length is read, before the rest is.
    max_message_bytes: int = 8 * 1024 * 1024
    # Calls in flight over every connection; beyond, a call gets gRPC RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = 10_000
    # Each client connection's HTTP/2 limits (docs/proxy.md, "The HTTP/2 edge").
    http2: Http2Limits = field(default_factory=Http2Limits)
    settings: ClientSettingsConfig = field(default_factory=ClientSettingsConfig)
    receive: ReceiveConfig = field(default_factory=ReceiveConfig)
    # Clients without a heartbeat or telemetry stream for this long are forgotten (official clients
    # heartbeat every 10 s; a killed client's stream closes at once): with the sweep (a quarter of
    # this, at most 5 s) and the immediate report that follows, `client list` drops it within 25 s.
    client_expiry_s: float = 20.0
    # How often the connected clients are reported to every broker (`sluice admin client list`).
    client_report_s: float = 5.0
    # The fleet (navigation/): where to register, this proxy's zone, its endpoint per network
    # (default: {"default": advertised address}), the namespaces it serves (empty: all).
    navigation: list[str] = field(default_factory=list)
    zone: str = ""
    networks: dict[str, str] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    proxy_id: str = ""
    navigation_heartbeat_s: float = 3.0
    endpoints_cache_s: float = 3.0
    # Proxies listed per route: every client keeps a Telemetry stream to each.
    max_route_endpoints: int = 4
    # Without navigation: the other proxies of this cluster (host:port as clients reach them),
    # listed in routes after this one, so that a client given one proxy retries on another when
    # it dies instead of failing until it is restarted (docs/proxy.md, "When a proxy dies").
    peers: list[str] = field(default_factory=list)
    # After SIGTERM, keep serving this long so clients move away on their next route refresh
    # (the Python client refreshes routes every 30 s), answering long polls quickly meanwhile.
    drain_s: float = 40.0
    drain_long_poll_ms: int = 500
    # Share the listening port with sibling workers (SO_REUSEPORT; set by --workers).
    reuse_port: bool = False
    # A topic the NameServer does not know: ask the brokers to create it (each does only where its
    # own auto_create is on). `sluice up` sets it for its proxy workers, so that topics are created
    # on first use there as in the single-process merged topology.
    auto_create_topics: bool = False
    transaction: TransactionCheckConfig = field(default_factory=TransactionCheckConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    input: InputLimitsConfig = field(default_factory=InputLimitsConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    brokers: BrokerClientConfig = field(default_factory=BrokerClientConfig)
    caches: CacheConfig = field(default_factory=CacheConfig)
    send_health: SendHealthConfig = field(default_factory=SendHealthConfig)
    reach: ReachConfig = field(default_factory=ReachConfig)
    amqp: AmqpConfig = field(default_factory=AmqpConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        for network, endpoint in self.networks.items():
            check_advertise(endpoint, f"networks.{network}")
        if self.max_message_bytes < self.settings.max_body_bytes + _HEADROOM_BYTES:
            raise ValueError(f"max_message_bytes must leave {_HEADROOM_BYTES} bytes over settings.max_body_bytes "
                             "(a message of the largest body clients are told must fit)")  # fmt: skip
        if self.flow.max_client_in_flight_bytes < self.max_message_bytes:
            raise ValueError("flow max_client_in_flight_bytes must be at least max_message_bytes (the largest request)")
        if self.client_expiry_s <= 0:
            raise ValueError(f"client_expiry_s must be positive, got {self.client_expiry_s}")
        if self.client_report_s <= 0:
            raise ValueError(f"client_report_s must be positive, got {self.client_report_s}")
