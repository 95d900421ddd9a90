"""A TCP fault proxy for partition tests: forwards one listening port to a target, and can be
switched at any moment to cut the path in one of two ways.

- `FORWARD`: bytes flow both ways (the default).
- `BLACKHOLE`: nothing flows, and nothing is closed: bytes already read are held, reading stops,
  so the senders' socket buffers fill and their writes stall; a new connection is accepted but
  not connected onward. This is a network partition that drops packets: TCP neither delivers nor
  fails. Switching back to `FORWARD` delivers what was held, in order, on the same connections
  (TCP's retransmission after a partition heals).
- `CLOSE`: every open connection is reset (RST) and every new one is reset at once: the peer is
  unreachable and says so.

The proxy runs its own event loop on a daemon thread, so synchronous tests (the official client's)
drive it; `set_mode` returns once the switch is in effect. Stdlib only, binds loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import threading
from types import TracebackType

LOOPBACK = "127.0.0.1"
CHUNK_BYTES = 64 * 1024
CALL_TIMEOUT_S = 10.0


class Mode(enum.Enum):
    FORWARD = "forward"
    BLACKHOLE = "blackhole"
    CLOSE = "close"


class FaultProxy:
    def __init__(self, target: str, *, host: str = LOOPBACK) -> None:
        target_host, _, target_port = target.rpartition(":")
        self._target = (target_host, int(target_port))
        self._host = host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fault-proxy-{target}", daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()  # set while FORWARD (touched on the proxy's loop only)
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.mode = Mode.FORWARD
        self.port = 0
        self.connections = 0  # accepted so far

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def set_mode(self, mode: Mode) -> None:
        self._call(self._set_mode(mode))

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    # -- on the proxy's loop -----------------------------------------------------------------------

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self._host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode is Mode.FORWARD:
            self._flowing.set()
            return
        self._flowing.clear()
        if mode is Mode.CLOSE:
            for writer in list(self._writers):
                _reset(writer)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._set_mode(Mode.CLOSE)
        self._flowing.set()  # held chunks and blackholed connections wake up, see CLOSE and end
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), CALL_TIMEOUT_S)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.mode is Mode.CLOSE:
                return
            await self._flowing.wait()  # a blackhole connects nowhere until it heals
            if self.mode is Mode.CLOSE:
                return
            up_reader, upstream = await asyncio.open_connection(*self._target)
            self._writers.add(upstream)
            await asyncio.gather(self._pump(reader, upstream), self._pump(up_reader, writer))
        except OSError:
            pass
        finally:
            for end in (writer, upstream):
                if end is not None:
                    self._writers.discard(end)
                    if not end.is_closing():
                        _reset(end)
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction; a chunk read while blackholed is held until the path heals. When
        this direction ends (EOF, or a reset), the other side is closed too, so its pump ends."""
        with contextlib.suppress(OSError):
            while chunk := await reader.read(CHUNK_BYTES):
                await self._flowing.wait()
                if writer.is_closing():
                    break
                writer.write(chunk)
                await writer.drain()
        if not writer.is_closing():
            writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close at once with a RST, as a lost peer does, not with an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None and not writer.is_closing():
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
