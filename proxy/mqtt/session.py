"""An MQTT session on this proxy: its subscriptions registered with the brokers, the deliveries to
its connection, and its QoS 1 and 2 state (docs/mqtt.md, "Delivery"). The wire is the connection's
(proxy/mqtt/connection.py); what outlives the connection is the brokers' (filters, positions, the
messages) and the state store's (proxy/mqtt/state.py).

Deliveries: one loop per (consumer group, bind topic, broker) pops the session's lite client,
asking for what its window has room for; each message is matched against the session's filters
(QoS, identifiers, No Local, Retain As Published) and written. QoS 0 is acknowledged to the broker
once written, QoS 1 at PUBACK; QoS 2 records (packet id, message id) in the state store before the
first PUBLISH, acknowledges at PUBREC after recording the release, and forgets the packet id at
PUBCOMP, so a redelivery after a reconnect or a proxy loss is sent with the same packet id (DUP) or
not at all. A QoS 1 message's packet id is its message id's (`packet_id_of`), so its redelivery
through any proxy carries it too (DUP: its delivery attempt is not the first). Acks to one broker
are sent together (one call per event loop turn). Messages in flight are leased
(`delivery_lease_ms`, renewed by the gateway); when the connection ends they are made visible
again at once for the session's next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.client.api import (
    EVERY_LITE_TOPIC,
    CallContext,
    LiteAction,
    LiteSync,
    PopRequest,
    StoredMessage,
    is_lite_scope,
)
from common import record
from common.errors import SluiceError
from common.logs import kv
from common.record import SYSPROP_LITE_TOPIC
from proxy.litenames import mqtt_topic
from proxy.mqtt import convert, state
from proxy.mqtt import properties as P
from proxy.mqtt.codes import MqttError
from proxy.mqtt.packets import PUBREL, ack
from proxy.mqtt.subscriptions import Subscription, Subscriptions

if TYPE_CHECKING:
    from proxy.mqtt.connection import Connection
    from proxy.mqtt.services import Services

log = logging.getLogger("sluice.proxy.mqtt")

POP_BATCH_MAX = 32  # a broker hands out at most this many per pop
RETRY_S = 1.0  # a delivery loop whose broker failed waits this long


@dataclass(slots=True)
class InFlight:
    """A QoS 1 or 2 PUBLISH sent and not yet completed by the client."""

    qos: int
    message: StoredMessage | None  # None: a retained message's delivery (no broker holds it for us)
    broker: str
    group: str
    bind: str
    released: bool = False  # QoS 2: PUBREC received (recorded), PUBREL sent
    settled: bool = False  # QoS 2: acknowledged to its broker before PUBREL was sent
    durable: bool = False  # a retained message's delivery recorded in the state store (`d` keys)
    sent_s: float = field(default_factory=time.monotonic)


LoopKey = tuple[str, str, str]  # (bind topic, group, broker)


class Session:
    def __init__(self, services: Services, namespace: str, client_id: str, record: state.SessionRecord) -> None:
        self.svc = services
        self.namespace = namespace
        self.client_id = client_id
        self.origin = f"{namespace}\x00{client_id}"
        self.lite_client = f"MQTT/{namespace}/{client_id}"
        self.record = record
        self.subs = Subscriptions(namespace, client_id)
        for text, raw in record.subs.items():
            self.subs.by_text[text] = Subscription.decode(text, raw)
        self.conn: Connection | None = None
        self.inflight: dict[int, InFlight] = {}
        self.window = 1
        self._room = asyncio.Event()
        self._next_pid = 1
        self._loops: dict[LoopKey, asyncio.Task[None]] = {}
        self._registered: set[tuple[str, str, str]] = {tuple(r) for r in record.reg}  # type: ignore[misc]
        self.q2_out: dict[str, tuple[int, str]] = {}  # message id -> (packet id, state) recorded
        self.inbound: dict[int, str] = {}  # inbound QoS 2: packet id -> message id, until PUBREL
        self._acks: dict[tuple[str, str, str], list[str]] = {}  # (broker, group, bind) -> receipt handles
        self._ack_task: asyncio.Task[None] | None = None
        self.retained_out: dict[int, state.RetainedOut] = {}  # recorded retained deliveries, by packet id
        self.had_qos2 = False  # QoS 2 or retained delivery state may have been written for it (its end looks)

    # -- attach and detach -----------------------------------------------------------------------

    def ctx(self) -> CallContext:
        return CallContext(client_id=self.client_id, namespace=self.namespace,
                           deadline=time.monotonic() + self.svc.config.call_timeout_s)  # fmt: skip

    async def load_unfinished(self) -> None:
        """The QoS 2 exchanges and retained deliveries a previous connection left unfinished
        (state store)."""
        inbound = await self.svc.state.scan_all(
            state.qos2_prefix(state.INBOUND, self.namespace, self.client_id), 65_536
        )
        self.inbound = {state.packet_id_of(k): v.decode() for k, v in inbound}
        outbound = await self.svc.state.scan_all(
            state.qos2_prefix(state.OUTBOUND, self.namespace, self.client_id), 65_536
        )
        for key, value in outbound:
            kind, message_id = state.parse_outbound(value)
            self.q2_out[message_id] = (state.packet_id_of(key), kind)
        retained = await self.svc.state.scan_all(
            state.qos2_prefix(state.RETAINED_OUT, self.namespace, self.client_id), 65_536
        )
        self.retained_out = {state.packet_id_of(k): state.RetainedOut.decode(v) for k, v in retained}
        self.had_qos2 = bool(inbound or outbound or retained)

    def attach(self, conn: Connection, window: int) -> None:
        """Serve `conn`: resend the PUBRELs pending and the retained deliveries unfinished (DUP,
        their packet ids), then start the delivery loops (which deliver what is unacknowledged
        again first, with DUP and its packet id)."""
        self.conn = conn
        self.window = window
        for pid, kind in self.q2_out.values():
            if kind == state.RELEASED and pid not in self.inflight:
                self.inflight[pid] = InFlight(2, None, "", "", "", released=True)
                conn.send(ack(PUBREL, pid, conn.version))
        now = convert.now_ms()
        for pid, out in self.retained_out.items():
            released = out.state == state.RELEASED
            self.inflight[pid] = InFlight(out.qos, None, "", "", "", released=released, settled=True, durable=True)
            if released:
                conn.send(ack(PUBREL, pid, conn.version))
                continue
            rec = record.decode(out.record)
            ob = convert.to_outbound(rec, mqtt_topic(rec.system_properties.get(SYSPROP_LITE_TOPIC, "")))
            ids = (out.identifier,) if out.identifier else ()
            conn.send_publish(ob, out.qos, True, True, pid, ids, now)
        self._room_changed()
        for bind, group in {(b, g) for b, g, _ in self._registered}:
            self.svc.spawn(self._start_scope_loops(group) if is_lite_scope(bind) else self._start_loops(bind, group))

    async def detach(self) -> None:
        """The connection ended: stop the loops, make what was in flight visible again."""
        self.conn = None
        self._loops.clear()  # each loop ends after its pop (`_serving`), giving back what that brought
        self._room.set()  # loops waiting for room see that they are done
        await self._flush_acks()
        pending = [(f, pid) for pid, f in self.inflight.items() if f.message is not None and not f.released]
        self.inflight = {pid: f for pid, f in self.inflight.items() if f.released}
        for f, _ in pending:
            assert f.message is not None
            with contextlib.suppress(SluiceError):
                api = self.svc.directory.broker(f.broker)
                await api.change_invisible_duration(f.group, f.bind, f.message.receipt_handle, 0, ctx=self.ctx())

    # -- subscriptions ---------------------------------------------------------------------------

    async def register(self, sub: Subscription) -> None:
        """Make the brokers match `sub` for this session: on every broker of the bind topic it can
        match in, or, for a filter whose first level is a wildcard, on every broker for every LITE
        topic of the namespace (its scope, `lite_scope`: bind topics made later included)."""
        if sub.local:
            return
        group = self.subs.group_of(sub)
        lite_filter = sub.filter.lite_filter()
        binds = self.svc.topics.binds_of_filter(sub.filter)
        if binds is None:
            await self._register_one(self.scope(), group, lite_filter)
            return
        for bind in binds:
            await self._register_one(self.svc.wrap(self.namespace, bind), group, lite_filter)

    def scope(self) -> str:
        """The namespace-wide name of filters that apply to each of its bind topics (`lite_scope`)."""
        return self.svc.wrap(self.namespace, EVERY_LITE_TOPIC)

    def registered_in_scope(self, sub: Subscription) -> bool:
        return (self.scope(), self.subs.group_of(sub), sub.filter.lite_filter()) in self._registered

    async def _brokers_of(self, bind: str) -> list[str]:
        """The brokers that hold the filters of `bind` (a scope's: every broker)."""
        if is_lite_scope(bind):
            return sorted(self.svc.directory.broker_names())
        return await self.svc.binds.brokers(bind)

    async def _register_one(self, bind: str, group: str, lite_filter: str) -> None:
        for broker in await self._brokers_of(bind):
            await self.svc.binds.ensure_group(broker, group)
            sync = LiteSync(group, bind, self.lite_client, LiteAction.PARTIAL_ADD, (lite_filter,), filters=True,
                            quota=self.svc.config.max_subscriptions_per_session)  # fmt: skip
            await self.svc.directory.broker(broker).sync_lite_subscription(sync)
        self._registered.add((bind, group, lite_filter))
        if self.conn is not None:
            await (self._start_scope_loops(group) if is_lite_scope(bind) else self._start_loops(bind, group))

    async def add_wild_bind(self, bind: str) -> None:
        """A bind topic the namespace did not have: the deliveries of the session's wildcard-first
        filters start there (the brokers matched them since the bind topic's first message)."""
        for group in {g for b, g, _ in self._registered if is_lite_scope(b)}:
            await self._start_loops(bind, group)

    async def unregister(self, sub: Subscription) -> None:
        """Stop the brokers matching `sub` (the lite topics only it matched are unsubscribed)."""
        group = self.subs.group_of(sub)
        lite_filter = sub.filter.lite_filter()
        for bind, g, f in [r for r in self._registered if r[1] == group and r[2] == lite_filter]:
            await self._sync_all(bind, g, LiteAction.PARTIAL_REMOVE, (f,))
            self._registered.discard((bind, g, f))
            if any(r[1] == g and is_lite_scope(r[0]) for r in self._registered):
                continue  # the group's deliveries in every bind topic go on
            if is_lite_scope(bind) or not any(r[0] == bind and r[1] == g for r in self._registered):
                held = {r[0] for r in self._registered if r[1] == g}
                for key in [k for k in self._loops if k[1] == g and k[0] not in held]:
                    del self._loops[key]  # it ends after its pop (`_serving`)

    async def _sync_all(self, bind: str, group: str, action: LiteAction, filters: tuple[str, ...]) -> None:
        try:
            brokers = await self._brokers_of(bind)
        except (SluiceError, MqttError):
            brokers = []
        for broker in brokers:
            sync = LiteSync(group, bind, self.lite_client, action, filters, filters=True)
            await self.svc.directory.broker(broker).sync_lite_subscription(sync)

    def registrations(self) -> list[list[str]]:
        return sorted([list(r) for r in self._registered])

    # -- deliveries ------------------------------------------------------------------------------

    async def _start_scope_loops(self, group: str) -> None:
        """Deliveries of a group with wildcard-first filters from every bind topic of the namespace."""
        try:
            binds = await self.svc.binds.all_binds(self.namespace, self.svc.config.bind_topics_refresh_ms / 1000.0)
        except SluiceError as exc:
            log.warning("MQTT deliveries not started", extra=kv(topic=self.scope(), error=exc.message))
            return
        for bind in binds:
            await self._start_loops(bind, group)

    async def _start_loops(self, bind: str, group: str) -> None:
        try:
            brokers = await self.svc.binds.brokers(bind)
        except (SluiceError, MqttError) as exc:
            log.warning("MQTT deliveries not started", extra=kv(topic=bind, error=str(exc)))
            return
        for broker in brokers:
            key = (bind, group, broker)
            if key not in self._loops and self.conn is not None:
                self._loops[key] = self.svc.spawn(self._loop(key))

    def _room_changed(self) -> None:
        if self._used() < self.window:
            self._room.set()
        else:
            self._room.clear()

    def _used(self) -> int:
        return len(self.inflight)

    def _serving(self, key: LoopKey) -> bool:
        return self.conn is not None and self._loops.get(key) is asyncio.current_task()

    async def _loop(self, key: LoopKey) -> None:
        """Deliveries of one (bind topic, group, broker). A loop is never cancelled while its pop
        is out (a cancelled call's pop may still take messages at the broker, which would then wait
        out their lease): it is stopped by leaving `_loops`, and ends once its pop answered, giving
        back at once what that pop brought."""
        bind, group, broker = key
        cfg = self.svc.config
        while self._serving(key):
            await self._room.wait()
            if not self._serving(key):
                return
            n = min(POP_BATCH_MAX, max(1, self.window - self._used()))
            request = PopRequest(group, bind, None, n, cfg.delivery_lease_ms, long_poll_ms=cfg.long_poll_ms,
                                 lite_client=self.lite_client, lite_window=self.window)  # fmt: skip
            try:
                api = self.svc.directory.broker(broker)
                found = await api.pop(request, ctx=CallContext(client_id=self.client_id, namespace=self.namespace))
            except SluiceError as exc:
                log.debug("MQTT delivery pop failed", extra=kv(broker=broker, topic=bind, error=exc.message))
                await asyncio.sleep(RETRY_S)
                continue
            for m in found:
                if not self._serving(key):  # ended meanwhile: back to the broker for the next connection
                    with contextlib.suppress(SluiceError):
                        await api.change_invisible_duration(group, bind, m.receipt_handle, 0)
                    continue
                await self._deliver(m, broker, group, bind)

    async def _deliver(self, m: StoredMessage, broker: str, group: str, bind: str) -> None:
        conn = self.conn
        assert conn is not None
        topic = mqtt_topic(m.system_properties.get(SYSPROP_LITE_TOPIC, ""))
        now = convert.now_ms()
        ob = convert.to_outbound(m, topic)
        match = self.subs.match(topic, group, ob.origin == self.origin)
        if match is None or (ob.expires_ms and ob.expires_ms <= now):
            self._ack(broker, group, bind, m.receipt_handle)  # nothing of this session wants it
            return
        qos = min(ob.qos, match.qos)
        retain = ob.retain and match.retain_as_published
        dup = False
        pid = 0
        if qos == 2:
            recorded = self.q2_out.get(m.message_id)
            if recorded is not None and recorded[1] == state.RELEASED:
                # It reached the client already (its broker's ack failed or was lost with a proxy):
                # acknowledged now, and only then forgotten.
                if await self._ack_now(broker, group, bind, m.receipt_handle) and recorded[0] not in self.inflight:
                    await self._forget_q2(recorded[0], m.message_id)
                return
            if recorded is not None:
                pid, dup = recorded[0], True
            else:
                pid = self._allocate(packet_id_of(m.message_id))
                key = state.qos2_key(state.OUTBOUND, self.namespace, self.client_id, pid)
                self.had_qos2 = True
                await self.svc.state.write([(key, state.outbound_value(state.PUBLISHED, m.message_id))])
                self.q2_out[m.message_id] = (pid, state.PUBLISHED)
        elif qos == 1:  # its packet id is its message id's, through whichever proxy delivers it again
            pid = self._allocate(packet_id_of(m.message_id))
            dup = m.delivery_attempt > 1
        sent = conn.send_publish(ob, qos, retain, dup, pid, match.identifiers, now)
        if not sent:  # larger than the client takes: as if delivered (5.0 3.1.2.25)
            self._ack(broker, group, bind, m.receipt_handle)
            if qos == 2:
                await self._forget_q2(pid, m.message_id)
            return
        self.svc.stats.sent(len(ob.payload))
        if qos == 0:
            self._ack(broker, group, bind, m.receipt_handle)
            return
        self.inflight[pid] = InFlight(qos, m, broker, group, bind)
        self._room_changed()

    def deliver_retained(self, ob: convert.Outbound, sub: Subscription) -> None:
        """A retained message for a new subscription (RETAIN set), kept in memory only: a `$SYS`
        topic's, or one of a session that ends with its connection."""
        conn = self.conn
        if conn is None:
            return
        qos = min(ob.qos, sub.options.qos)
        pid = self._allocate() if qos else 0
        ids = (sub.identifier,) if sub.identifier else ()
        if conn.send_publish(ob, qos, True, False, pid, ids, convert.now_ms()):
            self.svc.stats.sent(len(ob.payload))
            if qos:
                self.inflight[pid] = InFlight(qos, None, "", "", "")
                self._room_changed()

    async def deliver_stored_retained(self, entries: list[tuple[convert.Outbound, Subscription, bytes]]) -> None:
        """The stored retained messages (Outbound, subscription, record) a SUBSCRIBE matched. A
        persistent session's QoS 1 and 2 ones are recorded first (one state write), so that one
        not completed when its connection ends is sent again after the reconnect, through any
        proxy, with its packet id (3.1.1 4.4.0-1)."""
        if self.record.expiry_s == 0:
            for ob, sub, _ in entries:
                self.deliver_retained(ob, sub)
            return
        puts: list[tuple[bytes, bytes]] = []
        sends: list[tuple[convert.Outbound, int, int, tuple[int, ...]]] = []
        for ob, sub, raw in entries:
            qos = min(ob.qos, sub.options.qos)
            pid = self._allocate() if qos else 0
            ids: tuple[int, ...] = (sub.identifier,) if sub.identifier else ()
            if qos:
                self.inflight[pid] = InFlight(qos, None, "", "", "", durable=True)
                out = state.RetainedOut(qos, state.PUBLISHED, sub.identifier, raw)
                puts.append((state.qos2_key(state.RETAINED_OUT, self.namespace, self.client_id, pid), out.encode()))
            sends.append((ob, qos, pid, ids))
        if puts:
            self.had_qos2 = True
            try:
                await self.svc.state.write(puts)
            except SluiceError as exc:  # sent all the same, kept in memory only
                log.warning("MQTT retained deliveries not recorded", extra=kv(client=self.client_id,
                                                                             error=exc.message))  # fmt: skip
                for _, qos, pid, _ in sends:
                    if qos and pid in self.inflight:
                        self.inflight[pid].durable = False
        now = convert.now_ms()
        for ob, qos, pid, ids in sends:
            conn = self.conn
            if conn is None:
                return  # ended meanwhile: what was recorded is sent after the reconnect
            if conn.send_publish(ob, qos, True, False, pid, ids, now):
                self.svc.stats.sent(len(ob.payload))
            elif qos:  # larger than the client takes: as if delivered
                self._finish_retained(pid)
        self._room_changed()

    def _finish_retained(self, pid: int) -> None:
        """A recorded retained delivery completed (or dropped): its record goes."""
        self.inflight.pop(pid, None)
        self.retained_out.pop(pid, None)
        key = state.qos2_key(state.RETAINED_OUT, self.namespace, self.client_id, pid)
        self.svc.spawn(self.svc.state.write([], [key]))

    def _allocate(self, preferred: int = 0) -> int:
        """A packet id neither in flight nor reserved by recorded QoS 2 state: `preferred` (a
        message's own, `packet_id_of`) or the next free one after it; without one, the next of
        this session's rotation."""
        reserved = {pid for pid, _ in self.q2_out.values()}
        pid = preferred or self._next_pid
        for _ in range(65_536):
            if pid not in self.inflight and pid not in reserved:
                if not preferred:
                    self._next_pid = pid % 65_535 + 1
                return pid
            pid = pid % 65_535 + 1
        raise MqttError(0x97, "no packet identifier is free")

    # -- the client's acknowledgements ----------------------------------------------------------

    def puback(self, pid: int) -> bool:
        f = self.inflight.get(pid)
        if f is None or f.qos != 1:
            return False
        del self.inflight[pid]
        if f.message is not None:
            self._ack(f.broker, f.group, f.bind, f.message.receipt_handle)
        elif f.durable:
            self._finish_retained(pid)
        self._room_changed()
        return True

    async def pubrec(self, pid: int, refused: bool) -> bool:
        """PUBREC: recorded as released (or, refused by a 5.0 reason >= 0x80, forgotten), then
        acknowledged to its broker and that answered, before the caller sends PUBREL (unless
        refused): once PUBCOMP comes, nothing of the broker can deliver the message again, and the
        record may go."""
        f = self.inflight.get(pid)
        if f is None or f.qos != 2:
            return False
        if f.released:
            return True  # a repeated PUBREC: send PUBREL again
        message_id = f.message.message_id if f.message is not None else ""
        key = state.qos2_key(state.OUTBOUND, self.namespace, self.client_id, pid)
        if refused:
            del self.inflight[pid]
            if message_id:
                await self._forget_q2(pid, message_id)
            self._room_changed()
        elif message_id:
            await self.svc.state.write([(key, state.outbound_value(state.RELEASED, message_id))])
            self.q2_out[message_id] = (pid, state.RELEASED)
            f.released = True
        elif f.durable:  # a recorded retained delivery: PUBREL is what is sent again now
            await self._release_retained(pid)
            f.released = True
        else:
            f.released = True
        if f.message is not None:
            f.settled = await self._ack_now(f.broker, f.group, f.bind, f.message.receipt_handle)
            f.message = None
        else:
            f.settled = True  # a retained message's delivery: no broker holds it for us
        return True

    async def pubcomp(self, pid: int) -> bool:
        """PUBCOMP: the exchange is over. Its record goes once its broker acknowledged the message;
        otherwise it stays (the packet id reserved) until the broker delivers the message again,
        which is then acknowledged without being sent (`_deliver`)."""
        f = self.inflight.get(pid)
        if f is None or not f.released:
            return False
        del self.inflight[pid]
        if f.durable:
            self._finish_retained(pid)
        elif f.settled:
            for message_id, (recorded, _) in list(self.q2_out.items()):
                if recorded == pid:
                    await self._forget_q2(pid, message_id)
        self._room_changed()
        return True

    async def _release_retained(self, pid: int) -> None:
        key = state.qos2_key(state.RETAINED_OUT, self.namespace, self.client_id, pid)
        raw = await self.svc.state.get_one(key)
        if raw is not None:
            out = state.RetainedOut.decode(raw)
            released = state.RetainedOut(out.qos, state.RELEASED, out.identifier, b"")
            await self.svc.state.write([(key, released.encode())])
            self.retained_out[pid] = released

    async def _forget_q2(self, pid: int, message_id: str) -> None:
        self.q2_out.pop(message_id, None)
        await self.svc.state.write([], [state.qos2_key(state.OUTBOUND, self.namespace, self.client_id, pid)])

    # -- acks to the brokers and leases -----------------------------------------------------------

    async def _ack_now(self, broker: str, group: str, bind: str, handle: str) -> bool:
        """Acknowledge one message and wait for the broker's answer; whether it was acknowledged."""
        try:
            results = await self.svc.directory.broker(broker).ack(group, bind, [handle], ctx=self.ctx())
        except SluiceError as exc:
            log.warning("MQTT QoS 2 ack not stored", extra=kv(broker=broker, topic=bind, error=exc.message))
            return False
        return all(r.ok for r in results)

    def _ack(self, broker: str, group: str, bind: str, handle: str) -> None:
        self._acks.setdefault((broker, group, bind), []).append(handle)
        if self._ack_task is None:
            self._ack_task = self.svc.spawn(self._flush_acks())

    async def _flush_acks(self) -> None:
        await asyncio.sleep(0)  # the acks of this event loop turn go together
        self._ack_task = None
        acks, self._acks = self._acks, {}
        for (broker, group, bind), handles in acks.items():
            try:
                await self.svc.directory.broker(broker).ack(group, bind, handles, ctx=self.ctx())
            except SluiceError as exc:  # redelivered after the lease: at least once
                log.warning("MQTT acks not stored", extra=kv(broker=broker, topic=bind, error=exc.message))

    async def renew(self, older_than_s: float) -> None:
        """Extend the lease of messages in flight longer than `older_than_s` (the gateway's renewer)."""
        cut = time.monotonic() - older_than_s
        due: dict[tuple[str, str, str], list[InFlight]] = {}
        for f in self.inflight.values():
            if f.message is not None and f.sent_s < cut:
                due.setdefault((f.broker, f.group, f.bind), []).append(f)
        for (broker, group, bind), entries in due.items():
            handles = [f.message.receipt_handle for f in entries if f.message is not None]
            with contextlib.suppress(SluiceError):
                await self.svc.directory.broker(broker).renew(group, bind, handles, self.svc.config.delivery_lease_ms,
                                                              ctx=self.ctx())  # fmt: skip
            now = time.monotonic()
            for f in entries:
                f.sent_s = now

    async def drop(self) -> None:
        """Remove the session everywhere: its filters and their subscriptions, its group's state."""
        for bind, group in {(b, g) for b, g, _ in self._registered}:
            with contextlib.suppress(SluiceError, MqttError):
                await self._sync_all(bind, group, LiteAction.COMPLETE_REMOVE, ())
        self._registered.clear()
        self.inflight.clear()
        self.q2_out.clear()
        self.inbound.clear()


def packet_id_of(message_id: str) -> int:
    """The packet id a message is delivered with (1-65535): the same wherever it is delivered again,
    so a QoS 1 redelivery through another proxy (a takeover, a proxy lost) carries its original
    packet id, as MQTT asks (3.1.1 4.4.0-1; 5.0 4.4.0-1). Two messages in flight to one session
    whose ids meet here get the next free id (about one delivery in 65,535 / the window)."""
    return zlib.crc32(message_id.encode()) % 65_535 + 1


def out_props(ob: convert.Outbound, identifiers: tuple[int, ...], now_ms: int) -> bytes:
    """The encoded 5.0 properties of a delivery."""
    if not ob.props and not identifiers and not ob.expires_ms:
        return b"\x00"
    props = dict(ob.props)
    if identifiers:
        props[P.SUBSCRIPTION_ID] = list(identifiers)
    if ob.expires_ms:
        props[P.MESSAGE_EXPIRY] = max(0, (ob.expires_ms - now_ms + 999) // 1000)
    return P.encode(props)
