"""`sluice up` as a process: one line and exit 2 when its ports are taken (it printed a 56-line
ExceptionGroup), the metrics endpoint on by default and printed, and `sluice --version`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from processes.workerpool import available_cores
from sluice.commands.up import METRICS_PORT_OFFSET
from tests.helpers.procs import LOOPBACK, REPO_ROOT, free_port, port_open, start_process

SLUICE = [sys.executable, "-m", "sluice"]
RUN_TIMEOUT_S = 60.0
UP_START_TIMEOUT_S = 60.0  # its proxy workers start after it: two Python start-ups in a row


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([*SLUICE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip


def test_up_on_taken_ports_says_which_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        # No AMQP and no console: their default ports (5672, 8080) may be taken on this machine (a
        # RabbitMQ, another cluster), which adds lines of their own; this test is about the broker port.
        ports = ["--port", str(free_port()), "--namesrv-port", str(free_port()), "--metrics-port", "0",
                 "--amqp-port", "-1", "--mqtt-port", "-1", "--console-port", "-1"]  # fmt: skip
        proc = _run("up", "--data-dir", str(tmp_path / "data"), *ports, "--broker-port", str(busy), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"sluice up: port(s) already in use: broker {LOOPBACK}:{busy}; is another sluice up running? give this "
        "one other ports (--port, --namesrv-port, --broker-port, --metrics-port, --console-port)"
    ], proc.stderr
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_up_on_a_taken_console_port_refuses_to_start(tmp_path: Path) -> None:
    """The README sends the user to the console's port: with it taken, another cluster's console
    would answer there, so `sluice up` refuses like for its other ports (it logged one ERROR and ran)."""
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = ["--port", str(free_port()), "--namesrv-port", str(free_port()), "--broker-port", str(free_port()),
                 "--amqp-port", "-1", "--mqtt-port", "-1"]  # fmt: skip
        proc = _run("up", "--data-dir", str(tmp_path / "data"), *ports, "--metrics-port", "0",
                    "--console-port", str(busy), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"sluice up: port(s) already in use: console {LOOPBACK}:{busy}; is another sluice up running? give this "
        "one other ports (--port, --namesrv-port, --broker-port, --metrics-port, --console-port)"
    ], proc.stderr
    assert not (tmp_path / "data").exists()


def test_up_serves_metrics_by_default_and_prints_where(tmp_path: Path) -> None:
    port = free_port()
    metrics_port = port + METRICS_PORT_OFFSET
    if metrics_port > 65535 or port_open(LOOPBACK, metrics_port):
        pytest.skip(f"the default metrics port {metrics_port} of client port {port} is not usable here")
    argv = [*SLUICE, "up", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--namesrv-port",
            str(free_port()), "--broker-port", str(free_port()), "--amqp-port", "-1", "--mqtt-port", "-1",
            "--console-port", "-1"]  # fmt: skip
    child = start_process(argv, port=port, log_path=tmp_path / "up.log", name="up", timeout_s=UP_START_TIMEOUT_S)
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=10) as answer:
            assert b"sluice_" in answer.read()
        # Printed once every proxy worker is ready, which may be after the first one listens.
        deadline = time.monotonic() + UP_START_TIMEOUT_S
        while f"metrics on http://{LOOPBACK}:{metrics_port}/metrics" not in child.output():
            assert time.monotonic() < deadline and child.running(), child.tail()
            time.sleep(0.1)
    finally:
        assert child.stop() == 0, child.tail()


def test_version(tmp_path: Path) -> None:
    proc = _run("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("sluice ") and "Python 3." in proc.stdout


def test_second_broker_on_a_data_dir_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    first = start_process([*SLUICE, "broker", "--port", str(port), "--data-dir", str(data)], port=port,
                          log_path=tmp_path / "first.log", name="broker")  # fmt: skip
    try:
        proc = _run("broker", "--port", str(free_port()), "--data-dir", str(data), cwd=tmp_path)
    finally:
        assert first.stop() == 0, first.tail()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr  # log lines of its start and stop, then the one line of why
    assert proc.stderr.strip().splitlines()[-1] == (
        f"sluice broker: data directory {data} is in use by another process (RocksDB lock {data}/index/LOCK): is "
        "another broker or sluice up running on it? give each its own --data-dir"
    ), proc.stderr


def test_shards_refuse_what_they_cannot_run_in_one_line(tmp_path: Path) -> None:
    """`--shards` with `--workers` (given or the default of one shard per core), fewer shards than a
    data dir holds, one process over shards, `[up] shards = 0`: each refused before anything starts,
    with a line saying why."""
    ports = ["--port", str(free_port()), "--namesrv-port", str(free_port()), "--broker-port", str(free_port()),
             "--metrics-port", "0", "--console-port", "-1", "--amqp-port", "-1", "--mqtt-port", "-1"]  # fmt: skip
    data = tmp_path / "data"
    both = _run("up", "--data-dir", str(data), *ports, "--shards", "2", "--workers", "2", cwd=tmp_path)
    assert both.returncode == 2 and "give one of them" in both.stderr, both.stderr
    if available_cores() > 1:  # the default is one shard per core: --workers then needs --shards 1
        implied = _run("up", "--data-dir", str(data), *ports, "--workers", "2", cwd=tmp_path)
        assert implied.returncode == 2 and "needs --shards 1" in implied.stderr, implied.stderr
    for i in range(3):
        (data / f"shard-{i}").mkdir(parents=True)
    fewer = _run("up", "--data-dir", str(data), *ports, "--shards", "2", cwd=tmp_path)
    assert fewer.returncode == 2 and "shard-2" in fewer.stderr and "--shards 3" in fewer.stderr, fewer.stderr
    single = _run("up", "--data-dir", str(data), *ports, "--shards", "1", cwd=tmp_path)
    assert single.returncode == 2 and "holds the data of shards" in single.stderr, single.stderr
    config = tmp_path / "up.toml"
    config.write_text("[up]\nshards = 0\n")
    zero = _run("up", "--config", str(config), "--data-dir", str(tmp_path / "other"), *ports, cwd=tmp_path)
    assert zero.returncode == 2 and "shards" in zero.stderr, zero.stderr
    assert len(zero.stderr.strip().splitlines()) == 1, zero.stderr


def test_another_servers_port_as_namesrv_gets_a_clear_answer(tmp_path: Path) -> None:
    """The client port given as --namesrv answered `INTERNAL_SERVER_ERROR ... UNIMPLEMENTED Method
    not found!`; the console's made the console log an aiohttp traceback per connection."""
    port, console_port = free_port(), free_port()
    argv = [*SLUICE, "up", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--namesrv-port",
            str(free_port()), "--broker-port", str(free_port()), "--metrics-port", "0", "--shards", "1",
            "--console-port", str(console_port), "--amqp-port", "-1", "--mqtt-port", "-1"]  # fmt: skip
    child = start_process(argv, port=port, log_path=tmp_path / "up.log", name="up", timeout_s=UP_START_TIMEOUT_S)
    try:
        deadline = time.monotonic() + UP_START_TIMEOUT_S
        while not port_open(LOOPBACK, console_port):
            assert time.monotonic() < deadline and child.running(), child.tail()
            time.sleep(0.1)
        proxy = _run("admin", "--namesrv", f"{LOOPBACK}:{port}", "topic", "list", cwd=tmp_path)
        console = _run("admin", "--namesrv", f"{LOOPBACK}:{console_port}", "--timeout-s", "2", "topic", "list",
                       cwd=tmp_path)  # fmt: skip
    finally:
        assert child.stop() == 0, child.tail()
    assert proxy.returncode == 1
    assert proxy.stderr.strip() == (
        f"sluice admin: topic list: HA_NOT_AVAILABLE: {LOOPBACK}:{port} answers but is not a NameServer: it has "
        "none of a NameServer's calls (another server's port, such as a proxy's client port or a broker's?); give "
        "--namesrv a NameServer's address (port 9876 by default)"
    ), proxy.stderr
    assert console.returncode == 1 and len(console.stderr.splitlines()) == 1, console.stderr
    assert "Traceback" not in child.output(), child.tail()
    assert "not an HTTP/1.1 request" in child.output(), child.tail()  # one WARNING line says what happened
