"""MQTT.js (Node.js), unchanged, over TCP and over WebSocket (subprotocol mqtt, as browser clients
use it), on both shared topologies (tests/e2e/node/mqtt_js.js)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.support.cluster import Cluster

NODE_DIR = Path(__file__).resolve().parent / "node"


def _mqtt_js() -> str:
    """The node binary once tests/e2e/node has MQTT.js (installed with npm as the other Node.js
    clients are); skipped when Node.js or npm cannot provide it."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        pytest.skip("Node.js and npm are needed to run MQTT.js")
    if not (NODE_DIR / "node_modules" / "mqtt" / "package.json").exists():
        proc = subprocess.run([npm_bin, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        if proc.returncode != 0:
            pytest.skip(f"npm install failed (no network?): {proc.stderr.strip()[:200]}")
    return node_bin


def test_mqtt_js_over_tcp_and_websocket(cluster: Cluster) -> None:
    node = _mqtt_js()
    root = f"js{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([node, "mqtt_js.js", f"mqtt://{cluster.mqtt[0]}", f"ws://{cluster.mqtt_ws[-1]}/mqtt", root],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    ws = sorted((m["topic"], m["payload"], m["qos"]) for m in out["ws"])
    assert ws == [(f"{root}/hall/temp", "19", 1), (f"{root}/kitchen/temp", "21", 0), (f"{root}/roof/temp", "7", 2)]
    hall = next(m for m in out["ws"] if m["topic"].endswith("hall/temp"))
    assert hall["user"] == {"unit": "C"}
    assert sorted(m["payload"] for m in out["tcp"]) == ["19", "21", "7", "open"]
    assert (out["retained"]["payload"], out["retained"]["retain"]) == ("open", True)
