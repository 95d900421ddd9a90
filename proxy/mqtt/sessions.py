"""Opening, taking over, ending and expiring sessions (docs/mqtt.md, "Sessions").

CONNECT: the client is authenticated, its id checked or assigned, and its session record read from
the state store. A clean start drops a stored session first. The record is then written as this
connection's (this proxy as its owner, its epoch raised), compare-and-set against what was read: of
two connections of one client id at once, one wins and the other tries again. A session connected
on this proxy is taken over at once (DISCONNECT 0x8E); one connected on another proxy is taken over
by a kick request written with the record, which that proxy reads within `kick_poll_ms`.

When a connection ends, its session is detached (deliveries stop, what was in flight is made visible
again), its will published (after its Will Delay Interval, unless the session reconnects here first),
and its record marked disconnected; a session with expiry 0 is dropped. Every record write carries
the record's index entries (proxy/mqtt/state.py `record_write`), which the janitor every proxy runs
reads (proxy/mqtt/janitor.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import time
import uuid
from typing import TYPE_CHECKING

from broker.client.api import CallContext
from common.errors import PreconditionFailed, SluiceError
from common.logs import kv
from common.security import validate_namespace
from proxy.mqtt import codes as C
from proxy.mqtt import convert, state
from proxy.mqtt import packets as K
from proxy.mqtt import properties as P
from proxy.mqtt.codes import MqttError
from proxy.mqtt.session import Session
from proxy.mqtt.subscriptions import session_group
from proxy.mqtt.topics import validate_topic

if TYPE_CHECKING:
    from proxy.mqtt.connection import Connection
    from proxy.mqtt.server import Gateway

log = logging.getLogger("sluice.proxy.mqtt")

CAS_ATTEMPTS = 5
Key = tuple[str, str]


def will_to_json(will: K.Will) -> dict[str, object]:
    props = {str(k): v for k, v in will.props.items() if k != P.CORRELATION_DATA}
    if P.CORRELATION_DATA in will.props:
        props[str(P.CORRELATION_DATA)] = base64.b64encode(will.props[P.CORRELATION_DATA]).decode()
    return {"t": will.topic, "p": base64.b64encode(will.payload).decode(), "q": will.qos, "r": will.retain,
            "props": props}  # fmt: skip


def will_from_json(doc: dict[str, object]) -> K.Will:
    raw_props = doc.get("props") or {}
    assert isinstance(raw_props, dict)
    props: P.Props = {}
    for k, v in raw_props.items():
        ident = int(k)
        if ident == P.CORRELATION_DATA:
            props[ident] = base64.b64decode(str(v))
        elif ident == P.USER_PROPERTY:
            props[ident] = [tuple(pair) for pair in v]
        else:
            props[ident] = v
    return K.Will(str(doc["t"]), base64.b64decode(str(doc["p"])), int(str(doc["q"])), bool(doc["r"]), props)


class SessionManager:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.svc = gateway.svc
        self.connections: dict[Key, Connection] = {}  # the live connection of each session here
        self._wills: dict[Key, asyncio.TimerHandle] = {}

    # -- CONNECT ---------------------------------------------------------------------------------

    def _authenticate(self, conn: Connection, pkt: K.Connect) -> tuple[str, str]:
        """(namespace, user): a user `ns/name` is in namespace `ns`; with authentication required,
        the user and password must be a Sluice user's access key and secret."""
        user = pkt.username or ""
        namespace, sep, name = user.partition("/")
        if not sep:
            namespace, name = "", user
        if namespace:
            try:
                validate_namespace(namespace)
            except SluiceError as exc:
                raise MqttError(C.BAD_USERNAME_OR_PASSWORD, exc.message) from None
        if P.AUTH_METHOD in pkt.props:
            raise MqttError(C.BAD_AUTHENTICATION_METHOD, "enhanced authentication (AUTH) is not supported")
        if self.svc.auth_required:
            doc = self.svc.security()
            known = doc.user(name) if doc is not None else None
            password = (pkt.password or b"").decode(errors="replace")
            if known is None or not hmac.compare_digest(known.secret.encode(), password.encode()):
                raise MqttError(C.BAD_USERNAME_OR_PASSWORD, f"user {name!r} is unknown or its password is wrong")
        return namespace, name

    def _client_id(self, pkt: K.Connect) -> tuple[str, bool]:
        """(client id, assigned by the server)."""
        cid = pkt.client_id
        limit = self.svc.config.max_client_id_chars
        if len(cid) > limit:
            raise MqttError(C.CLIENT_ID_NOT_VALID, f"client identifier of {len(cid)} characters; at most {limit}")
        if cid:
            return cid, False
        if pkt.version == K.V311 and not pkt.clean:
            raise MqttError(C.CLIENT_ID_NOT_VALID, "an empty client identifier needs a clean session (MQTT 3.1.1)")
        return f"auto-{uuid.uuid4().hex}", True

    async def connect(self, conn: Connection, pkt: K.Connect) -> None:
        cfg = self.svc.config
        namespace, user = self._authenticate(conn, pkt)
        client_id, assigned = self._client_id(pkt)
        if pkt.will is not None:
            try:
                validate_topic(pkt.will.topic)
                if self.svc.authorize is not None:
                    self.gw.inbound._route(namespace, user, K.Publish(pkt.will.topic, b""))
            except MqttError as exc:
                raise MqttError(exc.reason, f"the will: {exc.message}") from None
        if len(self.connections) >= cfg.max_connections:
            raise MqttError(C.QUOTA_EXCEEDED, f"this proxy serves {cfg.max_connections} MQTT connections at most")
        conn.namespace, conn.client_id, conn.username = namespace, client_id, user
        conn.will = pkt.will
        props = pkt.props
        conn.problem_info = props.get(P.REQUEST_PROBLEM_INFO, 1) == 1
        conn.client_max_packet = props.get(P.MAXIMUM_PACKET_SIZE, 0)
        conn.client_alias_max = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
        window = min(props.get(P.RECEIVE_MAXIMUM, 65_535), cfg.max_inflight)
        back: P.Props = {}
        if pkt.version == K.V5:
            asked = props.get(P.SESSION_EXPIRY, 0)
            expiry = min(asked, cfg.max_session_expiry_s) if asked != state.NEVER else cfg.max_session_expiry_s
            if expiry != asked:
                back[P.SESSION_EXPIRY] = expiry
        else:
            expiry = 0 if pkt.clean else cfg.max_session_expiry_s
        keep = pkt.keep_alive
        if keep == 0 or keep > cfg.max_keep_alive_s:
            keep = cfg.max_keep_alive_s
            if pkt.version == K.V5:
                back[P.SERVER_KEEP_ALIVE] = keep
        conn.keep_alive = keep
        if pkt.version == K.V5:
            back[P.RECEIVE_MAXIMUM] = cfg.receive_maximum
            back[P.MAXIMUM_PACKET_SIZE] = cfg.max_packet_bytes
            if cfg.topic_alias_maximum:
                back[P.TOPIC_ALIAS_MAXIMUM] = cfg.topic_alias_maximum
            if assigned:
                back[P.ASSIGNED_CLIENT_ID] = client_id
        key = (namespace, client_id)
        old = self.connections.get(key)
        if old is not None and old is not conn:  # taken over on this proxy
            old.server_disconnect(C.SESSION_TAKEN_OVER, "another connection took the session over")
            await self.gw.wait_detached(old)
        self._cancel_will(key)
        session, present = await self._open(conn, key, pkt, expiry)
        self.connections[key] = conn
        self.svc.stats.connects += 1
        conn.accepted(session, present, back)
        session.attach(conn, window)
        for sub in list(session.subs):
            if sub.filter.wild_first and not sub.local and not session.registered_in_scope(sub):
                self.svc.spawn(session.register(sub))  # made per bind topic by an earlier version
        log.debug("MQTT session opened", extra=kv(client=client_id, namespace=namespace, present=present))

    async def _open(self, conn: Connection, key: Key, pkt: K.Connect, expiry: int) -> tuple[Session, bool]:
        namespace, client_id = key
        skey = state.session_key(namespace, client_id)
        guess = pkt.clean  # a clean start usually finds no session: tried as one write, read only if not
        for _ in range(CAS_ATTEMPTS):
            raw = None if guess else await self.svc.state.get_one(skey)
            guess = False
            rec = state.SessionRecord.decode(raw) if raw is not None else None
            if rec is not None and pkt.clean:
                await self.drop_stored(namespace, client_id, rec)
                rec = None
                raw = None
            before = state.index_keys(namespace, client_id, rec)
            present = rec is not None
            new = rec or state.SessionRecord(pkt.version, expiry)
            kicks: list[tuple[bytes, bytes]] = []
            if rec is not None and rec.owner and rec.owner != self.svc.proxy_id:
                kicks.append((state.kick_key(rec.owner, namespace, client_id), str(rec.epoch + 1).encode()))
            new.version, new.expiry_s, new.owner, new.gone_ms = pkt.version, expiry, self.svc.proxy_id, 0
            new.epoch += 1
            new.will = will_to_json(pkt.will) if pkt.will is not None else None
            puts, deletes = state.record_write(namespace, client_id, before, new)
            try:
                await self.svc.state.write([*puts, *kicks], deletes, expect=[(skey, raw)])
            except PreconditionFailed:
                continue
            conn.epoch = new.epoch
            session = Session(self.svc, namespace, client_id, new)
            if present:
                await session.load_unfinished()
            return session, present
        raise MqttError(C.SERVER_BUSY, "the session changed under this CONNECT repeatedly; connect again")

    async def save(self, session: Session) -> None:
        """Write the session's subscriptions (and what the brokers hold for them) to its record."""
        rec = session.record
        rec.subs = {text: sub.encode() for text, sub in session.subs.by_text.items()}
        rec.reg = session.registrations()
        await self._update(session.namespace, session.client_id, rec.epoch, lambda r: _copy_subs(r, rec))

    async def _update(self, namespace: str, client_id: str, epoch: int, change: object) -> bool:
        """Apply `change` to the stored record while it is still of `epoch` (compare-and-set)."""
        skey = state.session_key(namespace, client_id)
        for _ in range(CAS_ATTEMPTS):
            raw = await self.svc.state.get_one(skey)
            if raw is None:
                return False
            rec = state.SessionRecord.decode(raw)
            if rec.epoch != epoch:
                return False  # taken over since
            before = state.index_keys(namespace, client_id, rec)
            change(rec)  # type: ignore[operator]
            puts, deletes = state.record_write(namespace, client_id, before, rec)
            try:
                await self.svc.state.write(puts, deletes, expect=[(skey, raw)])
                return True
            except PreconditionFailed:
                continue
        return False

    # -- the end of a connection ------------------------------------------------------------------

    async def closed(self, conn: Connection, *, will: bool, kicked: bool) -> None:
        session = conn.session
        if session is None:
            return
        key = (conn.namespace, conn.client_id)
        if self.connections.get(key) is conn:
            del self.connections[key]
        await session.detach()
        expiry = session.record.expiry_s
        if will and conn.will is not None and not kicked:
            delay = min(conn.will.props.get(P.WILL_DELAY, 0), expiry)
            self._schedule_will(key, conn.will, session.origin, delay, conn.epoch)
        if kicked:
            return
        if self.connections.get(key) is not None:  # taken over on this proxy meanwhile
            return
        if expiry == 0:
            await self.drop_stored(conn.namespace, conn.client_id, session.record, session)
            return

        def gone(rec: state.SessionRecord) -> None:
            rec.owner, rec.gone_ms, rec.will = "", convert.now_ms(), None
            rec.expiry_s = expiry

        await self._update(conn.namespace, conn.client_id, conn.epoch, gone)

    def _schedule_will(self, key: Key, will: K.Will, origin: str, delay_s: int, epoch: int) -> None:
        if delay_s <= 0:
            self.svc.spawn(self.publish_will(key[0], origin, will))
            return
        loop = asyncio.get_running_loop()
        self._cancel_will(key)
        self._wills[key] = loop.call_later(delay_s, self._will_due, key, will, origin, epoch)

    def _will_due(self, key: Key, will: K.Will, origin: str, epoch: int) -> None:
        self._wills.pop(key, None)
        self.svc.spawn(self._delayed_will(key, will, origin, epoch))

    async def _delayed_will(self, key: Key, will: K.Will, origin: str, epoch: int) -> None:
        """A will whose delay passed: published unless the session reconnected meanwhile (through
        any proxy: its record's epoch moved on)."""
        raw = await self.svc.state.get_one(state.session_key(*key))
        if raw is not None and state.SessionRecord.decode(raw).epoch != epoch:
            return
        await self.publish_will(key[0], origin, will)

    def _cancel_will(self, key: Key) -> None:
        handle = self._wills.pop(key, None)
        if handle is not None:
            handle.cancel()

    async def publish_will(self, namespace: str, origin: str, will: K.Will) -> None:
        ctx = CallContext(namespace=namespace, deadline=time.monotonic() + self.svc.config.call_timeout_s)
        await self.gw.inbound.publish_will(namespace, origin, will, ctx)

    # -- dropping a session -----------------------------------------------------------------------

    async def drop_stored(self, namespace: str, client_id: str, rec: state.SessionRecord,
                          session: Session | None = None) -> None:  # fmt: skip
        """Remove a session everywhere: its filters from the brokers, its group, its QoS 2 and
        retained delivery state, its record and the record's index entries (`rec`'s, as stored)."""
        target = session or Session(self.svc, namespace, client_id, rec)
        if target.registrations():  # the brokers hold filters of it (and its group)
            with contextlib.suppress(SluiceError):
                await target.drop()
            group = session_group(namespace, client_id)
            for name in self.svc.directory.broker_names():
                with contextlib.suppress(SluiceError):
                    await self.svc.directory.broker(name).delete_group(group)
        keys: list[bytes] = []
        if session is None or session.had_qos2:  # QoS 2 state it may have left
            for kind in (state.INBOUND, state.OUTBOUND, state.RETAINED_OUT):
                prefix = state.qos2_prefix(kind, namespace, client_id)
                keys += [k for k, _ in await self.svc.state.scan_all(prefix, 70_000)]
        _, deletes = state.record_write(namespace, client_id, state.index_keys(namespace, client_id, rec), None)
        await self.svc.state.write([], [*keys, *deletes])

    # -- kicks ----------------------------------------------------------------------------------

    async def poll_kicks(self) -> None:
        """Close the connections taken over on other proxies (or kicked by an operator)."""
        entries = await self.svc.state.scan(state.kick_prefix(self.svc.proxy_id))
        if not entries:
            return
        for key, value in entries:
            namespace, client_id = state.parse_kick(key, self.svc.proxy_id)
            conn = self.connections.get((namespace, client_id))
            epoch = int(value.decode() or "0")
            if conn is not None and (epoch == 0 or conn.epoch < epoch):
                conn.kicked = epoch != 0  # an operator's kick (0) ends the connection as the server would
                conn.server_disconnect(C.SESSION_TAKEN_OVER if epoch else C.ADMINISTRATIVE_ACTION,
                                       "the session was taken over by another connection" if epoch
                                       else "closed by an operator")  # fmt: skip
                if epoch:
                    self._cancel_will((namespace, client_id))
        await self.svc.state.write([], [k for k, _ in entries])


def _copy_subs(target: state.SessionRecord, source: state.SessionRecord) -> None:
    target.subs, target.reg = source.subs, source.reg
