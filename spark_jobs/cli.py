"""Command line of the Spark jobs: `sluice spark JOB ...` and `spark-submit spark_jobs/submit.py JOB ...`.

    sluice spark topic-stats --s3-endpoint URL --s3-bucket NAME [--s3-prefix P] --topic T [--from ... --to ...]
                             [--granularity hour|minute] [--output PATH|s3://B/P] [--json] [--master local[*]]
    sluice spark trace       ... (--key K | --message-id ID)... [--topic T]
    sluice spark export      ... --topic T --output PATH|s3://B/P [--overwrite]
    sluice spark stream      --namesrv HOST:PORT --topic T --output PATH --checkpoint PATH [--trigger-interval S]
                             (per-minute counts per topic and tag, streamed from the brokers; restartable)
    sluice spark package     --output sluice-spark.zip        (the --py-files archive for spark-submit)

The archive is found with the same S3 flags as the broker's (`--s3-endpoint`, `--s3-bucket`,
`--s3-prefix`); `--config FILE` reads a `[spark]` table (spark_jobs/config.py) that flags override.
The scan is planned on the driver first, so a missing bucket or topic and a bad time range fail in a
second with a clear message instead of inside Spark; progress lines go to stderr while the job
runs; the result goes to stdout as a table or, with `--json`, as one JSON document. A failure inside
Spark (an unreadable object, the store unreachable) is reported with the error's own message (the
Sluice error class is recovered from the Python worker's traceback), not a JVM stack trace.

Nothing here imports pyspark until a job runs, so `sluice --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import common.errors as errors
from common.config import load_config
from common.errors import BadRequest, SluiceError
from common.moments import relative_ms
from spark_jobs.config import SparkJobsConfig
from spark_jobs.options import ScanOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JOBS = ("topic-stats", "trace", "export", "stream", "package")
EXIT_FAILED = 1
_ERROR_LINE = re.compile(r"(?:common\.errors\.|broker\.tiering\.\w+\.)?([A-Z]\w+): (.+)")
# Errors of the shared tiering modules, by the name a worker's traceback gives them.
_TIERING_ERRORS: dict[str, type[SluiceError]] = {
    "SegmentCorrupted": errors.MessageCorrupted, "ObjectNotFound": errors.NotFound, "BucketNotFound": errors.NotFound,
}  # fmt: skip

_CONFIG_FLAGS = {  # flag dest -> SparkJobsConfig field
    "s3_endpoint": "endpoint_url", "s3_bucket": "bucket", "s3_prefix": "prefix", "s3_region": "region",
    "s3_access_key": "access_key_id", "s3_secret_key": "secret_access_key",
    "s3_addressing_style": "addressing_style", "master": "master", "split_bytes": "split_bytes",
    "progress_interval": "progress_interval_s",
}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    jobs = parser.add_subparsers(dest="job", metavar="JOB", required=True)
    texts = {
        "topic-stats": "messages, bytes, distinct keys and message groups per topic per hour (or minute)",
        "trace": "every stored message with a given key or message id, across topics and time",
        "export": "a topic and time range as a Parquet dataset partitioned by date (local path or s3://)",
        "stream": "keep per-minute message counts per topic and tag in Parquet, streamed from the brokers "
        "(checkpointed: a rerun continues where the last one stopped)",
        "package": "build the zip to ship with spark-submit --py-files",
    }
    for job in JOBS:
        p = jobs.add_parser(job, help=texts[job], description=texts[job])
        if job == "package":
            p.add_argument("--output", required=True, metavar="ZIP", help="where to write the archive")
            continue
        if job == "stream":
            _add_stream(p)
            continue
        _add_common(p)
        if job == "topic-stats":
            p.add_argument("--granularity", choices=("hour", "minute"), default="hour")
            p.add_argument("--output", default="", metavar="PATH", help="also write the result as Parquet here")
        elif job == "trace":
            p.add_argument("--key", action="append", default=[], metavar="KEY", help="a message key (repeatable)")
            p.add_argument("--message-id", action="append", default=[], metavar="ID", help="a message id (repeatable)")
        else:
            p.add_argument("--output", required=True, metavar="PATH|s3://BUCKET/PATH", help="dataset destination")
            p.add_argument("--overwrite", action="store_true", help="replace what the destination holds")


def _add_stream(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namesrv", required=True, metavar="HOST:PORT[;HOST:PORT]", help="the cluster's NameServers")
    p.add_argument("--topic", action="append", default=[], metavar="T", help="a topic (repeatable)")
    p.add_argument("--topic-pattern", default="", metavar="REGEX", help="topics matching this (full match)")
    p.add_argument("--output", required=True, metavar="PATH", help="the counts table (Parquet, one part per batch)")
    p.add_argument("--checkpoint", required=True, metavar="PATH", help="the query's checkpoint (keep it to restart)")
    p.add_argument("--starting-offsets", default="earliest", metavar="WHERE",
                   help="earliest (default), latest or offsets JSON; only for a new checkpoint")  # fmt: skip
    p.add_argument("--starting-timestamp", default="", metavar="TIME",
                   help="from messages stored since (ISO-8601, epoch ms, now-1h); new checkpoint")  # fmt: skip
    p.add_argument("--max-records-per-trigger", type=int, default=None, metavar="N", help="messages per batch")
    p.add_argument("--trigger-interval", type=float, default=0.0, metavar="S",
                   help="seconds between batches; 0 (default) = read what is there now, then stop")  # fmt: skip
    p.add_argument("--group", default="", metavar="G", help="a consumer group to commit progress to (lag)")
    p.add_argument("--config", default=None, metavar="FILE", help="TOML file with a [spark] table")
    p.add_argument("--master", default=None, help="Spark master (default local[*], or spark-submit's --master)")
    p.add_argument("--json", action="store_true", help="print the totals as one JSON document")


def stream_options(args: argparse.Namespace) -> dict[str, str]:
    """The streaming source's options of `sluice spark stream`, checked before Spark starts."""
    from spark_jobs.stream.options import StreamOptions

    if not args.topic and not args.topic_pattern:
        raise BadRequest("stream needs --topic (or --topic-pattern): the topics to count")
    opts = {
        "namesrv": args.namesrv, "topics": ",".join(args.topic), "topicPattern": args.topic_pattern,
        "startingOffsets": "" if args.starting_timestamp else args.starting_offsets,
        "startingTimestamp": args.starting_timestamp, "group": args.group,
        "maxRecordsPerTrigger": "" if args.max_records_per_trigger is None else str(args.max_records_per_trigger),
    }  # fmt: skip
    opts = {k: v for k, v in opts.items() if v}
    StreamOptions.parse(opts)  # raises BadRequest naming the flag's option
    if args.trigger_interval < 0:
        raise BadRequest(f"--trigger-interval must be 0 or more seconds, got {args.trigger_interval}")
    return opts


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, metavar="FILE", help="TOML file with a [spark] table")
    p.add_argument("--s3-endpoint", default=None, metavar="URL", help="S3 endpoint (default AWS)")
    p.add_argument("--s3-bucket", default=None, metavar="NAME", help="the broker's tiering bucket")
    p.add_argument("--s3-prefix", default=None, metavar="P", help="the broker's tiering prefix (default sluice)")
    p.add_argument("--s3-region", default=None, metavar="R")
    p.add_argument("--s3-access-key", default=None, metavar="ID", help="default: the AWS credential chain")
    p.add_argument("--s3-secret-key", default=None, metavar="KEY", help="prefer AWS_SECRET_ACCESS_KEY")
    p.add_argument("--s3-addressing-style", default=None, choices=("auto", "path", "virtual"))
    p.add_argument("--master", default=None, help="Spark master (default local[*], or spark-submit's --master)")
    p.add_argument("--split-bytes", type=int, default=None, metavar="N", help="split segments larger than this")
    p.add_argument("--progress-interval", type=float, default=None, metavar="S", help="0 = no progress lines")
    p.add_argument("--cluster", action="append", default=[], metavar="NAME", help="only this cluster (repeatable)")
    p.add_argument("--broker", action="append", default=[], metavar="NAME", help="only this broker (repeatable)")
    p.add_argument("--topic", action="append", default=[], metavar="T", help="a topic (repeatable)")
    p.add_argument("--topic-pattern", default="", metavar="REGEX", help="topics matching this (full match)")
    p.add_argument("--queue", action="append", default=[], type=int, metavar="ID", help="only this queue id")
    p.add_argument("--from", dest="time_from", default="", metavar="TIME",
                   help="ISO-8601, epoch ms or now-2h style (inclusive)")  # fmt: skip
    p.add_argument("--to", dest="time_to", default="", metavar="TIME",
                   help="ISO-8601, epoch ms or now style (exclusive)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def job_config(args: argparse.Namespace) -> SparkJobsConfig:
    overrides = {field: getattr(args, flag) for flag, field in _CONFIG_FLAGS.items()}
    config = load_config(SparkJobsConfig, section="spark", path=args.config, overrides=overrides)
    if not config.bucket:
        raise BadRequest("--s3-bucket is required: the bucket the broker tiers into")
    return config


def source_options(config: SparkJobsConfig, args: argparse.Namespace) -> dict[str, str]:
    opts = config.source_options()
    extra = {
        "cluster": ",".join(args.cluster), "broker": ",".join(args.broker), "topic": ",".join(args.topic),
        "topicPattern": args.topic_pattern, "queues": ",".join(map(str, args.queue)),
        "from": _fixed(args.time_from), "to": _fixed(args.time_to),
    }  # fmt: skip
    if args.job == "trace":
        if not args.key and not args.message_id:
            raise BadRequest("trace needs at least one --key or --message-id")
        extra["key"] = ",".join(args.key)
        extra["messageId"] = ",".join(args.message_id)
    if args.job == "export" and not args.topic and not args.topic_pattern:
        raise BadRequest("export needs --topic (or --topic-pattern): which messages to export")
    opts.update({k: v for k, v in extra.items() if v})
    return opts


def _fixed(moment: str) -> str:
    """A moment relative to now (`now-2h`) as epoch ms, taken once for the whole job; others as given."""
    relative = relative_ms(moment) if moment else None
    return moment if relative is None else str(relative)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, spark: SparkSession | None = None, emit: Callable[[str], None] = _progress) -> int:
    """Run one job; with `spark`, in that session (tests share one), else in a new local one."""
    if args.job == "package":
        from spark_jobs.package import build_zip

        emit(f"wrote {build_zip(Path(args.output))}")
        return 0
    if args.job == "stream":
        return run_stream(args, spark, emit)
    from spark_jobs.planner import plan_scan
    from spark_jobs.session import ProgressReporter, open_session
    from spark_jobs.source import register

    config = job_config(args)
    options = source_options(config, args)
    plan = plan_scan(ScanOptions.parse(options))  # errors in the options or the bucket surface here, fast
    emit(f"planned: {plan.summary()}")
    own_session = spark is None
    session = spark or open_session(config)
    try:
        if not own_session:
            register(session)  # open_session registered it in its own (twice made Spark warn it was replaced)
        df = session.read.format("sluice").options(**options).load()
        started = time.monotonic()
        with ProgressReporter(session, config.progress_interval_s, emit):
            try:
                result = _JOBS[args.job](df, args, config)
            except SluiceError:
                raise
            except Exception as exc:
                raise spark_failure(exc) from None
        emit(f"done in {time.monotonic() - started:.1f}s")
    finally:
        if own_session:
            session.stop()
    print(render(args.job, result, plan.summary(), as_json=args.json))
    return 0


