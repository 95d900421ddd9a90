"""What the MQTT gateway's connections and sessions share: configuration, the brokers, the state
store, the topic mapping, the producer, access checks, counters, and the owner of their tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.client.api import CallContext
from common.errors import SluiceError
from common.security import Action, ResourceKind, SecurityDoc
from proxy.config import MqttConfig
from proxy.directory import BrokerDirectory
from proxy.mqtt.binds import BindTopics
from proxy.mqtt.statestore import StateStore
from proxy.mqtt.topics import TopicMap
from proxy.names import wrap

log = logging.getLogger("sluice.proxy.mqtt")


class Send(Protocol):
    """The proxy's producer (proxy/core/producer.py `ProducerService.send`)."""

    def __call__(
        self, ctx: CallContext, items: list[tuple[str, bytes]], lite_topics: Sequence[str | None] | None = None
    ) -> Awaitable[list[Any]]: ...


Authorize = Callable[[str, str, ResourceKind, str, Action], None]  # raises Forbidden


@dataclass
class Stats:
    """This proxy's MQTT counters ($SYS topics, metrics)."""

    messages_received: int = 0
    messages_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    publish_dropped: int = 0
    connects: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # refused input, by reason name

    def received(self, payload: int) -> None:
        self.messages_received += 1
        self.bytes_received += payload

    def sent(self, payload: int) -> None:
        self.messages_sent += 1
        self.bytes_sent += payload

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


@dataclass
class Services:
    config: MqttConfig
    directory: BrokerDirectory
    state: StateStore
    topics: TopicMap
    binds: BindTopics
    send: Send
    proxy_id: str
    host: str  # the proxy's advertised address (born host of what MQTT clients publish)
    security: Callable[[], SecurityDoc | None]
    auth_required: bool
    authorize: Authorize | None
    stats: Stats = field(default_factory=Stats)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task the gateway owns (cancelled at its stop); its failure is logged, never lost."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, SluiceError):
            log.warning("MQTT background call failed", extra={"error": exc.message})
        elif exc is not None:
            log.error("MQTT background task failed", exc_info=exc)

    @staticmethod
    def wrap(namespace: str, name: str) -> str:
        return wrap(namespace, name)
