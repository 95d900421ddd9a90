"""One operations endpoint for a process and its workers: their metrics merged, with a label.

A parent that runs workers (`sluice up`, `sluice proxy --workers N`) serves the Prometheus metrics
of all of them on its own port: its own families as they are, and every worker's samples with the
label `worker="<index>"` added. A family present in several processes is written once (one HELP
and TYPE line, as the exposition format requires), so `sum by (rpc) (...)` over the endpoint
counts every worker. The workers' texts are parsed with prometheus-client's own parser.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

WORKER_LABEL = "worker"
SCRAPE_TIMEOUT_S = 2.0


class Children(Protocol):
    """What the endpoint needs of a parent's workers (processes.workerpool.WorkerPool)."""

    def endpoints(self) -> list[tuple[int, str]]:
        """(worker index, host:port of its operations endpoint)."""
        ...

    def ready(self) -> bool: ...

    @property
    def label(self) -> str:
        """The label that tells the children's samples apart (`worker`, `shard`)."""
        ...


class _Families:
    """A collector that yields a fixed list of families (for `generate_latest`)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(own: Iterable[Metric], children: Sequence[tuple[int, str]], label: str = WORKER_LABEL) -> bytes:
    """The exposition of `own` families plus every child's text (`(index, text)`), each child's
    samples labelled `label` with its index."""
    families: dict[str, Metric] = {}
    for family in own:
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        copy.samples = list(family.samples)
        families[family.name] = copy
    for index, text in children:
        worker = str(index)
        for family in text_string_to_metric_families(text):
            target = families.get(family.name)
            if target is None:
                target = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            target.samples.extend(s._replace(labels={**s.labels, label: worker}) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families.values()))
    return generate_latest(registry)


async def scrape(children: Children) -> list[tuple[int, str]]:
    """Every child's /metrics text; a child that does not answer is left out (its restart shows)."""
    endpoints = children.endpoints()
    if not endpoints:
        return []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as http:

        async def one(index: int, address: str) -> tuple[int, str] | None:
            try:
                async with http.get(f"http://{address}/metrics") as response:
                    return (index, await response.text()) if response.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                return None

        got = await asyncio.gather(*(one(i, a) for i, a in endpoints))
    return [g for g in got if g is not None]


async def forward_put(children: Children, path: str, body: bytes) -> None:
    """PUT `body` to `path` on every child (the log level); a child that does not answer is skipped."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as http:

        async def one(address: str) -> None:
            try:
                async with http.put(f"http://{address}{path}", data=body) as response:
                    await response.read()
            except (aiohttp.ClientError, TimeoutError):
                pass

        await asyncio.gather(*(one(a) for _, a in children.endpoints()))
