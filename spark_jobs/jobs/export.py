"""`export`: messages of a topic and time range as a Parquet dataset partitioned by UTC date.

    <destination>/date=2024-06-01/part-<segment key hash>-<byte offset>.parquet
    <destination>/_SUCCESS                    written last, once every part is in place

The destination is a local path or an `s3://bucket/path` URL. The job runs one Spark task per
planned input partition (planner.py): each reads its segment with scan.py and writes its parts with
pyarrow's own filesystems (local, or S3 with the job's S3 settings), Arrow end to end: no Hadoop S3
jars, and no pandas (which `mapInArrow` would need). Parts are named by segment and byte range,
so a retried task overwrites its own parts. They hold the data source's columns (schema.py) minus
`date`, which is the directory (Hive-style, as Spark's `partitionBy` writes it): Spark,
pyarrow.dataset and DuckDB read it back with hive partitioning. A destination that already holds
files is refused unless `overwrite` (then its contents are deleted first).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from broker.tiering.s3settings import S3Settings
from common.errors import BadRequest
from spark_jobs.options import ScanOptions
from spark_jobs.planner import ScanTask, plan_scan
from spark_jobs.scan import read_task

SUCCESS_MARKER = "_SUCCESS"


@dataclass(frozen=True)
class Destination:
    """Where to write: an S3 bucket path (with the settings to reach it) or a local directory."""

    path: str  # "bucket/dir" for S3, an absolute directory otherwise
    s3: S3Settings | None

    @classmethod
    def parse(cls, url: str, s3: S3Settings) -> Destination:
        parts = urlsplit(url)
        if parts.scheme in ("s3", "s3a"):
            if not parts.netloc:
                raise BadRequest(f"export destination {url!r} names no bucket: use s3://BUCKET/PATH")
            return cls(f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/"), s3)
        if parts.scheme not in ("", "file"):
            raise BadRequest(f"export destination {url!r}: use a local path or an s3://BUCKET/PATH URL")
        local = parts.path if parts.scheme == "file" else url
        return cls(str(pafs.LocalFileSystem().normalize_path(os.path.abspath(local))), None)

    def filesystem(self) -> pafs.FileSystem:
        if self.s3 is None:
            return pafs.LocalFileSystem()
        endpoint = urlsplit(self.s3.endpoint_url) if self.s3.endpoint_url else None
        return pafs.S3FileSystem(
            access_key=self.s3.access_key_id or None, secret_key=self.s3.secret_access_key or None,
            session_token=self.s3.session_token or None, region=self.s3.region,
            endpoint_override=endpoint.netloc if endpoint else None, scheme=endpoint.scheme if endpoint else "https",
            connect_timeout=self.s3.connect_timeout_s, request_timeout=self.s3.read_timeout_s,
        )  # fmt: skip

    def display(self) -> str:
        return f"s3://{self.path}" if self.s3 is not None else self.path


def _write_partition(dest: Destination, opts: ScanOptions, tasks: list[ScanTask]) -> list[tuple[str, str, int]]:
    return [part for task in tasks for part in _write_task(dest, opts, task)]


def _write_task(dest: Destination, opts: ScanOptions, task: ScanTask) -> list[tuple[str, str, int]]:
    """Executor side: the task's rows, one part file per UTC date; (date, path, rows) of each part."""
    batches = list(read_task(task, opts))
    if not batches:
        return []
    table = pa.Table.from_batches(batches)
    fs = dest.filesystem()
    dates = pc.strftime(table["store_timestamp"], format="%Y-%m-%d")
    # Named by the segment and byte range: a retried task overwrites its own parts, never duplicates rows.
    digest = hashlib.sha1(task.segment.key.encode(), usedforsecurity=False).hexdigest()[:16]
    name = f"part-{digest}-{task.start}.parquet"
    written = []
    for date in sorted(pc.unique(dates).to_pylist()):
        part = table.filter(pc.equal(dates, date))
        directory = f"{dest.path}/date={date}"
        fs.create_dir(directory, recursive=True)
        pq.write_table(part, f"{directory}/{name}", filesystem=fs, compression="zstd")
        written.append((date, f"{directory}/{name}", part.num_rows))
    return written


def prepare(dest: Destination, overwrite: bool) -> None:
    fs = dest.filesystem()
    found = fs.get_file_info(pafs.FileSelector(dest.path, allow_not_found=True, recursive=True))
    files = [f for f in found if f.type == pafs.FileType.File]
    if files and not overwrite:
        raise BadRequest(
            f"export destination {dest.display()} already holds {len(files)} file(s): choose another path or pass "
            "--overwrite to replace them"
        )
    if files:
        fs.delete_dir_contents(dest.path, missing_dir_ok=True)


def export(
    spark: SparkSession, opts: ScanOptions, dest: Destination, *, overwrite: bool = False
) -> list[tuple[str, str, int]]:
    """Write what `opts` selects under `dest`; (date, part path, rows) of every part written."""
    prepare(dest, overwrite)
    partitions = plan_scan(opts).partitions
    parts: list[tuple[str, str, int]] = []
    if partitions:
        rdd = spark.sparkContext.parallelize(partitions, len(partitions))
        parts = rdd.flatMap(lambda tasks: _write_partition(dest, opts, tasks)).collect()
    fs = dest.filesystem()
    fs.create_dir(dest.path, recursive=True)
    with fs.open_output_stream(f"{dest.path}/{SUCCESS_MARKER}") as out:
        out.write(b"")
    return sorted(parts)