def run_stream(args: argparse.Namespace, spark: SparkSession | None, emit: Callable[[str], None]) -> int:
    """`sluice spark stream`: run the counting query (to the end of what is there, or until interrupted)."""
    from spark_jobs.jobs import minute_counts
    from spark_jobs.session import open_session
    from spark_jobs.source import register

    options = stream_options(args)
    overrides = {"master": args.master}
    config = load_config(SparkJobsConfig, section="spark", path=args.config, overrides=overrides)
    own_session = spark is None
    session = spark or open_session(config)
    try:
        if not own_session:
            register(session)
        started = time.monotonic()
        query = minute_counts.start(
            session, options, args.output, args.checkpoint, trigger_interval_s=args.trigger_interval
        )
        emit(f"query {query.id} started (checkpoint {args.checkpoint})")
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            emit("interrupted: stopping the query (a rerun continues from the checkpoint)")
            query.stop()
        except Exception as exc:
            raise spark_failure(exc) from None
        batches = [p for p in query.recentProgress if p.numInputRows]  # the last 100 batches (Spark keeps those)
        read = sum(p.numInputRows for p in batches)
        emit(f"done in {time.monotonic() - started:.1f}s: {len(batches)} batch(es), {read} message(s) read")
        rows = minute_counts.minute_totals(session, args.output)
    finally:
        if own_session:
            session.stop()
    print(render(args.job, rows, f"{read} message(s) read in this run", as_json=args.json))
    return 0


