"""Topics and consumer groups of one broker, persisted in RocksDB (column families `topics`,
`groups`; values are small JSON documents) and cached in memory.

Mutations run on the broker's event loop thread; reads are dictionary lookups.
"""

from __future__ import annotations

import json
import time
from typing import Any

from broker.client.api import BackoffKind, ConsumeFrom, GroupInfo, GroupSpec, RetryPolicy, TopicSpec
from broker.store.index import Index
from common.errors import BadRequest, ConsumerGroupNotFound, TopicNotFound
from common.model import MessageType, Permission

CF_TOPICS = "topics"
CF_GROUPS = "groups"
METADATA_CFS = (CF_TOPICS, CF_GROUPS)


def topic_to_json(spec: TopicSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "queue_count": spec.queue_count,
        "message_types": sorted(t.name for t in spec.message_types),
        "permission": spec.permission.name,
        "max_priority": spec.max_priority,
        "lite_expiration_s": spec.lite_expiration_s,
        "max_lite_topics": spec.max_lite_topics,
    }


def topic_from_json(doc: dict[str, Any]) -> TopicSpec:
    return TopicSpec(
        name=doc["name"],
        queue_count=int(doc["queue_count"]),
        message_types=frozenset(MessageType[t] for t in doc["message_types"]),
        permission=Permission[doc["permission"]],
        # Absent in topics saved before priority and lite topics: the defaults.
        max_priority=int(doc.get("max_priority", 9)),
        lite_expiration_s=int(doc.get("lite_expiration_s", 600)),
        max_lite_topics=int(doc.get("max_lite_topics", 0)),
    )


def group_to_json(info: GroupInfo) -> dict[str, Any]:
    s, p = info.spec, info.spec.retry_policy
    return {
        "name": s.name,
        "fifo": s.fifo,
        "max_delivery_attempts": s.max_delivery_attempts,
        "retry": {"kind": p.kind.value, "initial_ms": p.initial_ms, "max_ms": p.max_ms,
                  "multiplier": p.multiplier, "customized_ms": list(p.customized_ms)},
        "consume_from": s.consume_from.value,
        "consume_from_timestamp_ms": s.consume_from_timestamp_ms,
        "created_ms": info.created_ms,
    }  # fmt: skip


def group_from_json(doc: dict[str, Any]) -> GroupInfo:
    r = doc["retry"]
    policy = RetryPolicy(BackoffKind(r["kind"]), int(r["initial_ms"]), int(r["max_ms"]), float(r["multiplier"]),
                         tuple(int(x) for x in r["customized_ms"]))  # fmt: skip
    spec = GroupSpec(doc["name"], bool(doc["fifo"]), int(doc["max_delivery_attempts"]), policy,
                     ConsumeFrom(doc["consume_from"]), int(doc["consume_from_timestamp_ms"]))  # fmt: skip
    return GroupInfo(spec, int(doc["created_ms"]))


def validate_group_spec(spec: GroupSpec) -> None:
    if spec.max_delivery_attempts < 1 or spec.max_delivery_attempts > 1000:
        raise BadRequest(f"max delivery attempts must be between 1 and 1000, got {spec.max_delivery_attempts}")
    p = spec.retry_policy
    if p.kind is BackoffKind.CUSTOMIZED and not p.customized_ms:
        raise BadRequest("a customized retry policy needs at least one delay")
    if p.initial_ms < 0 or p.max_ms < p.initial_ms or p.multiplier < 1.0 or any(d < 0 for d in p.customized_ms):
        raise BadRequest("retry policy delays must be non-negative, max >= initial and multiplier >= 1")


class Metadata:
    def __init__(self, index: Index) -> None:
        self._topics_cf = index.cf(CF_TOPICS)
        self._groups_cf = index.cf(CF_GROUPS)
        self.topics: dict[str, TopicSpec] = {}
        self.groups: dict[str, GroupInfo] = {}
        for key, value in self._topics_cf.items():
            spec = topic_from_json(json.loads(value))
            self.topics[key.decode()] = spec
        for key, value in self._groups_cf.items():
            self.groups[key.decode()] = group_from_json(json.loads(value))

    def topic(self, name: str) -> TopicSpec:
        spec = self.topics.get(name)
        if spec is None:
            raise TopicNotFound(
                f"topic {name} does not exist on this broker; create it with `sluice admin topic create`"
            )
        return spec

    def put_topic(self, spec: TopicSpec) -> None:
        self._topics_cf.put(spec.name.encode(), json.dumps(topic_to_json(spec)).encode())
        self.topics[spec.name] = spec

    def delete_topic(self, name: str) -> None:
        self.topic(name)
        self._topics_cf.delete(name.encode())
        del self.topics[name]

    def group(self, name: str) -> GroupInfo:
        info = self.groups.get(name)
        if info is None:
            raise ConsumerGroupNotFound(
                f"consumer group {name} does not exist on this broker; create it with `sluice admin group create`"
            )
        return info

    def put_group(self, spec: GroupSpec, created_ms: int | None = None) -> GroupInfo:
        old = self.groups.get(spec.name)
        if created_ms is None:
            created_ms = old.created_ms if old else time.time_ns() // 1_000_000
        info = GroupInfo(spec, created_ms)
        self._groups_cf.put(spec.name.encode(), json.dumps(group_to_json(info)).encode())
        self.groups[spec.name] = info
        return info

    def delete_group(self, name: str) -> None:
        self.group(name)
        self._groups_cf.delete(name.encode())
        del self.groups[name]
