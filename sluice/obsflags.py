"""The observability flags shared by the commands that start processes.

`--no-metrics` turns off the per-request counters and histograms (`[*.metrics] enabled`; the
gauges computed at scrape time stay) and `--no-trace` the broker's message trace
(`[broker.trace] enabled`); see docs/observability.md.
"""

from __future__ import annotations

import argparse


def add_observability_arguments(parser: argparse.ArgumentParser, *, trace: bool) -> None:
    parser.add_argument(
        "--no-metrics", action="store_true", default=None,
        help="do not update the per-request counters and histograms (scrape-time gauges stay)",
    )  # fmt: skip
    if trace:
        parser.add_argument("--no-trace", action="store_true", default=None, help="do not record message traces")


def metrics_overrides(args: argparse.Namespace) -> dict[str, object]:
    """Dotted overrides for `load_config` (None: the flag was not given, the file decides)."""
    return {"metrics.enabled": False if args.no_metrics else None}


def trace_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {"trace.enabled": False if args.no_trace else None}
