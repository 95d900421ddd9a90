"""Orphan transaction check-back, proxy side: which producers are connected here, and the poll loop.

The broker cannot call clients. Each proxy knows the Telemetry streams of the producers connected
to it and the topics each publishes (from their Settings, and from the topics they send to), asks
every broker for due check-backs of those topics (`BrokerApi.claim_transaction_checks`), and pushes
each onto one such stream, rotating among the streams of a topic. The producer answers with
EndTransaction (source SERVER_CHECK), which any proxy routes by the transaction id.

A check the broker handed out counts as made even if no stream took it (the stream's queue was
full, or it just closed): the broker hands it out again one check interval later, up to its
maximum number of checks. Protocol-free: the edge registers a `deliver` callback per stream that
converts and enqueues the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.client.api import TransactionCheck
from common.errors import SluiceError
from common.logs import kv
from proxy.config import TransactionCheckConfig
from proxy.directory import BrokerDirectory

log = logging.getLogger("sluice.proxy.checkback")

# deliver(check, namespace) -> whether the stream accepted it
Deliver = Callable[[TransactionCheck, str], bool]
MAX_TOPICS_PER_STREAM = 1_024


@dataclass
class ProducerStream:
    client_id: str
    deliver: Deliver
    topics: dict[str, str] = field(default_factory=dict)  # cluster-wide topic -> the client's namespace


class CheckBackRegistry:
    """Telemetry streams of producers connected to this proxy, by topic. Event loop only."""

    def __init__(self) -> None:
        self._streams: dict[int, ProducerStream] = {}
        self._by_client: dict[str, set[int]] = {}
        self._turn = itertools.count()

    def register(self, stream_id: int, client_id: str, topics: dict[str, str], deliver: Deliver) -> None:
        """A producer's stream (again, on every Settings): its topics are added to what it had."""
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._streams[stream_id] = ProducerStream(client_id, deliver)
            self._by_client.setdefault(client_id, set()).add(stream_id)
        for topic, namespace in topics.items():
            if len(stream.topics) < MAX_TOPICS_PER_STREAM:
                stream.topics[topic] = namespace

    def unregister(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            ids = self._by_client.get(stream.client_id, set())
            ids.discard(stream_id)
            if not ids:
                self._by_client.pop(stream.client_id, None)

    def note_sent(self, client_id: str, topic: str, namespace: str) -> None:
        """A client sent to `topic`: its producer streams here can answer checks of that topic too."""
        for sid in self._by_client.get(client_id, ()):
            stream = self._streams[sid]
            if topic not in stream.topics and len(stream.topics) < MAX_TOPICS_PER_STREAM:
                stream.topics[topic] = namespace

    def forget_client(self, client_id: str) -> None:
        for sid in list(self._by_client.get(client_id, ())):
            self.unregister(sid)

    def topics(self) -> list[str]:
        return sorted({t for s in self._streams.values() for t in s.topics})

    def deliver(self, check: TransactionCheck) -> bool:
        """Push `check` onto one stream publishing its topic, trying each once, rotating the start."""
        candidates = [s for s in self._streams.values() if check.message.topic in s.topics]
        if not candidates:
            return False
        start = next(self._turn) % len(candidates)
        for stream in candidates[start:] + candidates[:start]:
            if stream.deliver(check, stream.topics[check.message.topic]):
                return True
        return False


class OrphanChecker:
    def __init__(self, directory: BrokerDirectory, registry: CheckBackRegistry, config: TransactionCheckConfig) -> None:
        self._dir = directory
        self._registry = registry
        self._config = config

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._config.poll_interval_ms / 1000.0)
            if stop.is_set():
                return
            try:
                await self.poll_once()
            except Exception:
                log.exception("transaction check-back poll failed")

    async def poll_once(self) -> int:
        """Ask every broker once (concurrently: one that is down must not delay the others) for due
        checks of the producers' topics; returns the checks delivered."""
        topics = self._registry.topics()
        if not topics:
            return 0
        names = self._dir.broker_names()
        claims = await asyncio.gather(*(self._claim(name, topics) for name in names))
        delivered = 0
        for check in (c for checks in claims for c in checks):
            fields = kv(transaction_id=check.transaction_id, topic=check.message.topic,
                        message_id=check.message.message_id, check=check.check)  # fmt: skip
            if self._registry.deliver(check):
                delivered += 1
                log.info("transaction check-back sent", extra=fields)
            else:
                log.warning("transaction check-back not delivered; the broker repeats it later", extra=fields)
        return delivered

    async def _claim(self, broker: str, topics: list[str]) -> list[TransactionCheck]:
        try:
            return await self._dir.broker(broker).claim_transaction_checks(topics, self._config.max_checks_per_poll)
        except SluiceError as exc:
            log.warning(
                "could not ask a broker for transaction check-backs", extra=kv(broker=broker, error=exc.message)
            )
            return []
