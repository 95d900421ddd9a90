"""SUBSCRIBE and UNSUBSCRIBE (docs/mqtt.md, "Subscriptions and matching"): each filter checked,
registered with the brokers of the bind topics it can match in, the session record written, SUBACK
with a reason per filter, then the retained messages the filter matches (as its Retain Handling
says; never for a shared subscription)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from common import record
from common.errors import SluiceError
from common.litefilter import matches
from common.logs import kv
from common.record import SYSPROP_LITE_TOPIC
from common.security import Action, ResourceKind
from proxy.mqtt import codes as C
from proxy.mqtt import convert, state
from proxy.mqtt import packets as K
from proxy.mqtt import properties as P
from proxy.mqtt.codes import MqttError
from proxy.mqtt.subscriptions import Subscription
from proxy.mqtt.topics import Filter, parse_filter

if TYPE_CHECKING:
    from proxy.mqtt.connection import Connection
    from proxy.mqtt.server import Gateway

log = logging.getLogger("sluice.proxy.mqtt")


def literal_prefix(f: Filter) -> str:
    """The part of a filter before its first wildcard level (what a retained scan can seek to)."""
    out: list[str] = []
    for level in f.filter.split("/"):
        if level in ("+", "#"):
            return "/".join(out) + "/" if out else ""
        out.append(level)
    return f.filter


class SubscribeHandler:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.svc = gateway.svc

    def _check(self, conn: Connection, f: Filter) -> None:
        authorize = self.svc.authorize
        if authorize is None:
            return
        binds = self.svc.topics.binds_of_filter(f)
        for bind in binds if binds is not None else ["*"]:
            try:
                authorize(conn.username, conn.namespace, ResourceKind.TOPIC, bind, Action.SUB)
            except SluiceError as exc:
                raise MqttError(C.NOT_AUTHORIZED, exc.message) from None

    async def subscribe(self, conn: Connection, pkt: K.Subscribe) -> None:
        session = conn.session
        assert session is not None
        cfg = self.svc.config
        ids = pkt.props.get(P.SUBSCRIPTION_ID, [0])
        identifier = ids[0]
        reasons: list[int] = []
        fresh: list[tuple[Subscription, bool]] = []
        problems: list[str] = []
        for n, (text, options) in enumerate(pkt.entries):
            try:
                if n >= cfg.max_filters_per_subscribe:
                    raise MqttError(C.QUOTA_EXCEEDED, f"more than {cfg.max_filters_per_subscribe} filters in one "
                                    "SUBSCRIBE")  # fmt: skip
                f = parse_filter(text)
                if f.share and options.no_local:
                    raise MqttError(C.PROTOCOL_ERROR, "No Local on a shared subscription")
                existed = text in session.subs.by_text
                if not existed and len(session.subs) >= cfg.max_subscriptions_per_session:
                    raise MqttError(C.QUOTA_EXCEEDED, f"a session holds at most {cfg.max_subscriptions_per_session} "
                                    "subscriptions")  # fmt: skip
                self._check(conn, f)
                sub = Subscription(f, options, identifier)
                await session.register(sub)
                session.subs.by_text[text] = sub
                fresh.append((sub, existed))
                reasons.append(options.qos)
            except MqttError as exc:
                if exc.reason == C.PROTOCOL_ERROR:
                    raise
                reasons.append(exc.reason if conn.version == K.V5 else 0x80)
                problems.append(f"{text[:64]}: {exc.message}")
            except SluiceError as exc:
                err = C.from_sluice(exc)
                reasons.append(err.reason if conn.version == K.V5 else 0x80)
                problems.append(f"{text[:64]}: {err.message}")
        if fresh:
            await self.gw.sessions.save(session)
        if problems:
            log.info("MQTT subscriptions refused", extra=kv(client=conn.client_id, problems="; ".join(problems)))
        props = {P.REASON_STRING: "; ".join(problems)[:256]} if problems and conn.problem_info else P.EMPTY
        conn.send(K.suback(conn.version, pkt.packet_id, reasons, props))
        for sub, existed in fresh:
            await self._retained(conn, sub, existed)

    async def _retained(self, conn: Connection, sub: Subscription, existed: bool) -> None:
        rh = sub.options.retain_handling
        if sub.filter.share or rh == 2 or (rh == 1 and existed):
            return
        session = conn.session
        assert session is not None
        if sub.local:
            self.gw.sys.send_all(session, sub)
            return
        cfg = self.svc.config
        prefix = literal_prefix(sub.filter)
        try:
            if prefix == sub.filter.filter:  # no wildcard: one key
                raw = await self.svc.state.get_one(state.retained_key(conn.namespace, prefix))
                entries = [] if raw is None else [(state.retained_key(conn.namespace, prefix), raw)]
            else:
                entries = await self.svc.state.scan_all(state.retained_prefix(conn.namespace, prefix),
                                                        cfg.max_retained_per_subscribe)  # fmt: skip
        except SluiceError as exc:
            log.warning("MQTT retained messages not read", extra=kv(client=conn.client_id, error=exc.message))
            return
        now = convert.now_ms()
        matched: list[tuple[convert.Outbound, Subscription, bytes]] = []
        for key, raw in entries:
            topic = state.topic_of_retained(key, conn.namespace)
            if not matches(sub.filter.filter, topic):
                continue
            rec = record.decode(raw)
            ob = convert.to_outbound(rec, topic)
            if ob.expires_ms and ob.expires_ms <= now:
                continue
            if rec.system_properties.get(SYSPROP_LITE_TOPIC) is None:
                continue
            matched.append((ob, sub, raw))
        await session.deliver_stored_retained(matched)

    async def unsubscribe(self, conn: Connection, pkt: K.Unsubscribe) -> None:
        session = conn.session
        assert session is not None
        reasons: list[int] = []
        changed = False
        for text in pkt.filters:
            sub = session.subs.by_text.get(text)
            if sub is None:
                try:
                    parse_filter(text)
                    reasons.append(C.NO_SUBSCRIPTION_EXISTED)
                except MqttError as exc:
                    reasons.append(exc.reason)
                continue
            del session.subs.by_text[text]
            try:
                if not any(session.subs.group_of(s) == session.subs.group_of(sub)
                           and s.filter.lite_filter() == sub.filter.lite_filter() for s in session.subs):  # fmt: skip
                    await session.unregister(sub)
                reasons.append(C.SUCCESS)
                changed = True
            except SluiceError as exc:
                reasons.append(C.from_sluice(exc).reason)
        if changed:
            await self.gw.sessions.save(session)
        conn.send(K.unsuback(conn.version, pkt.packet_id, reasons))
