"""The `--py-files` archive for spark-submit: the packages a driver and its executors import.

Executors need `spark_jobs` and `common` (errors, logs, config) plus pyarrow and boto3 installed in
their Python; nothing of the broker is shipped or imported.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

PACKAGES = ("spark_jobs", "common")
ROOT = Path(__file__).resolve().parent.parent


def build_zip(output: Path, root: Path = ROOT) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                zf.write(path, path.relative_to(root).as_posix())
    return output
