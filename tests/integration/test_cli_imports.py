"""What a `sluice` command imports (docs/testing.md): every `sluice admin` call is a new process,
and tests make hundreds of them, so a command loads only the libraries it uses.

Each check runs in a fresh interpreter (this one has loaded everything) and lists `sys.modules`.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.procs import REPO_ROOT, free_port

# Libraries `sluice admin topic list` has no use for: S3, HTTP, metrics, Parquet, RocksDB, etcd,
# the console's templates.
NOT_FOR_ADMIN = ("boto3", "aiohttp", "prometheus_client", "pyarrow", "rocksdict", "aetcd", "jinja2")
# What `sluice proxy` has no use for: the broker's storage and tiering, the console.
NOT_FOR_PROXY = ("boto3", "pyarrow", "rocksdict", "jinja2", "broker.local", "console.server", "sluice.commands.up")


def _loaded_after(code: str) -> set[str]:
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_admin_topic_list_loads_no_server_library() -> None:
    # A NameServer address nobody listens on: the command fails (exit 1) after importing all it runs.
    namesrv = f"127.0.0.1:{free_port()}"
    loaded = _loaded_after(
        "from sluice.main import main\n"
        f"rc = main(['admin', '--namesrv', '{namesrv}', '--timeout-s', '0.5', 'topic', 'list'])\n"
        "assert rc == 1, rc"
    )
    assert "admin.topics" in loaded and "broker.client.remote" in loaded, "the command did run"
    assert not {name for name in NOT_FOR_ADMIN if name in loaded}


def test_proxy_command_loads_no_broker() -> None:
    loaded = _loaded_after("import sluice.commands.proxy")
    assert "proxy.server" in loaded
    assert not {name for name in NOT_FOR_PROXY if name in loaded}


def test_server_commands_load_no_tiering_library() -> None:
    """pyarrow and boto3 are the tiering core's: a broker (`sluice broker`, `sluice up`, a merged
    node) without `[broker.tiering]` never loads them."""
    loaded = _loaded_after("import sluice.commands.broker, sluice.commands.up, sluice.commands.node")
    assert "broker.local" in loaded and "broker.tiering.runtime" in loaded
    assert not {name for name in ("pyarrow", "boto3") if name in loaded}
