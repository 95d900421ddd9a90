"""The calls to the MQTT gateway's state on the home broker (proxy/mqtt/state.py: keys and records),
each through a failover of the home broker's group (proxy/core/failover.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from broker.client.api import CallContext
from broker.client.mqttstate import MqttStateApi
from common.errors import Unavailable, Unsupported
from proxy.core.failover import call_through_failover
from proxy.directory import BrokerDirectory

SCAN_PAGE = 1000


class StateStore:
    """The calls to the home broker's MQTT state, each through a failover of its group."""

    def __init__(
        self, directory: BrokerDirectory, call_timeout_s: float, broker_names: Callable[[], list[str]]
    ) -> None:
        self._dir = directory
        self._timeout_s = call_timeout_s
        self._names = broker_names

    def _home(self) -> str:
        names = self._names()
        if not names:
            raise Unavailable("no broker is known yet to hold the MQTT state")
        return min(names)

    async def _call(self, fn: Callable[[MqttStateApi], Any]) -> Any:
        home = self._home()
        ctx = CallContext(deadline=time.monotonic() + self._timeout_s)

        async def call(api: object) -> Any:
            if not isinstance(api, MqttStateApi):
                raise Unsupported(f"broker {home} keeps no MQTT state")
            return await fn(api)

        return await call_through_failover(self._dir, home, cast(Any, call), ctx)

    async def get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return cast(list[bytes | None], await self._call(lambda api: api.mqtt_get(keys)))

    async def get_one(self, key: bytes) -> bytes | None:
        return (await self.get([key]))[0]

    async def write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes] = (),
                    expect: Sequence[tuple[bytes, bytes | None]] = ()) -> None:  # fmt: skip
        await self._call(lambda api: api.mqtt_write(puts, deletes, expect))

    async def scan(self, prefix: bytes, after: bytes = b"", limit: int = SCAN_PAGE) -> list[tuple[bytes, bytes]]:
        return cast(list[tuple[bytes, bytes]], await self._call(lambda api: api.mqtt_scan(prefix, after, limit)))

    async def scan_all(self, prefix: bytes, most: int) -> list[tuple[bytes, bytes]]:
        """Every entry under `prefix`, at most `most`, page by page."""
        out: list[tuple[bytes, bytes]] = []
        after = b""
        while len(out) < most:
            page = await self.scan(prefix, after, min(SCAN_PAGE, most - len(out)))
            if not page:  # a short page may only mean a byte limit: the end is an empty one
                break
            out.extend(page)
            after = page[-1][0]
        return out
