"""PUBLISHes from clients (and wills): checked, stored through the proxy's producer, retained, and
acknowledged (docs/mqtt.md, "Delivery": publishing).

A batch is the consecutive PUBLISHes a connection's queue holds: their QoS 2 packet ids are
recorded in one state write, their messages stored with one producer call (one broker send per
lite topic's broker), their retained copies written in one state write, and their PUBACKs and
PUBRECs sent in order once the brokers stored them (and the in-sync replicas of a replicated group
hold them). A QoS 2 PUBLISH whose packet id is recorded already (a resend, through any proxy) is
sent again with the recorded message id as a dedup send: the broker answers with the stored copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import SluiceError, TopicNotFound
from common.logs import kv
from common.security import Action, ResourceKind
from proxy.mqtt import codes as C
from proxy.mqtt import convert, state
from proxy.mqtt import packets as K
from proxy.mqtt import properties as P
from proxy.mqtt.codes import MqttError
from proxy.mqtt.topics import SYS_PREFIX, validate_topic

if TYPE_CHECKING:
    from proxy.mqtt.connection import Connection
    from proxy.mqtt.services import Services

log = logging.getLogger("sluice.proxy.mqtt")


@dataclass(slots=True)
class _Item:
    pkt: K.Publish
    bind: str = ""
    lite: str = ""
    message_id: str = ""
    error: MqttError | None = None


class Inbound:
    def __init__(self, services: Services) -> None:
        self.svc = services

    def _route(self, namespace: str, user: str, p: K.Publish) -> tuple[str, str]:
        """(bind topic, lite topic) of a PUBLISH's topic; MqttError when it may not be stored."""
        topic = validate_topic(p.topic)
        if topic.startswith(SYS_PREFIX) or topic == SYS_PREFIX[:-1]:
            raise MqttError(C.NOT_AUTHORIZED, "$SYS topics are the server's: clients cannot publish to them")
        topics = self.svc.topics
        bind = self.svc.wrap(namespace, topics.bind_of(topic))
        lite = topics.lite_of(topic)
        authorize = self.svc.authorize
        if authorize is not None:
            try:
                authorize(user, namespace, ResourceKind.TOPIC, topics.bind_of(topic), Action.PUB)
            except SluiceError as exc:
                raise MqttError(C.NOT_AUTHORIZED, exc.message) from None
        return bind, lite

    async def publish(self, conn: Connection, batch: list[K.Publish]) -> None:
        session = conn.session
        assert session is not None
        items = [_Item(p) for p in batch]
        for item in items:
            p = item.pkt
            if "+" in p.topic or "#" in p.topic or not p.topic:
                raise MqttError(C.TOPIC_NAME_INVALID, f"PUBLISH topic {p.topic[:64]!r} is empty or has a wildcard")
            try:
                item.bind, item.lite = self._route(conn.namespace, conn.username, p)
            except MqttError as exc:
                item.error = exc
        q2_new: list[tuple[bytes, bytes]] = []
        for item in items:
            if item.error is not None:
                continue
            if item.pkt.qos == 2:
                known = session.inbound.get(item.pkt.packet_id)
                if known is None:
                    known = convert.new_message_id()
                    session.inbound[item.pkt.packet_id] = known
                    key = state.qos2_key(state.INBOUND, conn.namespace, conn.client_id, item.pkt.packet_id)
                    q2_new.append((key, known.encode()))
                item.message_id = known
            else:
                item.message_id = convert.new_message_id()
        if q2_new:
            session.had_qos2 = True
            await self.svc.state.write(q2_new)
        await self._store(session.ctx(), session.origin, [i for i in items if i.error is None])
        await self._retain(conn.namespace, [i for i in items if i.error is None and i.pkt.retain])
        for item in items:
            self._answer(conn, item)

    async def _store(self, ctx: object, origin: str, items: list[_Item]) -> None:
        if not items:
            return
        now = convert.now_ms()
        records = [(i.bind, convert.to_record(i.pkt, i.lite, origin, self.svc.host, i.message_id, now_ms=now,
                                              dedup=i.pkt.qos == 2)) for i in items]  # fmt: skip
        lites = [i.lite for i in items]
        results = await self.svc.send(ctx, records, lites)  # type: ignore[arg-type]
        missing = {i.bind for i, r in zip(items, results, strict=True) if isinstance(r, TopicNotFound)}
        if missing:  # a bind topic used for the first time: made, then those messages sent again
            for bind in sorted(missing):
                try:
                    await self.svc.binds.brokers(bind)
                except (SluiceError, MqttError) as exc:
                    log.info("MQTT bind topic not made", extra=kv(topic=bind, error=str(exc)))
                    err = exc if isinstance(exc, MqttError) else C.from_sluice(exc)
                    for n, i in enumerate(items):
                        if i.bind == bind:
                            results[n] = err
                    missing.discard(bind)
            again = [n for n, i in enumerate(items) if i.bind in missing]
            if again:
                retried = await self.svc.send(ctx, [records[n] for n in again], [lites[n] for n in again])  # type: ignore[arg-type]
                for n, r in zip(again, retried, strict=True):
                    results[n] = r
        for item, result in zip(items, results, strict=True):
            if isinstance(result, MqttError):
                item.error = result
            elif isinstance(result, SluiceError):
                item.error = C.from_sluice(result)

    async def _retain(self, namespace: str, items: list[_Item]) -> None:
        """Keep (or, empty, clear) the retained message of each topic; the last of a batch wins."""
        if not items:
            return
        latest: dict[str, _Item] = {}
        for item in items:
            latest[item.pkt.topic] = item
        puts, deletes = [], []
        now = convert.now_ms()
        for topic, item in latest.items():
            key = state.retained_key(namespace, topic)
            if item.pkt.payload:
                puts.append((key, convert.to_record(item.pkt, item.lite, "", self.svc.host, item.message_id,
                                                    now_ms=now)))  # fmt: skip
            else:
                deletes.append(key)
        try:
            await self.svc.state.write(puts, deletes)
        except SluiceError as exc:
            for item in items:
                item.error = C.from_sluice(exc)

    def _answer(self, conn: Connection, item: _Item) -> None:
        p = item.pkt
        err = item.error
        if err is not None:
            self.svc.stats.refuse(C.NAMES.get(err.reason, hex(err.reason)))
            if conn.version != K.V5 and p.qos:
                # 3.1.1 has no negative PUBACK: the connection is closed, nothing was acknowledged.
                raise err
            log.info("MQTT publish refused", extra=kv(client=conn.client_id, topic=p.topic[:128], reason=str(err)))
            if not p.qos:
                return
            props = {P.REASON_STRING: err.message[:256]} if conn.problem_info else P.EMPTY
            if p.qos == 2:
                session = conn.session
                if session is not None:
                    session.inbound.pop(p.packet_id, None)
                conn.completed_in(p.packet_id)
                conn.send(K.ack(K.PUBREC, p.packet_id, conn.version, err.reason, props))
            else:
                conn.completed_in(p.packet_id)
                conn.send(K.ack(K.PUBACK, p.packet_id, conn.version, err.reason, props))
            return
        if p.qos == 1:
            conn.completed_in(p.packet_id)
            conn.send(K.ack(K.PUBACK, p.packet_id, conn.version))
        elif p.qos == 2:
            conn.send(K.ack(K.PUBREC, p.packet_id, conn.version))

    async def release(self, conn: Connection, packet_id: int) -> None:
        """PUBREL: the exchange is over; its packet id is forgotten, PUBCOMP sent."""
        session = conn.session
        assert session is not None
        known = session.inbound.pop(packet_id, None)
        if known is not None:
            await self.svc.state.write([], [state.qos2_key(state.INBOUND, conn.namespace, conn.client_id, packet_id)])
        conn.completed_in(packet_id)
        reason = C.SUCCESS if known is not None else C.PACKET_ID_NOT_FOUND
        conn.send(K.ack(K.PUBCOMP, packet_id, conn.version, reason))

    async def publish_will(self, namespace: str, origin: str, will: K.Will, ctx: object) -> None:
        """A will message, stored as its client would have published it (retained if asked)."""
        p = K.Publish(will.topic, will.payload, will.qos, will.retain, False, 0, dict(will.props))
        p.props.pop(P.WILL_DELAY, None)
        item = _Item(p)
        try:
            item.bind = self.svc.wrap(namespace, self.svc.topics.bind_of(p.topic))
            item.lite = self.svc.topics.lite_of(p.topic)
        except MqttError as exc:
            log.info("MQTT will not published", extra=kv(topic=p.topic[:128], reason=str(exc)))
            return
        item.message_id = convert.new_message_id()
        await self._store(ctx, origin, [item])
        if item.error is None and p.retain:
            await self._retain(namespace, [item])
        if item.error is not None:
            log.warning("MQTT will not stored", extra=kv(topic=p.topic[:128], reason=str(item.error)))
