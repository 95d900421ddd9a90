"""MQTT over WebSocket (MQTT 5.0 section 6, the same for 3.1.1): an aiohttp server answering the
upgrade on any path with the subprotocol `mqtt` (MQTT.js and paho's websockets transport ask for
it); each binary message's bytes go to the connection as TCP's would, a message may hold part of a
packet or several. TLS (wss) with the proxy's certificate. Text messages close the connection
(the specification requires binary frames)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from common.errors import Unavailable

if TYPE_CHECKING:
    from proxy.mqtt.connection import Connection
    from proxy.mqtt.server import Gateway

MAX_WRITE_QUEUE = 1024  # writes queued for one WebSocket before the connection is dropped


class _WsTransport:
    """What a `Connection` writes to, over one WebSocket: writes queue for one sender task."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._readable = asyncio.Event()
        self._readable.set()
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self._queue.qsize() >= MAX_WRITE_QUEUE:  # a client that stopped reading
            self.close()
            return
        self._queue.put_nowait(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(None)

    def pause_reading(self) -> None:
        self._readable.clear()

    def resume_reading(self) -> None:
        self._readable.set()

    async def readable(self) -> None:
        await self._readable.wait()

    async def sender(self) -> None:
        while True:
            data = await self._queue.get()
            if data is None:
                break
            try:
                await self._ws.send_bytes(data)
            except (ConnectionError, RuntimeError):
                break
        with contextlib.suppress(Exception):
            await self._ws.close()


async def serve_websocket(gateway: Gateway, host: str, port: int, context: ssl.SSLContext | None,
                          reuse_port: bool) -> tuple[web.AppRunner, int]:  # fmt: skip
    """Start the WebSocket listener; (its runner, the port it took)."""
    max_bytes = gateway.svc.config.max_packet_bytes

    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("mqtt", "mqttv3.1"), max_msg_size=max_bytes + 5, heartbeat=None)
        await ws.prepare(request)
        transport = _WsTransport(ws)
        peer = request.remote or ""
        conn: Connection = gateway.accept(transport, peer, websocket=True)
        sender = asyncio.create_task(transport.sender())
        try:
            while not transport.closed:
                await transport.readable()
                msg = await ws.receive()
                if msg.type == WSMsgType.BINARY:
                    conn.feed(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    conn.close(will=True)  # MQTT over WebSocket is binary frames only
                else:
                    break
        finally:
            conn.lost()
            transport.close()
            await sender
        return ws

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context, reuse_port=reuse_port or None)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise Unavailable(f"MQTT over WebSocket cannot listen on {host}:{port}: {exc.strerror or exc} (is the port "
                          "in use? --mqtt-ws-port -1 turns it off)") from None  # fmt: skip
    bound = port
    for server in runner.sites:
        sockets = getattr(getattr(server, "_server", None), "sockets", None)
        if sockets:
            bound = sockets[0].getsockname()[1]
    return runner, int(bound)
