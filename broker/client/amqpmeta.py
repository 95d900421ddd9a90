"""Where the AMQP gateway's metadata document is kept: one broker's `amqp_meta` column family
(broker/amqp_meta_store.py), reached in process (`LocalBroker`) or over the internal service
(`RemoteBroker`). Both implement this protocol."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class AmqpMetaApi(Protocol):
    async def get_amqp_meta(self, newer_than: int = 0) -> tuple[int, bytes]:
        """(version, document); (0, b"") when none was ever stored, an empty document when the
        version held is not above `newer_than`."""
        ...

    async def put_amqp_meta(self, version: int, data: bytes) -> None:
        """Store `data` as `version`; PreconditionFailed unless it is the version held plus one."""
        ...
