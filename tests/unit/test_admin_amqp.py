"""`sluice admin amqp queues` reads the metadata document and then each queue's counts, not at one
instant: a queue deleted in between (its metadata entry goes first, then its group and topic) must
not be listed, and one whose group is not created yet is listed without counts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, cast

from admin.amqp import list_queues
from admin.cluster import Cluster
from common.errors import NotFound
from proxy.amqp.meta import MetaDoc, QueueMeta, encode


@dataclass
class _Queue:
    topic: str
    ready: int
    in_flight: int
    due: int = 0
    ready_bytes: int = 0


@dataclass
class _Status:
    queues: list[_Queue]


@dataclass
class _Broker:
    broker_name: str
    address: str


@dataclass
class _FakeCluster:
    """The document versions the home broker answers with, one per read, and the groups that exist."""

    docs: list[MetaDoc]
    groups: dict[str, _Status] = field(default_factory=dict)
    reads: int = 0

    async def brokers(self) -> list[_Broker]:
        return [_Broker("b1", "127.0.0.1:1")]

    def broker(self, name: str, address: str) -> _FakeCluster:
        return self

    async def get_amqp_meta(self, since: int) -> tuple[int, bytes]:
        doc = self.docs[min(self.reads, len(self.docs) - 1)]
        self.reads += 1
        return doc.version, encode(doc)

    async def group_status(self, group: str, topics: list[str], *, ready_bytes: bool = False) -> _Status:
        if group not in self.groups:
            raise NotFound(f"group {group} not found")
        status = self.groups[group]
        return status if ready_bytes else _Status([replace(q, ready_bytes=0) for q in status.queues])


def _doc(version: int, *queues: QueueMeta) -> MetaDoc:
    doc = MetaDoc(version, next_id=10)
    for q in queues:
        doc.vhost("/").queues[q.name] = q
    return doc


def _list(fake: _FakeCluster) -> list[dict[str, Any]]:
    return asyncio.run(list_queues(cast(Cluster, fake), None)).rows


def test_a_queue_deleted_while_listing_is_left_out() -> None:
    kept, going = QueueMeta("kept", 1, "b1"), QueueMeta("going", 2, "b1", exclusive_owner="c1")
    fake = _FakeCluster([_doc(5, kept, going), _doc(6, kept)],
                        groups={kept.group: _Status([_Queue(kept.topic, ready=3, in_flight=2, due=1)])})  # fmt: skip
    rows = _list(fake)
    assert [(r["name"], r["ready"], r["unacked"]) for r in rows] == [("kept", 3, 1)]
    assert fake.reads == 2  # the document was read again to settle the missing group


def test_a_queue_redeclared_under_the_same_name_while_listing_is_left_out() -> None:
    old, new = QueueMeta("q", 1, "b1"), QueueMeta("q", 7, "b1")  # deleted and declared again: a new number
    fake = _FakeCluster([_doc(5, old), _doc(7, new)], groups={new.group: _Status([])})
    assert _list(fake) == []


def test_a_queue_whose_group_is_not_created_yet_is_listed_without_counts() -> None:
    declaring = QueueMeta("declaring", 3, "b1")
    fake = _FakeCluster([_doc(5, declaring), _doc(5, declaring)])
    rows = _list(fake)
    assert [(r["name"], r["ready"], r["unacked"]) for r in rows] == [("declaring", None, None)]


def test_a_consistent_listing_reads_the_document_once() -> None:
    q = QueueMeta("q", 1, "b1")
    fake = _FakeCluster([_doc(5, q)], groups={q.group: _Status([_Queue(q.topic, ready=0, in_flight=4)])})
    assert [(r["name"], r["ready"], r["unacked"]) for r in _list(fake)] == [("q", 0, 4)]
    assert fake.reads == 1


def test_ready_bytes_are_listed_for_queues_with_a_byte_limit_only() -> None:
    limited = QueueMeta("limited", 1, "b1", arguments={"x-max-length-bytes": 1000})
    plain = QueueMeta("plain", 2, "b1")
    fake = _FakeCluster([_doc(5, limited, plain)],
                        groups={q.group: _Status([_Queue(q.topic, ready=2, in_flight=0, ready_bytes=700)])
                                for q in (limited, plain)})  # fmt: skip
    assert [(r["name"], r["ready"], r["ready_bytes"]) for r in _list(fake)] == [("limited", 2, 700), ("plain", 2, None)]
