"""One MQTT connection: the wire state machine, its limits, and the handlers of each packet
(docs/mqtt.md). Transport-neutral: TCP, TLS and WebSocket hand it bytes (`feed`) and take what it
writes (`Transport`).

States: waiting for CONNECT (anything else closes the connection; a CONNECT not sent within
`connect_timeout_s` too), then connected until DISCONNECT, a protocol error, keep alive expiry, a
takeover or the proxy's stop. Packets are read as they come; what needs the brokers (PUBLISH, PUBREL,
SUBSCRIBE, UNSUBSCRIBE) goes through one ordered queue worked by one task, so acknowledgements go
out in the order the packets came (3.1.1 4.6, 5.0 4.6), consecutive PUBLISHes are stored with one
broker send, and a queue longer than `max_pending_publishes` stops reading the connection.

Every refusal is a reason code (proxy/mqtt/codes.py): a 5.0 client gets it in its CONNACK, PUBACK,
SUBACK or DISCONNECT, with the reason as text; a 3.1.1 client the CONNACK return code, or the
connection closed where 3.1.1 has no packet for it. One log line each, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Protocol

from common.errors import SluiceError
from common.logs import kv
from proxy.mqtt import codes as C
from proxy.mqtt import packets as K
from proxy.mqtt import properties as P
from proxy.mqtt.codec import Framer
from proxy.mqtt.codes import MqttError
from proxy.mqtt.convert import Outbound
from proxy.mqtt.session import Session, out_props

if TYPE_CHECKING:
    from proxy.mqtt.server import Gateway

log = logging.getLogger("sluice.proxy.mqtt")

MAX_EARLY_PACKETS = 64  # packets a client sends before its CONNACK is written, held at most
PUBLISH_BATCH_MAX = 128  # consecutive PUBLISHes stored with one broker send, at most


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Connection:
    def __init__(self, gateway: Gateway, transport: Transport, peer: str, conn_id: int, *, websocket: bool) -> None:
        self.gw = gateway
        self.svc = gateway.svc
        cfg = self.svc.config
        self.transport = transport
        self.peer = peer
        self.id = conn_id
        self.websocket = websocket
        self.framer = Framer(cfg.max_packet_bytes)
        self.version = K.V311
        self.connected = False
        self.closed = False
        self.session: Session | None = None
        self.namespace = ""
        self.client_id = ""
        self.username = ""
        self.keep_alive = 0
        self.last_rx = time.monotonic()
        self.opened = time.monotonic()
        self.epoch = 0
        self.problem_info = True  # 5.0 Request Problem Information
        self.client_max_packet = 0  # 0: none given
        self.client_alias_max = 0
        self.will: K.Will | None = None
        self.kicked = False  # taken over on another proxy (or by an operator): its session lives on there
        self.connect_seen = False  # a CONNECT was read (its answer may take a while: no CONNECT timeout then)
        self._early: list[tuple[int, bytes]] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._work: deque[K.Packet] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._paused = False
        self._unacked_in: set[int] = set()  # QoS 1/2 PUBLISH packet ids not completed by us (Receive Maximum)
        self._aliases_in: dict[int, str] = {}
        self._aliases_out: dict[str, int] = {}

    # -- bytes in --------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = time.monotonic()
        try:
            for first, body in self.framer.feed(data):
                if self.closed:
                    return
                if not self.connected:
                    self._before_connack(first, body)
                else:
                    self._packet(K.decode(first, body, self.version))
        except MqttError as exc:
            self.fail(exc)

    def _before_connack(self, first: int, body: bytes) -> None:
        if self._early is not None:  # CONNECT is being answered: hold what the client pipelined
            if len(self._early) >= MAX_EARLY_PACKETS:
                raise MqttError(C.QUOTA_EXCEEDED, f"more than {MAX_EARLY_PACKETS} packets before CONNACK")
            self._early.append((first, body))
            return
        try:
            pkt = K.decode_connect(first, body)
        except MqttError as exc:
            if exc.reason == C.UNSUPPORTED_PROTOCOL_VERSION:  # answered in the 3.1.1 form (return code 1)
                self._refuse_connect(exc, K.V311)
                return
            raise
        self.version = pkt.version
        self.connect_seen = True
        self._early = []
        self.gw.svc.spawn(self._connect(pkt))

    async def _connect(self, pkt: K.Connect) -> None:
        try:
            await self.gw.sessions.connect(self, pkt)
        except MqttError as exc:
            self._refuse_connect(exc, self.version)
            return
        except SluiceError as exc:
            self._refuse_connect(C.from_sluice(exc), self.version)
            return
        early, self._early = self._early or [], None
        try:
            for first, body in early:
                if self.closed:
                    return
                self._packet(K.decode(first, body, self.version))
        except MqttError as exc:
            self.fail(exc)

    def _refuse_connect(self, exc: MqttError, version: int) -> None:
        self.svc.stats.refuse(C.NAMES.get(exc.reason, hex(exc.reason)))
        log.info("MQTT connection refused", extra=kv(peer=self.peer, reason=str(exc)))
        if version == K.V5:
            props = {P.REASON_STRING: exc.message[:256]} if self.problem_info else P.EMPTY
            self.send(K.connack(K.V5, False, exc.reason, props))
        elif exc.reason in C.CONNACK_V3 or exc.reason in (C.SERVER_UNAVAILABLE, C.SERVER_BUSY, C.QUOTA_EXCEEDED):
            self.send(K.connack(K.V311, False, C.CONNACK_V3.get(exc.reason, C.V3_SERVER_UNAVAILABLE)))
        self.close(will=False)

    # -- connected: the packets ------------------------------------------------------------------

    def accepted(self, session: Session, present: bool, props: P.Props) -> None:
        """The session is open: CONNACK, then deliveries."""
        self.session = session
        self.connected = True
        self.send(K.connack(self.version, present, C.SUCCESS, props))

    def _packet(self, pkt: K.Packet) -> None:
        session = self.session
        assert session is not None
        if isinstance(pkt, K.Publish):
            self._publish_received(pkt)
        elif isinstance(pkt, K.Ack):
            if pkt.kind == K.PUBACK:
                session.puback(pkt.packet_id)
            elif pkt.kind == K.PUBREL:
                self._enqueue(pkt)
            elif pkt.kind == K.PUBREC:
                self.svc.spawn(self._pubrec(pkt))
            else:
                self.svc.spawn(session.pubcomp(pkt.packet_id))
        elif isinstance(pkt, K.PingReq):
            self.send(K.PINGRESP_BYTES)
        elif isinstance(pkt, K.Subscribe | K.Unsubscribe):
            self._enqueue(pkt)
        elif isinstance(pkt, K.Disconnect):
            self._disconnect(pkt)
        else:  # AUTH: no authentication method was agreed, so there is no exchange to continue
            raise MqttError(C.PROTOCOL_ERROR, "AUTH without an authentication method (not supported)")

    async def _pubrec(self, pkt: K.Ack) -> None:
        session = self.session
        assert session is not None
        found = await session.pubrec(pkt.packet_id, pkt.reason >= 0x80)
        if pkt.reason < 0x80 and not self.closed:
            reason = C.SUCCESS if found else C.PACKET_ID_NOT_FOUND
            self.send(K.ack(K.PUBREL, pkt.packet_id, self.version, reason))

    def _publish_received(self, pkt: K.Publish) -> None:
        if self.version == K.V5:
            self._resolve_alias(pkt)
            if pkt.qos and pkt.packet_id not in self._unacked_in:
                most = self.svc.config.receive_maximum
                if len(self._unacked_in) >= most:
                    raise MqttError(C.RECEIVE_MAXIMUM_EXCEEDED, f"more than {most} QoS 1 and 2 PUBLISHes "
                                    "unacknowledged (the Receive Maximum this server sent)")  # fmt: skip
                self._unacked_in.add(pkt.packet_id)
        self.svc.stats.received(len(pkt.payload))
        self._enqueue(pkt)

    def _resolve_alias(self, pkt: K.Publish) -> None:
        alias = pkt.props.get(P.TOPIC_ALIAS)
        if alias is None:
            return
        if alias > self.svc.config.topic_alias_maximum:
            raise MqttError(C.TOPIC_ALIAS_INVALID, f"topic alias {alias} is above the maximum "
                            f"{self.svc.config.topic_alias_maximum} this server sent")  # fmt: skip
        if pkt.topic:
            self._aliases_in[alias] = pkt.topic
            return
        topic = self._aliases_in.get(alias)
        if topic is None:
            raise MqttError(C.PROTOCOL_ERROR, f"topic alias {alias} was never set on this connection")
        pkt.topic = topic

    def _disconnect(self, pkt: K.Disconnect) -> None:
        session = self.session
        expiry = pkt.props.get(P.SESSION_EXPIRY)
        if expiry is not None and session is not None:
            if session.record.expiry_s == 0 and expiry:
                raise MqttError(C.PROTOCOL_ERROR, "a session expiry set on DISCONNECT when CONNECT set none")
            session.record.expiry_s = min(expiry, self.svc.config.max_session_expiry_s)
        self.close(will=pkt.reason == C.DISCONNECT_WITH_WILL)

    # -- the ordered work queue ------------------------------------------------------------------

    def _enqueue(self, pkt: K.Packet) -> None:
        self._work.append(pkt)
        if self._worker is None:
            self._worker = self.svc.spawn(self._work_loop())
        if len(self._work) > self.svc.config.max_pending_publishes and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    async def _work_loop(self) -> None:
        try:
            while self._work and not self.closed:
                first = self._work[0]
                if isinstance(first, K.Publish):
                    batch: list[K.Publish] = []
                    while self._work and isinstance(self._work[0], K.Publish) and len(batch) < PUBLISH_BATCH_MAX:
                        batch.append(self._work.popleft())  # type: ignore[arg-type]
                    await self.gw.inbound.publish(self, batch)
                else:
                    self._work.popleft()
                    await self._handle(first)
                if self._paused and len(self._work) <= self.svc.config.max_pending_publishes // 2:
                    self._paused = False
                    self.transport.resume_reading()
        except MqttError as exc:
            self.fail(exc)
        finally:
            self._worker = None
            if self._work and not self.closed:
                self._worker = self.svc.spawn(self._work_loop())

    async def _handle(self, pkt: K.Packet) -> None:
        if isinstance(pkt, K.Ack):  # PUBREL of an inbound QoS 2 exchange
            await self.gw.inbound.release(self, pkt.packet_id)
        elif isinstance(pkt, K.Subscribe):
            await self.gw.subscriptions.subscribe(self, pkt)
        elif isinstance(pkt, K.Unsubscribe):
            await self.gw.subscriptions.unsubscribe(self, pkt)

    def completed_in(self, packet_id: int) -> None:
        """A QoS 1 PUBLISH acknowledged, a QoS 2 one completed: room under the Receive Maximum."""
        self._unacked_in.discard(packet_id)

    # -- bytes out -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.closed:
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out = []
            self.transport.write(data)

    def send_publish(self, ob: Outbound, qos: int, retain: bool, dup: bool, pid: int, identifiers: tuple[int, ...],
                     now_ms: int) -> bool:  # fmt: skip
        """Write a delivery; False (nothing written) when it is larger than the client's maximum."""
        topic = ob.topic.encode()
        props = b""
        if self.version == K.V5:
            if self.client_alias_max:
                topic, props = self._alias_out(ob, identifiers, now_ms, topic)
            else:
                props = out_props(ob, identifiers, now_ms)
        data = K.publish(self.version, topic, ob.payload, qos, retain, dup, pid, props)
        if self.client_max_packet and len(data) > self.client_max_packet:
            log.info("MQTT delivery larger than the client's maximum packet size dropped", extra=kv(
                client=self.client_id, size_bytes=len(data), max_bytes=self.client_max_packet))  # fmt: skip
            return False
        self.send(data)
        return True

    def _alias_out(self, ob: Outbound, identifiers: tuple[int, ...], now_ms: int, topic: bytes) -> tuple[bytes, bytes]:
        alias = self._aliases_out.get(ob.topic)
        extra: P.Props = dict(ob.props)
        if alias is not None:
            extra[P.TOPIC_ALIAS] = alias
            topic = b""
        elif len(self._aliases_out) < self.client_alias_max:
            alias = len(self._aliases_out) + 1
            self._aliases_out[ob.topic] = alias
            extra[P.TOPIC_ALIAS] = alias
        return topic, out_props(Outbound(ob.topic, ob.payload, ob.qos, ob.retain, ob.origin, ob.expires_ms, extra),
                                identifiers, now_ms)  # fmt: skip

    # -- the end ---------------------------------------------------------------------------------

    def fail(self, exc: MqttError) -> None:
        """A protocol violation or a refusal that ends the connection (5.0: DISCONNECT with its reason)."""
        if self.closed:
            return
        self.svc.stats.refuse(C.NAMES.get(exc.reason, hex(exc.reason)))
        log.info("MQTT connection closed", extra=kv(client=self.client_id, peer=self.peer, reason=str(exc)))
        if self.connected and self.version == K.V5:
            self.send(K.disconnect(exc.reason, {P.REASON_STRING: exc.message[:256]} if self.problem_info else {}))
        self.close(will=True)

    def server_disconnect(self, reason: int, text: str) -> None:
        """The server ends the connection (a takeover, an operator, shutdown): 5.0 clients are told why."""
        if self.closed:
            return
        if self.connected and self.version == K.V5:
            self.send(K.disconnect(reason, {P.REASON_STRING: text} if self.problem_info else {}))
        self.close(will=reason not in (C.SERVER_SHUTTING_DOWN,))

    def close(self, *, will: bool) -> None:
        if self.closed:
            return
        self._flush()
        self.closed = True
        self.transport.close()
        self.gw.connection_lost(self, will=will)

    def lost(self) -> None:
        """The transport ended (the peer closed, a reset): as a close without DISCONNECT."""
        if not self.closed:
            self.closed = True
            self.gw.connection_lost(self, will=True)
