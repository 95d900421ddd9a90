"""Planning a scan: find the manifests that can hold the wanted messages, prune their segments, cut tasks.

Runs on the driver and touches only listings and manifest.json objects (never a segment):

1. clusters, brokers and topics come from the options when named, else from delimiter listings of
   the bucket (`<prefix>/`, `<prefix>/<cluster>/`, ...), filtered by the topic names and pattern;
2. one GET per selected (cluster, broker, topic) manifest;
3. a segment is kept only if its queues, offset ranges and store-time range (all in the manifest)
   overlap what is wanted, so a query for one hour of one topic fetches only the objects that can
   hold that hour;
4. one `ScanTask` per kept segment, or, for a segment larger than `split_bytes`, one per byte range
   (a task reads the row groups that start in its range, like Spark's own Parquet splits);
5. tasks packed into input partitions as Spark packs small files: each object costs its size or
   `open_cost_bytes`, whichever is larger, and a partition holds up to
   min(split_bytes, max(open_cost_bytes, total cost / min_partitions)). Broker segments are 32 MiB
   by default, one per partition; the small segments of a slow topic (cut by `segment_max_age_s`)
   share one, so a day of them is not thousands of sub-second Spark tasks.

A task marked `whole` lies entirely inside the wanted range: the executor reads it with one GET.
Otherwise the executor reads the footer first and prunes row groups by their statistics (scan.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from broker.tiering.format import (
    SegmentRef,
    TopicManifest,
    decode_name,
    encode_name,
    join_key,
    manifest_key,
    normalise_prefix,
    parse_manifest,
)
from broker.tiering.objectstore import MeteredObjectStore, ObjectNotFound
from broker.tiering.s3store import S3ObjectStore
from common.errors import NotFound
from common.logs import kv
from spark_jobs.options import ScanOptions

log = logging.getLogger("sluice.spark.planner")


@dataclass(frozen=True, slots=True)
class ScanTask:
    """One input partition: the row groups of `segment` that start in bytes [start, end)."""

    segment: SegmentRef
    start: int
    end: int
    whole: bool  # the whole object, all of it wanted: one GET, no footer round trip


@dataclass
class ScanPlan:
    tasks: list[ScanTask]
    manifests: list[TopicManifest]
    partitions: list[list[ScanTask]] = field(default_factory=list)
    segments_total: int = 0  # listed by the manifests read
    segments_selected: int = 0
    bytes_total: int = 0
    bytes_selected: int = 0
    gets: int = 0  # GET requests planning made (manifests)
    topics: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.manifests)} manifest(s) of {len(self.topics)} topic(s); "
            f"{self.segments_selected} of {self.segments_total} segment(s) selected, "
            f"{self.bytes_selected / 1e6:.1f} of {self.bytes_total / 1e6:.1f} MB, {len(self.tasks)} task(s) in "
            f"{len(self.partitions)} partition(s)"
        )


def segment_overlaps(seg: SegmentRef, opts: ScanOptions) -> bool:
    """Can the segment hold a wanted message? (from the manifest alone)"""
    if seg.max_store_ms < opts.from_ms or seg.min_store_ms >= opts.to_ms:
        return False
    return any(
        opts.wants_queue(q) and last >= opts.from_offset and first < opts.to_offset
        for q, (first, last) in seg.queues.items()
    )


def segment_inside(seg: SegmentRef, opts: ScanOptions) -> bool:
    """Is every message of the segment wanted by queue, offset and time? (then no row group can be pruned)"""
    if seg.min_store_ms < opts.from_ms or seg.max_store_ms >= opts.to_ms:
        return False
    return all(
        opts.wants_queue(q) and first >= opts.from_offset and last < opts.to_offset
        for q, (first, last) in seg.queues.items()
    )


def tasks_for(seg: SegmentRef, opts: ScanOptions) -> list[ScanTask]:
    if seg.size <= opts.split_bytes:
        return [ScanTask(seg, 0, seg.size, segment_inside(seg, opts))]
    starts = range(0, seg.size, opts.split_bytes)
    return [ScanTask(seg, s, min(s + opts.split_bytes, seg.size), False) for s in starts]


def pack(tasks: list[ScanTask], opts: ScanOptions) -> list[list[ScanTask]]:
    """Input partitions: consecutive tasks (so a partition covers neighbouring time) up to the target cost."""
    if not tasks:
        return []
    costs = [max(t.end - t.start, opts.open_cost_bytes) for t in tasks]
    target = min(opts.split_bytes, max(opts.open_cost_bytes, sum(costs) // opts.min_partitions))
    partitions: list[list[ScanTask]] = [[]]
    used = 0
    for task, cost in zip(tasks, costs, strict=True):
        if partitions[-1] and used + cost > target:
            partitions.append([])
            used = 0
        partitions[-1].append(task)
        used += cost
    return partitions


def _children(bucket: S3ObjectStore, prefix: str) -> list[str]:
    return [decode_name(p[len(prefix) :].rstrip("/")) for p in bucket.child_prefixes(prefix)]


def _locations(bucket: S3ObjectStore, opts: ScanOptions) -> list[tuple[str, str, str]]:
    """(cluster, broker, topic) triples that may hold wanted data, by name or by listing."""
    root = normalise_prefix(opts.prefix)
    root_dir = root + "/" if root else ""
    clusters = sorted(opts.clusters) if opts.clusters is not None else _children(bucket, root_dir)
    out: list[tuple[str, str, str]] = []
    for cluster in clusters:
        cluster_dir = join_key(root, encode_name(cluster)) + "/"
        brokers = sorted(opts.brokers) if opts.brokers is not None else _children(bucket, cluster_dir)
        for broker in brokers:
            if opts.topics and not opts.topic_pattern:
                named = opts.topics if opts.only_topics is None else opts.topics & opts.only_topics
                out.extend((cluster, broker, t) for t in sorted(named))
                continue
            broker_dir = join_key(cluster_dir.rstrip("/"), encode_name(broker)) + "/"
            out.extend((cluster, broker, t) for t in _children(bucket, broker_dir) if opts.wants_topic(t))
    return out


def _topics_in_bucket(bucket: S3ObjectStore, opts: ScanOptions) -> list[str]:
    everything = ScanOptions(s3=opts.s3, prefix=opts.prefix, clusters=opts.clusters, brokers=opts.brokers)
    return sorted({t for _, _, t in _locations(bucket, everything)})


def plan_scan(opts: ScanOptions, bucket: S3ObjectStore | None = None) -> ScanPlan:
    """The tasks of a scan. Raises NotFound for a missing bucket or a named topic with no tiered data."""
    bucket = bucket or S3ObjectStore(opts.s3)
    bucket.check_bucket()
    counted = MeteredObjectStore(bucket)
    manifests: list[TopicManifest] = []
    for cluster, broker, topic in _locations(bucket, opts):
        key = manifest_key(opts.prefix, cluster, broker, topic)
        try:
            raw = counted.get(key)
        except ObjectNotFound:
            continue
        manifests.append(parse_manifest(raw, f"{opts.s3.describe()}/{key}"))
    found = {m.topic for m in manifests}
    missing = sorted(opts.topics - found) if opts.only_topics is None else []
    if missing:
        known = _topics_in_bucket(bucket, opts)
        raise NotFound(
            f"topic(s) {', '.join(missing)} have no tiered data in {opts.s3.describe()} under prefix "
            f"{opts.prefix!r}; topics there: {', '.join(known) or 'none'} (check --topic, --s3-prefix, --cluster)"
        )
    plan = ScanPlan(tasks=[], manifests=manifests, topics=sorted(found))
    for manifest in manifests:
        for seg in manifest.segments:
            plan.segments_total += 1
            plan.bytes_total += seg.size
            if segment_overlaps(seg, opts):
                plan.segments_selected += 1
                plan.bytes_selected += seg.size
                plan.tasks.extend(tasks_for(seg, opts))
    plan.partitions = pack(plan.tasks, opts)
    plan.gets = counted.snapshot().gets
    log.info("scan planned", extra=kv(summary=plan.summary(), bucket=opts.s3.describe(), prefix=opts.prefix))
    return plan