def _topic_stats(df: DataFrame, args: argparse.Namespace, config: SparkJobsConfig) -> list[dict[str, Any]]:
    from spark_jobs.jobs.topic_stats import topic_stats

    rows = [r.asDict() for r in topic_stats(df, args.granularity).collect()]
    if args.output:
        from spark_jobs.jobs.results import write_rows

        write_rows(rows, args.output, config.s3(), "topic-stats.parquet")
    return rows


def _trace(df: DataFrame, args: argparse.Namespace, config: SparkJobsConfig) -> list[dict[str, Any]]:
    from spark_jobs.jobs.trace import trace

    return [r.asDict() for r in trace(df).collect()]


def _export(df: DataFrame, args: argparse.Namespace, config: SparkJobsConfig) -> list[dict[str, Any]]:
    from spark_jobs.jobs.export import Destination, export

    dest = Destination.parse(args.output, config.s3())
    parts = export(df.sparkSession, ScanOptions.parse(source_options(config, args)), dest, overwrite=args.overwrite)
    return [{"date": d, "path": p, "rows": n} for d, p, n in parts]


_JOBS: dict[str, Callable[[DataFrame, argparse.Namespace, SparkJobsConfig], list[dict[str, Any]]]] = {
    "topic-stats": _topic_stats,
    "trace": _trace,
    "export": _export,
}


def spark_failure(exc: BaseException) -> SluiceError:
    """The Sluice error a failed Spark job carries in its (Python worker) traceback, else an InternalError."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        match = _ERROR_LINE.fullmatch(line.strip())
        if match:
            cls = _TIERING_ERRORS.get(match.group(1)) or getattr(errors, match.group(1), None)
            if isinstance(cls, type) and issubclass(cls, SluiceError):
                return cls(match.group(2))
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return errors.InternalError(f"the Spark job failed: {first}")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def render(job: str, rows: Sequence[Mapping[str, Any]], summary: str, *, as_json: bool) -> str:
    plain = [{k: _plain(v) for k, v in r.items()} for r in rows]
    if as_json:
        return json.dumps({"job": job, "plan": summary, "rows": plain}, ensure_ascii=False)
    if not plain:
        return "(no rows)"
    headers = list(plain[0])
    cells = [[_cell(r[h]) for h in headers] for r in plain]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point under spark-submit (see spark_jobs/submit.py)."""
    parser = argparse.ArgumentParser(prog="sluice-spark", description="Spark jobs over the Sluice tiered archive.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SluiceError as exc:
        print(f"sluice spark {args.job}: {exc}", file=sys.stderr)
        return EXIT_FAILED
