"""The MQTT gateway's sweep of connections (proxy/mqtt/server.py): a connection that sent no
CONNECT within `connect_timeout_s` is closed; one whose CONNECT is still being answered (the state
store slow under a connection storm) is not."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from proxy.config import MqttConfig, TlsConfig
from proxy.mqtt.server import Gateway

CONNECT = bytes.fromhex("100f00044d5154540402003c0003616263")  # 3.1.1, clean, keep alive 60, id "abc"


class Transport:
    def __init__(self) -> None:
        self.closed = False
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


def test_the_connect_timeout_spares_a_connect_being_answered() -> None:
    async def run() -> None:
        gw = Gateway(MqttConfig(port=0, connect_timeout_s=10.0), directory=cast(Any, None), broker_names=list,
                     send=cast(Any, None), security=lambda: None, auth_required=False, authorize=None,
                     advertised="127.0.0.1:1", tls=TlsConfig(), max_lite_chars=64)  # fmt: skip
        answered = asyncio.Event()

        async def slow_connect(conn: Any, pkt: Any) -> None:
            await answered.wait()  # the state store has not answered yet

        gw.sessions.connect = slow_connect  # type: ignore[method-assign]
        silent_t, slow_t = Transport(), Transport()
        silent = gw.accept(silent_t, "peer:1", websocket=False)
        slow = gw.accept(slow_t, "peer:2", websocket=False)
        slow.feed(CONNECT)
        await asyncio.sleep(0)
        for conn in (silent, slow):
            conn.opened -= 11.0  # both opened longer ago than the timeout
        gw._sweep()
        assert silent_t.closed and silent.closed
        assert not slow_t.closed and not slow.closed
        answered.set()
        for task in list(gw.svc.tasks):
            task.cancel()

    asyncio.run(run())
