"""`sluice spark JOB`: jobs over the tiered archive and the brokers (spark_jobs/cli.py holds the flags and jobs)."""

from __future__ import annotations

import argparse

from spark_jobs import cli

NAME = "spark"
HELP = "Spark jobs: topic-stats, trace, export (archive), stream (per-minute counts from brokers), package."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return cli.run(args)
