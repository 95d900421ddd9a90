"""The package boundaries of docs/architecture.md: the proxy depends on the broker contract
(`broker.client`) and never on the storage node, and the contract itself imports none of it.

Checked twice: statically (every import statement of the files, including those under
TYPE_CHECKING and inside functions) and by what a fresh interpreter really loads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The `sluice` command and what it composes (its admin library, console, bench harness, cluster
# supervisor, process pools, ops endpoint): built on the components, never imported by them.
COMMAND_SIDE = ("sluice", "admin", "console", "bench", "cluster", "processes", "ops")

# Modules of the storage node or its heavy dependencies that importing the proxy must not load.
STORAGE_SIDE = (
    "broker.",
    "rocksdict",
    "pyarrow",
    "boto3",
    "botocore",
    "spark_jobs",
    *COMMAND_SIDE,
    "aiobotocore",
)


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # `from broker import store` names the module broker.store
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def storage_imports(package: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for line, module in imported_modules(path, root):
            if module.startswith(STORAGE_SIDE) and not module.startswith("broker.client"):
                bad.append(f"{path.relative_to(root)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("package", ["proxy", "broker/client"])
def test_no_import_statement_reaches_the_storage_node(package: str) -> None:
    assert storage_imports(package) == []


def test_the_static_check_sees_a_storage_import(tmp_path: Path) -> None:
    """The checker itself: a from-import of a storage module, relative or not, is reported."""
    (tmp_path / "proxy" / "core").mkdir(parents=True)
    probe = tmp_path / "proxy" / "core" / "probe.py"
    probe.write_text("from broker.store import store\nfrom ...broker import local\nimport broker.client.api\n")
    assert storage_imports("proxy", tmp_path) == [
        "proxy/core/probe.py:1 imports broker.store.store",
        "proxy/core/probe.py:2 imports broker.local",
    ]


def test_importing_the_proxy_loads_nothing_of_the_storage_node() -> None:
    code = (
        "import sys, json, pkgutil, importlib, proxy\n"
        "for m in pkgutil.walk_packages(proxy.__path__, 'proxy.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    loaded = json.loads(out)
    assert "proxy.server" in loaded and "broker.client.remote" in loaded  # it did import the proxy
    leaked = [m for m in loaded if m.startswith(STORAGE_SIDE) and not m.startswith("broker.client")]
    assert leaked == []


# spark_jobs runs on Spark's driver and executors (the `--py-files` zip, spark_jobs/package.py): of
# Sluice it may use only what that zip carries, never the storage node, the proxy or the `sluice` command.
SPARK_ALLOWED = (
    "common.", "proto.", "spark_jobs.", "nameserver.", "broker.client.",
    "broker.tiering.format", "broker.tiering.objectstore", "broker.tiering.s3settings", "broker.tiering.s3store",
)  # fmt: skip
OWN = (
    "broker",
    "proxy",
    *COMMAND_SIDE,
    "navigation",
    "nameserver",
    "common",
    "proto",
    "spark_jobs",
)


def test_spark_jobs_imports_only_what_its_archive_carries() -> None:
    bad = []
    for path in sorted((ROOT / "spark_jobs").rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in OWN and not module.startswith(SPARK_ALLOWED):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


@pytest.mark.parametrize("package", ["broker", "proxy", "nameserver", "navigation", "common", "proto"])
def test_no_server_imports_spark(package: str) -> None:
    """Spark stays in spark_jobs: a broker, proxy or NameServer process never loads pyspark."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, module in imported_modules(path)
        if module.startswith(("pyspark", "spark_jobs"))
    ]
    assert bad == []
