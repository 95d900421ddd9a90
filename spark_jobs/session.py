"""A SparkSession for the jobs, and progress lines while a job runs.

`open_session` starts (or joins) a session with the `sluice` source registered and the session time
zone set to UTC (hours and dates in job output are UTC). The master is `config.master`, else the one
spark-submit chose, else `local[*]`; with a local master started here, Python workers run this
interpreter (so they see the same packages).

`ProgressReporter` polls Spark's status tracker from a daemon thread and prints one line per change
("progress: stage 3: 12/40 tasks") on stderr; it stops with its `with` block.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from pyspark.sql import SparkSession

from spark_jobs.config import SparkJobsConfig
from spark_jobs.source import register

DEFAULT_MASTER = "local[*]"


def open_session(config: SparkJobsConfig) -> SparkSession:
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM and chose the master
    master = config.master or ("" if under_submit else DEFAULT_MASTER)
    if master.startswith("local") and not under_submit:
        # The JVM starts Python workers with PYSPARK_PYTHON (default "python3"), which may lack pyarrow.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(config.app_name)
    if master:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
        .config("spark.ui.showConsoleProgress", "false")
    )
    spark = builder.getOrCreate()
    register(spark)
    return spark


class ProgressReporter:
    def __init__(self, spark: SparkSession, interval_s: float, emit: Callable[[str], None] | None = None) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._interval_s = interval_s
        self._emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-spark-progress", daemon=True)
        self._last = ""

    def __enter__(self) -> ProgressReporter:
        if self._interval_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._interval_s + 5.0)

    def line(self) -> str:
        parts = []
        for stage_id in sorted(self._tracker.getActiveStageIds()):
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
        return "progress: " + ", ".join(parts) if parts else ""

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                line = self.line()
            except Exception:  # the session is stopping; progress lines are best effort
                return
            if line and line != self._last:
                self._emit(line)
                self._last = line
