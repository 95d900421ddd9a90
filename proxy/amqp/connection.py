"""One AMQP connection: the handshake (start, tune, open), heartbeats, the frame loop that hands
frames to channels, and the closes with RabbitMQ's reply codes.

A channel error closes that channel (`channel.close`; its frames are then dropped until the
client's close-ok); a connection error sends `connection.close`, waits briefly for close-ok and
closes the socket. Either way the channels' unacked deliveries go back to their queues and the
connection's exclusive queues are deleted. Nothing a client sends raises out of `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, TypeVar

from pamqp import base, commands

from common.errors import SluiceError
from common.logs import kv
from common.version import sluice_version
from proxy.amqp import access, auth
from proxy.amqp.access import Permissions
from proxy.amqp.channel import Channel, close_method
from proxy.amqp.codes import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    FRAME_ERROR,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    AmqpError,
    reply_text,
)
from proxy.amqp.frames import (
    BODY,
    HEADER,
    HEARTBEAT,
    HEARTBEAT_BYTES,
    METHOD,
    PROTOCOL_HEADER,
    Frame,
    FrameReader,
    decode_method,
    method_bytes,
    read_frame,
)
from proxy.amqp.meta import DEFAULT_VHOST

if TYPE_CHECKING:
    from proxy.amqp.server import Gateway

log = logging.getLogger("sluice.proxy.amqp")
M = TypeVar("M", bound=base.Frame)

_CLOSE_WAIT_S = 1.0  # after our connection.close: how long to wait for the client's close-ok
_WRITE_BUFFER_BYTES = 1 << 20  # drain the socket when more than this waits to be sent
_HANDSHAKE_FRAME_MAX = 131_072  # start-ok (client properties) before frame_max is negotiated


def server_properties() -> dict[str, object]:
    implemented = ("publisher_confirms", "basic.nack", "consumer_cancel_notify", "per_consumer_qos",
                   "authentication_failure_close", "connection.blocked", "exchange_exchange_bindings")  # fmt: skip
    capabilities = dict.fromkeys(implemented, True)
    return {
        "product": "Sluice", "version": sluice_version(), "platform": "Python",
        "information": "AMQP 0-9-1 gateway of Sluice (docs/amqp.md)", "capabilities": capabilities,
    }  # fmt: skip


class Connection:
    def __init__(self, gw: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cid: str) -> None:
        self.gw = gw
        self.id = cid
        self._reader = reader
        self._writer = writer
        peer = writer.get_extra_info("peername") or ("", 0)
        self.peer_host = str(peer[0])
        self.peer = f"{peer[0]}:{peer[1]}"
        self.vhost = "/"
        self.user = ""
        self.perms = Permissions(None, "", "/")  # set at connection.open
        self.client = ("", "")  # (product, version) from the client's properties
        self.opened_ms = int(time.time() * 1000)
        self.frame_max = gw.config.frame_max_bytes
        self.channel_max = gw.config.channel_max
        self.heartbeat_s = 0
        self.cancel_notify = False
        self.channels: dict[int, Channel] = {}
        self._retired: list[Channel] = []
        self.exclusive: set[str] = set()
        self._closed = False
        self.blocked_notify = False  # the client asked for connection.blocked / unblocked
        self._publish_bytes = 0  # bodies received on this connection, not yet stored
        self._released = asyncio.Event()  # set when stores released some of them
        self._failed: asyncio.Future[AmqpError] = asyncio.get_running_loop().create_future()  # `fail`
        self._last_read = self._last_write = time.monotonic()
        self._out: list[bytes | bytearray] = []  # queued by send_raw, written once per event-loop turn

    # -- writing --------------------------------------------------------------------------------

    def send_method(self, channel: int, method: base.Frame) -> None:
        self.send_raw(method_bytes(channel, method))

    def send_raw(self, data: bytes | bytearray) -> None:
        """Queue `data` for the socket: what a turn of the event loop sends (confirms, deliveries,
        replies of every channel) goes out in one write, after the turn (`_write_out`)."""
        if self._closed:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._write_out)
        self._out.append(data)

    def _write_out(self) -> None:
        """Write what `send_raw` queued, as one write (one system call instead of one per frame)."""
        if not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        if self._closed or self._writer.is_closing():
            return
        self._writer.write(data)
        self._last_write = time.monotonic()

    async def flush(self) -> None:
        self._write_out()
        transport = self._writer.transport
        if transport.get_write_buffer_size() > _WRITE_BUFFER_BYTES and not self._writer.is_closing():
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()

    async def admit(self, size: int) -> None:
        """Count a received body until it is stored. While the bodies in flight and this one
        would pass `max_connection_publish_bytes`, the connection is not read (and a client that
        asked is told with connection.blocked) until stores make room; a body larger than the
        bound on its own waits only until nothing else is in flight (it is already received)."""
        bound = self.gw.config.max_connection_publish_bytes
        if self._publish_bytes and self._publish_bytes + size > bound:
            if self.blocked_notify:  # written at once: this connection is not read until it is unblocked
                self.send_method(0, commands.Connection.Blocked(reason="publishes in flight over the proxy's bound"))
                self._write_out()
            while self._publish_bytes and self._publish_bytes + size > bound:
                self._released.clear()
                await self._released.wait()
            if self.blocked_notify:
                self.send_method(0, commands.Connection.Unblocked())
                self._write_out()
        self._publish_bytes += size

    def release(self, size: int) -> None:
        self._publish_bytes -= size
        self._released.set()

    # -- the connection's life ----------------------------------------------------------------------

    async def serve(self) -> None:
        beats: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(self.gw.config.handshake_timeout_s):
                opened = await self._handshake()
            if opened:
                beats = asyncio.create_task(self._heartbeats(), name=f"amqp-{self.id}-heartbeat")
                leases = asyncio.create_task(self._leases(), name=f"amqp-{self.id}-leases")
                try:
                    await self._frames_until_failed()
                finally:
                    leases.cancel()
        except AmqpError as err:
            await self._close_with(err)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the client went away (or never finished the handshake)
        except Exception:  # a bug: this connection ends, the server keeps serving
            log.exception("AMQP connection failed", extra=kv(connection=self.id, peer=self.peer))
            with contextlib.suppress(Exception):
                await self._close_with(AmqpError(INTERNAL_ERROR, "internal error; see the proxy's log"))
        finally:
            if beats is not None:
                beats.cancel()
            await self._teardown()

    async def _handshake(self) -> bool:
        header = await self._reader.readexactly(len(PROTOCOL_HEADER))
        if header != PROTOCOL_HEADER:  # the spec's answer: the protocol we speak, then close
            self.send_raw(PROTOCOL_HEADER)
            return False
        self.send_method(0, commands.Connection.Start(server_properties=server_properties(),  # type: ignore[arg-type]
                                                      mechanisms=auth.MECHANISMS, locales="en_US"))  # fmt: skip
        start_ok = await self._expect(commands.Connection.StartOk)
        caps = (start_ok.client_properties or {}).get("capabilities") or {}
        told = start_ok.client_properties or {}
        self.client = (_text(told.get("product")), _text(told.get("version")))
        self.cancel_notify = isinstance(caps, dict) and bool(caps.get("consumer_cancel_notify"))
        self.blocked_notify = isinstance(caps, dict) and bool(caps.get("connection.blocked"))
        if start_ok.mechanism not in auth.MECHANISMS.split():
            raise AmqpError(ACCESS_REFUSED, f"unsupported authentication mechanism {start_ok.mechanism!r}")
        response = start_ok.response.encode("latin-1") if isinstance(start_ok.response, str) else start_ok.response
        creds = auth.credentials(start_ok.mechanism, bytes(response or b""))
        if creds is None or not auth.allowed(creds[0], creds[1], self.peer_host, self.gw.security(),
                                             guest=not self.gw.auth_required):  # fmt: skip
            who = creds[0] if creds else "?"
            log.warning("AMQP login refused", extra=kv(user=who, peer=self.peer, mechanism=start_ok.mechanism))
            raise AmqpError(ACCESS_REFUSED, f"Login was refused using authentication mechanism {start_ok.mechanism}."
                            " For details see the broker logfile.")  # fmt: skip
        self.user = creds[0]
        cfg = self.gw.config
        self.send_method(0, commands.Connection.Tune(channel_max=cfg.channel_max, frame_max=cfg.frame_max_bytes,
                                                     heartbeat=cfg.heartbeat_s))  # fmt: skip
        tune_ok = await self._expect(commands.Connection.TuneOk)
        if tune_ok.frame_max and tune_ok.frame_max < 4096:
            raise AmqpError(NOT_ALLOWED, f"frame_max={tune_ok.frame_max} < 4096 min size")
        self.frame_max = min(tune_ok.frame_max or cfg.frame_max_bytes, cfg.frame_max_bytes)
        self.channel_max = min(tune_ok.channel_max or cfg.channel_max, cfg.channel_max)
        self.heartbeat_s = tune_ok.heartbeat
        opened = await self._expect(commands.Connection.Open)
        vhost = opened.virtual_host or DEFAULT_VHOST
        access.namespace(vhost)  # 530 when the vhost names no namespace
        if self.gw.auth_required and not access.may_use_vhost(self.gw.security(), self.user, vhost):
            raise AmqpError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{self.user}'",
                            (10, 40))  # fmt: skip
        self.vhost = vhost
        self.perms = Permissions(self.gw.authorize if self.gw.auth_required else None, self.user, vhost)
        self.send_method(0, commands.Connection.OpenOk())
        log.info("AMQP connection opened", extra=kv(connection=self.id, peer=self.peer, user=self.user,
                                                    vhost=self.vhost))  # fmt: skip
        return True

    async def _expect(self, kind: type[M]) -> M:
        frame = await read_frame(self._reader, max(self.frame_max, _HANDSHAKE_FRAME_MAX))
        if frame.type != METHOD or frame.channel != 0:
            raise AmqpError(UNEXPECTED_FRAME, f"expected {kind.name} on channel 0")
        method = decode_method(frame.payload)
        if not isinstance(method, kind):
            raise AmqpError(COMMAND_INVALID, f"expected {kind.name}, got {method.name}")
        return method

    async def _heartbeats(self) -> None:
        """Send a heartbeat when nothing else was sent for half the interval; close the socket
        when nothing arrived for two intervals (RabbitMQ's rule)."""
        if not self.heartbeat_s:
            return
        while True:
            await asyncio.sleep(self.heartbeat_s / 2)
            now = time.monotonic()
            if now - self._last_read > 2 * self.heartbeat_s:
                log.warning("AMQP client missed heartbeats; closing", extra=kv(connection=self.id, peer=self.peer))
                self._writer.transport.abort()
                return
            if now - self._last_write >= self.heartbeat_s / 2:
                self.send_raw(HEARTBEAT_BYTES)

    async def _leases(self) -> None:
        """Every third of the delivery lease: renew the unacknowledged deliveries' leases, and close
        with 406 a channel whose oldest delivery waited longer than the consumer timeout."""
        cfg = self.gw.config
        while True:
            await asyncio.sleep(cfg.delivery_lease_ms / 3000)
            try:
                await self._renew_all()
            except Exception:  # a bug: leases lapse (messages are redelivered), the connection goes on
                log.exception("renewing AMQP delivery leases failed", extra=kv(connection=self.id))

    async def _renew_all(self) -> None:
        cfg = self.gw.config
        for ch in list(self.channels.values()):
            if ch.closing:
                continue
            if ch.overdue(cfg.consumer_timeout_ms / 1000):
                detail = (f"delivery acknowledgement on channel {ch.number} timed out. Timeout value used: "
                          f"{cfg.consumer_timeout_ms} ms")  # fmt: skip
                await self.fail_channel(ch, AmqpError(PRECONDITION_FAILED, detail))
                continue
            for queue, handles in ch.held().values():
                try:
                    lost = await self.gw.store.renew(queue, handles)
                except SluiceError as exc:
                    log.warning("could not renew AMQP delivery leases", extra=kv(queue=queue.name,
                                                                                 error=exc.message))  # fmt: skip
                    continue
                if lost:
                    log.debug("AMQP deliveries settled before their renewal", extra=kv(count=len(lost)))

    def fail(self, err: AmqpError) -> None:
        """A connection error found off the frame loop (a channel's publisher): `serve` stops
        reading frames and closes the connection with it, as it does for one a frame caused."""
        if not self._failed.done():
            self._failed.set_result(err)

    async def _frames_until_failed(self) -> None:
        """`_frames`, until it ends (a close, or what it raises) or `fail` is called."""
        frames = asyncio.ensure_future(self._frames())
        try:
            done, _ = await asyncio.wait((frames, self._failed), return_when=asyncio.FIRST_COMPLETED)
            if frames in done:
                await frames
                return
        finally:
            if not frames.done():
                frames.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await frames
        raise self._failed.result()

    async def _frames(self) -> None:
        frames = FrameReader(self._reader)
        while True:
            frame = await frames.next(self.frame_max)
            self._last_read = time.monotonic()
            if frame.type == HEARTBEAT:
                if frame.channel != 0:
                    raise AmqpError(FRAME_ERROR, f"heartbeat on channel {frame.channel}")
                continue
            if frame.type not in (METHOD, HEADER, BODY):
                raise AmqpError(FRAME_ERROR, f"unknown frame type {frame.type}")
            if frame.channel == 0:
                if await self._connection_method(frame):
                    return
                continue
            await self._channel_frame(frame)

    async def _connection_method(self, frame: Frame) -> bool:
        """A frame on channel 0; True when the connection is closed."""
        if frame.type != METHOD:
            raise AmqpError(UNEXPECTED_FRAME, f"content frame (type {frame.type}) on channel 0")
        method = decode_method(frame.payload)
        if isinstance(method, commands.Connection.Close):
            await self._close_channels()
            self.send_method(0, commands.Connection.CloseOk())
            await self.flush()
            return True
        # A close-ok answers a close this server sent (`_close`, which reads it there); unsolicited it is
        # a command the open connection does not allow (503), as RabbitMQ answers it, not a quiet end.
        if isinstance(method, commands.Connection.Blocked | commands.Connection.Unblocked):
            return False
        if isinstance(method, commands.Connection.UpdateSecret):
            self._update_secret(method)
            return False
        raise AmqpError(COMMAND_INVALID, f"{method.name} is not allowed on an open connection",
                        (method.index >> 16, method.index & 0xFFFF))  # fmt: skip

    def _update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        """A new secret for the connection's user (RabbitMQ 3.8+: how OAuth2 clients refresh their
        token), checked as connection.start-ok's password is; a refused one closes the connection
        with 530 NOT_ALLOWED, as RabbitMQ answers a secret its backends refuse."""
        secret = method.new_secret
        text = secret.decode("utf-8", errors="replace") if isinstance(secret, bytes) else secret or ""
        if not auth.allowed(self.user, text, self.peer_host, self.gw.security(), guest=not self.gw.auth_required):
            log.warning("AMQP secret update refused", extra=kv(connection=self.id, user=self.user, peer=self.peer))
            raise AmqpError(NOT_ALLOWED, f"the new secret of user '{self.user}' was refused", (10, 70))
        log.info("AMQP secret updated", extra=kv(connection=self.id, user=self.user, reason=method.reason or ""))
        self.send_method(0, commands.Connection.UpdateSecretOk())

    async def _channel_frame(self, frame: Frame) -> None:
        ch = self.channels.get(frame.channel)
        if ch is None:
            method = decode_method(frame.payload) if frame.type == METHOD else None
            if isinstance(method, commands.Channel.Open):
                if frame.channel > self.channel_max:
                    raise AmqpError(NOT_ALLOWED, f"channel {frame.channel} is over channel_max {self.channel_max}")
                self.channels[frame.channel] = Channel(self, frame.channel)
                self.send_method(frame.channel, commands.Channel.OpenOk())
                return
            raise AmqpError(CHANNEL_ERROR, f"expected 'channel.open' on channel {frame.channel}")
        if ch.closing:  # we closed it: only its close-ok (or the client's own close) counts
            method = decode_method(frame.payload) if frame.type == METHOD else None
            if isinstance(method, commands.Channel.Close):
                self.send_method(frame.channel, commands.Channel.CloseOk())
            if isinstance(method, commands.Channel.Close | commands.Channel.CloseOk):
                self.forget_channel(frame.channel)
            return
        try:
            await ch.handle(frame)
        except AmqpError as err:
            if err.hard:
                raise
            await self.fail_channel(ch, err)

    async def fail_channel(self, ch: Channel, err: AmqpError) -> None:
        """Close a channel for a channel error: channel.close to the client, its unacked requeued."""
        if ch.closing:
            return
        log.info("AMQP channel error", extra=kv(connection=self.id, channel=ch.number, reply=err.text))
        ch.closing = True
        self.send_method(ch.number, close_method(err))
        await ch.close()

    def forget_channel(self, number: int) -> None:
        ch = self.channels.pop(number, None)
        if ch is not None:
            self._retired.append(ch)
            self._retired = [c for c in self._retired if c.busy]

    def queue_deleted(self, vhost: str, name: str) -> None:
        self.exclusive.discard(name)
        for ch in self.channels.values():
            ch.queue_deleted(vhost, name)

    def abort(self) -> None:
        """Drop the socket at once (a bug was met); `serve` then tears the connection down."""
        self._writer.transport.abort()

    def shut_down(self) -> None:
        """The server stops: tell the client (320) and close the socket; `serve` then tears down."""
        text = reply_text(CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'")
        try:
            self.send_method(0, commands.Connection.Close(reply_code=CONNECTION_FORCED, reply_text=text, class_id=0,
                                                          method_id=0))  # fmt: skip
        finally:
            self._write_out()
            self._writer.close()

    # -- closing ----------------------------------------------------------------------------------

    async def _close_with(self, err: AmqpError) -> None:
        log.info("AMQP connection error", extra=kv(connection=self.id, peer=self.peer, reply=err.text))
        self.send_method(0, commands.Connection.Close(reply_code=err.code, reply_text=err.text,
                                                      class_id=err.method[0], method_id=err.method[1]))  # fmt: skip
        await self.flush()
        # Drop what arrives until the client's close-ok (or EOF, or a short wait) as raw bytes: after
        # a framing error the stream cannot be parsed, and closing with unread bytes would reset the
        # connection before the client read our close.
        close_ok = method_bytes(0, commands.Connection.CloseOk())
        window = b""
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(_CLOSE_WAIT_S):
                while chunk := await self._reader.read(65536):
                    window = (window + chunk)[-(len(chunk) + len(close_ok)) :]
                    if close_ok in window:
                        return

    async def _close_channels(self) -> None:
        for ch in list(self.channels.values()):
            await ch.close()

    async def _teardown(self) -> None:
        try:
            await self._close_channels()
            everything = [*self.channels.values(), *self._retired]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * self.gw.config.call_timeout_s):
                    await asyncio.gather(*(ch.wait_closed() for ch in everything))
            await self._drop_exclusive()
        finally:
            self._write_out()
            self._closed = True
            self.channels.clear()
            self._writer.close()
            self.gw.connection_gone(self)
            log.info("AMQP connection closed", extra=kv(connection=self.id, peer=self.peer))

    async def _drop_exclusive(self) -> None:
        for name in list(self.exclusive):
            queue = self.gw.meta.doc.vhost(self.vhost).queues.get(name)
            if queue is None or queue.exclusive_owner != self.id:
                continue
            try:
                await self.gw.delete_queue(self.vhost, queue, self.id)
            except (SluiceError, AmqpError) as exc:
                log.warning("could not delete an exclusive queue of a closed connection",
                            extra=kv(queue=name, error=str(exc)))  # fmt: skip


def _text(value: object) -> str:
    """A client property as text (clients send strings or bytes; anything else is left out)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")[:100]
    return value[:100] if isinstance(value, str) else ""
