"""Sluice topologies on namespace hosts (tests/helpers/hosts.py), driven from a client host.

`HostCluster` wraps a `Lab`: `start(host, name, *sluice args, port=P)` runs a Sluice command in a
host and waits until it listens on P there; `admin(...)` runs `sluice admin --json` on the client
host; `traffic(...)` starts the official clients on the client host (support/hostclient.py) and
`finish(...)` waits for them and reads what they saw; `route`, `pika` and `mqtt` run one client
command there (a route as a client is answered it, an AMQP or an MQTT exchange). Every wait is
bounded. Nothing here imports Sluice (this runs in the end-to-end test process).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.support.hostclient import Seen, read_events
from tests.helpers.hosts import Host, Lab
from tests.helpers.procs import ChildProcess

PYTHON = sys.executable
ADMIN_TIMEOUT_S = 60.0
TRAFFIC_SLACK_S = 60.0  # beyond the produce and drain time: the clients' start and shutdown


@dataclass
class HostCluster:
    lab: Lab
    root: Path
    client: Host
    namesrv: str = ""
    processes: dict[str, tuple[Host, ChildProcess, list[str], int]] = field(default_factory=dict)

    def start(self, host: Host, name: str, *args: str, port: int) -> ChildProcess:
        """`sluice ARGS` in `host`, ready once it listens on `port` there."""
        child = host.sluice(*args, log_path=self.root / "logs" / f"{name}-{time.monotonic_ns()}.log", name=name)
        self.processes[name] = (host, child, list(args), port)
        host.wait_listening(child, port)
        return child

    def start_together(self, starts: list[tuple[Host, str, list[str], int]]) -> None:
        """Several `sluice` commands side by side (a broker group's members elect among themselves),
        each ready once it listens on its port."""
        children = []
        for host, name, args, port in starts:
            child = host.sluice(*args, log_path=self.root / "logs" / f"{name}-{time.monotonic_ns()}.log", name=name)
            self.processes[name] = (host, child, list(args), port)
            children.append((host, child, port))
        for host, child, port in children:
            host.wait_listening(child, port)

    def restart(self, name: str) -> ChildProcess:
        host, _, args, port = self.processes[name]
        return self.start(host, name, *args, port=port)

    def wait_log(self, name: str, text: str, timeout_s: float = 30.0) -> None:
        """Until process `name`'s output shows `text` (bounded)."""
        child = self.processes[name][1]
        deadline = time.monotonic() + timeout_s
        while text not in child.output():
            assert time.monotonic() < deadline, f"{name} did not log {text!r} within {timeout_s} s:\n{child.tail()}"
            time.sleep(0.2)

    def admin(self, *args: str) -> Any:
        done = self.client.run([PYTHON, "-m", "sluice", "admin", "--namesrv", self.namesrv, *args, "--json"],
                               timeout_s=ADMIN_TIMEOUT_S)  # fmt: skip
        return json.loads(done.stdout) if done.stdout.strip() else None

    def route(self, endpoint: str, topic: str) -> list[dict[str, Any]]:
        """The queues of `topic`'s route as the proxy at `endpoint` answers a client on the client
        host (support/hostclient.py `route`)."""
        done = self.client.run([PYTHON, "-m", "tests.e2e.support.hostclient", "route", "--endpoint", endpoint,
                                "--topic", topic], timeout_s=ADMIN_TIMEOUT_S)  # fmt: skip
        return list(json.loads(done.stdout))

    def wait_route(self, endpoint: str, topic: str, until: Callable[[list[dict[str, Any]]], bool],
                   timeout_s: float = 30.0) -> list[dict[str, Any]]:  # fmt: skip
        """Until the route `endpoint` answers for `topic` satisfies `until` (bounded); that route."""
        deadline = time.monotonic() + timeout_s
        while True:
            queues = self.route(endpoint, topic)
            if until(queues):
                return queues
            assert time.monotonic() < deadline, f"route of {topic} at {endpoint} after {timeout_s} s: {queues}"
            time.sleep(0.3)

    def pika(self, server: Host, port: int, user: str, secret: str, queue: str, count: int = 20) -> list[str]:
        """Publish `count` messages to `queue` with pika on the client host through the AMQP port of
        `server` (publisher confirms), consume and ack them; what was consumed, in order."""
        done = self.client.run([PYTHON, "-m", "tests.e2e.support.hostclient", "amqp", "--host", server.address,
                                "--port", str(port), "--user", user, "--password", secret, "--queue", queue,
                                "--count", str(count)])  # fmt: skip
        return list(json.loads(done.stdout)["consumed"])

    def mqtt(self, server: Host, port: int, bind: str, count: int = 20) -> list[str]:
        """`count` QoS-1 messages from one paho client to another subscribed to `bind/#`, both on the
        client host and connected to the MQTT port of `server`; what the subscriber received."""
        done = self.client.run([PYTHON, "-m", "tests.e2e.support.hostclient", "mqtt", "--host", server.address,
                                "--port", str(port), "--bind", bind, "--count", str(count)])  # fmt: skip
        return list(json.loads(done.stdout)["received"])

    def brokers(self) -> list[dict[str, Any]]:
        """`broker list` rows; none while the NameServer lists none (the command then fails)."""
        done = self.client.run([PYTHON, "-m", "sluice", "admin", "--namesrv", self.namesrv, "broker", "list", "--json"],
                               timeout_s=ADMIN_TIMEOUT_S, check=False)  # fmt: skip
        return list(json.loads(done.stdout)) if done.returncode == 0 and done.stdout.strip() else []

    def wait_brokers(self, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Until the NameServer lists `count` brokers."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.brokers()
            if len(rows) >= count:
                return rows
            assert time.monotonic() < deadline, f"{count} brokers did not register within {timeout_s} s: {rows}"
            time.sleep(0.5)

    def traffic(self, endpoints: str, topic: str, group: str, *, produce_s: float, drain_s: float = 30.0,
                fifo_groups: int = 0, host: Host | None = None) -> tuple[ChildProcess, Path]:  # fmt: skip
        """The official Producer and SimpleConsumer on the client host (or `host`); returns the
        process and its events file."""
        events = self.root / f"events-{topic}.jsonl"
        argv = [PYTHON, "-m", "tests.e2e.support.hostclient", "traffic", "--endpoints", endpoints, "--topic", topic,
                "--group", group, "--events", str(events), "--produce-s", str(produce_s), "--drain-s", str(drain_s),
                "--fifo-groups", str(fifo_groups)]  # fmt: skip
        where = host or self.client
        child = where.spawn(argv, log_path=self.root / "logs" / f"client-{topic}.log", name=f"client-{topic}")
        return child, events

    def finish(self, child: ChildProcess, events: Path, timeout_s: float) -> Seen:
        """Wait for the clients to end (bounded) and read what they saw."""
        child.popen.wait(timeout=timeout_s + TRAFFIC_SLACK_S)
        seen = read_events(events)
        assert seen.done, f"the client did not finish (exit {child.popen.returncode}):\n{child.tail()}"
        return seen
