"""Where the MQTT gateway's durable state is kept: one broker's `mqtt` column family
(broker/mqtt_store.py), reached in process (`LocalBroker`) or over the internal service
(`RemoteBroker`). Both implement this protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class MqttStateApi(Protocol):
    async def mqtt_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value of each key, None where there is none."""
        ...

    async def mqtt_write(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes] = (),
                         expect: Sequence[tuple[bytes, bytes | None]] = ()) -> None:  # fmt: skip
        """Put and delete in one atomic write, answered once stored (and replicated); when a key of
        `expect` does not hold its value (None: absent), PreconditionFailed and nothing changes."""
        ...

    async def mqtt_scan(self, prefix: bytes, after: bytes = b"", limit: int = 1000) -> list[tuple[bytes, bytes]]:
        """(key, value) pairs under `prefix` in key order, after `after`, one page (at most `limit`)."""
        ...
