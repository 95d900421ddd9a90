"""The bucket layout of tiered format version 1, as a reader sees it (docs/tiered-format.md). Pure, no I/O.

    <prefix>/<cluster>/<broker>/<topic>/<sequence>-<epoch>.parquet    a segment
    <prefix>/<cluster>/<broker>/<topic>/manifest.json                  that topic's manifest on that broker

Names are percent-encoded (RFC 3986 unreserved characters kept). A manifest lists the segments that
are completely uploaded and verified; readers that must not see a message twice read only those, so
this module parses manifests and never guesses segments from a listing.

This is the Spark side's own reader of the public contract: it does not import the broker, so the
package zipped for `spark-submit --py-files` needs only pyarrow and boto3 on the executors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from common.errors import MessageCorrupted

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
MANIFEST_KIND = "sluice-tier-manifest"
SEGMENT_SUFFIX = ".parquet"


def encode_name(part: str) -> str:
    """A cluster, broker or topic name as it appears in object keys."""
    return quote(part, safe="-_.~")


def decode_name(part: str) -> str:
    return unquote(part)


def normalise_prefix(prefix: str) -> str:
    """The prefix as the broker uses it: leading and trailing `/` dropped (may be empty)."""
    return prefix.strip("/")


def join_key(*parts: str) -> str:
    """Key parts joined by `/`, an empty prefix dropped."""
    return "/".join(p for p in parts if p)


def topic_dir(prefix: str, cluster: str, broker: str, topic: str) -> str:
    """The key prefix of one (cluster, broker, topic), ending with `/`."""
    return join_key(normalise_prefix(prefix), encode_name(cluster), encode_name(broker), encode_name(topic)) + "/"


def manifest_key(prefix: str, cluster: str, broker: str, topic: str) -> str:
    return topic_dir(prefix, cluster, broker, topic) + MANIFEST_NAME


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment a manifest lists: where it is and what it can hold (for pruning before any GET)."""

    cluster: str
    broker: str
    topic: str
    seq: int
    key: str
    size: int
    rows: int
    queues: Mapping[int, tuple[int, int]]  # queue id -> (first offset, last offset), inclusive
    min_store_ms: int
    max_store_ms: int


@dataclass(frozen=True)
class TopicManifest:
    cluster: str
    broker: str
    topic: str
    epoch: str
    updated_ms: int
    tiered_end: Mapping[int, int]
    segments: tuple[SegmentRef, ...]


def parse_manifest(raw: bytes, where: str) -> TopicManifest:
    """Parse and check a manifest.json; MessageCorrupted naming `where` if it is not one this reader knows."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageCorrupted(f"{where} is not valid JSON ({exc}); is this a Sluice tiered bucket?") from None
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        raise MessageCorrupted(f"{where} is not a Sluice tier manifest (kind {MANIFEST_KIND!r} expected)")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise MessageCorrupted(
            f"{where} has format version {version}; this reader supports {FORMAT_VERSION}: upgrade sluice spark_jobs"
        )
    try:
        cluster, broker, topic = str(doc["cluster"]), str(doc["broker"]), str(doc["topic"])
        segments = tuple(_segment(cluster, broker, topic, s) for s in doc["segments"])
        return TopicManifest(
            cluster=cluster, broker=broker, topic=topic, epoch=str(doc.get("epoch", "")),
            updated_ms=int(doc.get("updated_ms", 0)),
            tiered_end={int(q): int(e) for q, e in doc.get("tiered_end", {}).items()}, segments=segments,
        )  # fmt: skip
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        raise MessageCorrupted(f"{where} has a missing or malformed field: {exc!r}") from None


def _segment(cluster: str, broker: str, topic: str, doc: Mapping[str, Any]) -> SegmentRef:
    return SegmentRef(
        cluster=cluster, broker=broker, topic=topic, seq=int(doc["seq"]), key=str(doc["key"]), size=int(doc["size"]),
        rows=int(doc["rows"]), queues={int(q): (int(r[0]), int(r[1])) for q, r in doc["queues"].items()},
        min_store_ms=int(doc["min_store_timestamp_ms"]), max_store_ms=int(doc["max_store_timestamp_ms"]),
    )  # fmt: skip
