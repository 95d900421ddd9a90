"""The script spark-submit runs: `spark-submit --py-files sluice-spark.zip spark_jobs/submit.py JOB ...`."""

from __future__ import annotations

import sys

from spark_jobs.cli import main

if __name__ == "__main__":
    sys.exit(main())
