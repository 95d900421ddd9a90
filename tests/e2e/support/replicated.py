"""A replicated broker group as real processes, and the steps the fault tests share.

`start_replicated` starts a NameServer, one group of `sluice broker --group g1 --min-insync 2`
members (against an etcd the caller started) and one proxy (or several, each listing the others in
routes: `--peers`), returning a `Cluster`. The helpers find
the routed primary, fail it over (SIGKILL, wait for another member to take the group, start the
victim again with the same port and data), and consume with a `History` under retriable errors.

It imports nothing of Sluice's packages (tests/e2e/conftest.py): a delivery's stored copy comes from
its receipt handle as support/handles.py reads it.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.v5.model import Message

from tests.e2e.support import handles
from tests.e2e.support.clients import producer, simple_consumer
from tests.e2e.support.cluster import (
    LOOPBACK,
    SLUICE,
    AdminError,
    Cluster,
    _start,
    _start_together,
    _wait_for_brokers,
)
from tests.e2e.support.history import History
from tests.helpers.procs import free_port

GROUP = "g1"
MEMBERS = ("b1", "b2", "b3")
INVISIBLE_S = 6
HOLD_EVERY = 4  # with `hold`, every 4th delivery stays un-acked: in flight when the primary dies
CONFIG = """
[broker]
heartbeat_interval_s = 1.0
[broker.replication]
lease_ttl_s = 2
max_lag_ms = 1500
[broker.transaction]
default_recovery_ms = 2000
check_interval_ms = 2000
max_checks = 60
[proxy]
route_refresh_s = 1.0
[proxy.transaction]
poll_interval_ms = 300
"""


def start_replicated(
    root: Path, etcd_url: str, *, members: Sequence[str] = MEMBERS, member_args: Mapping[str, Sequence[str]] = {},
    config_text: str = CONFIG, proxies: int = 1, mqtt: bool = False,
) -> Cluster:  # fmt: skip
    """NameServer, the group's members (each with `member_args[name]` added), `proxies` proxies, all
    with `config_text` as their --config. With one proxy its process is named "proxy", with several
    "proxy-<port>" (`Cluster.proxy_process`). `mqtt`: each proxy serves MQTT on a free port
    (`Cluster.mqtt`). On a start failure the processes already started are stopped."""
    config = root / "replicated.toml"
    config.write_text(config_text)
    ns_port = free_port()
    cluster = Cluster("replicated", root, f"{LOOPBACK}:{ns_port}", [], [GROUP])
    try:
        _start(cluster, "nameserver", [*SLUICE, "nameserver", "--port", str(ns_port)], ns_port,
               f"nameserver listening on {cluster.namesrv}")  # fmt: skip
        starts = []
        for name in members:
            port = free_port()
            argv = [*SLUICE, "broker", "--name", name, "--port", str(port), "--data-dir", str(root / name),
                    "--namesrv", cluster.namesrv, "--group", GROUP, "--etcd", etcd_url, "--min-insync", "2",
                    "--config", str(config), *member_args.get(name, ())]  # fmt: skip
            starts.append((name, argv, port, f"broker {name} listening on {LOOPBACK}:{port}"))
        _start_together(cluster, starts)  # side by side: the members elect a primary among themselves
        _wait_for_brokers(cluster, 1)
        ports = [free_port() for _ in range(proxies)]
        # Several: each lists the others in routes, one worker each, and stops at once on SIGTERM.
        peers = ["--peers", ";".join(f"{LOOPBACK}:{p}" for p in ports), "--workers", "1", "--drain-s", "0"]
        peers = peers if proxies > 1 else []
        starts = []
        for port in ports:
            mqtt_args = ["--mqtt-port", str(free_port())] if mqtt else []
            argv = [*SLUICE, "proxy", "--namesrv", cluster.namesrv, "--port", str(port), "--config", str(config),
                    *peers, *mqtt_args]  # fmt: skip
            if mqtt_args:
                cluster.mqtt.append(f"{LOOPBACK}:{mqtt_args[1]}")
            starts.append(("proxy" if proxies == 1 else f"proxy-{port}", argv, port,
                           f"proxy listening on {LOOPBACK}:{port}"))  # fmt: skip
            cluster.proxies.append(f"{LOOPBACK}:{port}")
        _start_together(cluster, starts)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def primary(cluster: Cluster) -> str:
    """The member whose address the NameServer routes the group to."""
    rows = cluster.admin("broker", "list") or []
    address = next(r["address"] for r in rows if r["broker"] == GROUP)
    return next(n for n in cluster.launches if cluster.launches[n][1] == int(address.rsplit(":", 1)[1]))


def routed_primary(cluster: Cluster) -> str | None:
    """`primary`, or None while the NameServer routes the group nowhere (between one primary
    leaving and the next registering)."""
    try:
        return primary(cluster)
    except (AdminError, StopIteration):
        return None


def new_primary(cluster: Cluster, old: str) -> bool:
    """Whether the NameServer routes the group to a member other than `old`."""
    return routed_primary(cluster) not in (None, old)


def group_listing(cluster: Cluster, etcd_url: str) -> list[dict[str, object]]:
    """`sluice admin broker list --etcd` rows of the group's members (role, epoch, in_sync, lag)."""
    return [r for r in cluster.admin("broker", "list", "--etcd", etcd_url) or [] if r["group"] == GROUP]


def wait(what: str, check: Callable[[], bool], timeout_s: float = 60.0, *,
         explain: Callable[[], object] | None = None) -> None:  # fmt: skip
    """Poll `check` until true; on timeout the error names `what` and shows `explain()` (the state seen)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            seen = f": {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out waiting for {what}{seen}")
        time.sleep(0.2)


def retrying(what: str, call: Callable[[], object], timeout_s: float = 30.0) -> object:
    """`call()` until it succeeds (retriable refusals while a group fails over)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what} kept failing: {exc}") from exc
            time.sleep(0.3)


def restart(cluster: Cluster, name: str) -> None:
    """Start a killed member again (same argv, port and data directory)."""
    argv, port, ready = cluster.launches[name]
    _start(cluster, name, argv, port, ready, log_name=f"{name}-again-{time.monotonic_ns()}")
    cluster.killed.discard(name)


def fail_over(cluster: Cluster) -> str:
    """SIGKILL the primary, wait for another member to take the group, start the victim again;
    returns the victim's name."""
    wait("a routed primary", lambda: routed_primary(cluster) is not None)
    victim = primary(cluster)
    cluster.kill(victim)
    wait("a new primary", lambda: new_primary(cluster, victim))
    restart(cluster, victim)
    return victim


def stored_copy(msg: Message) -> tuple[int, int]:
    """(queue id, queue offset) of the stored message a delivery is, from its receipt handle."""
    _, queue_id, queue_offset, _ = handles.fields(msg.receipt_handle)
    return queue_id, queue_offset


def consume(consumer: SimpleConsumer, history: History, held: list[Message], done: Callable[[], bool],
            *, hold: bool, timeout_s: float = 90.0) -> None:  # fmt: skip
    """Receive until `done()`: ack each delivery (recording acks answered OK), or with `hold` keep
    every HOLD_EVERY-th one un-acked."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"consumption did not finish: {history.verdict().summary()}"
        try:
            batch = consumer.receive(16, INVISIBLE_S)
        except Exception:  # retriable while the group fails over
            time.sleep(0.3)
            continue
        received = time.monotonic()  # the broker popped the batch before this
        for msg in batch:
            body, copy = msg.body.decode(), stored_copy(msg)
            history.delivered(body, copy, handles.fields(msg.receipt_handle).version, at=received)
            if hold and sum(history.deliveries.values()) % HOLD_EVERY == 0:
                held.append(msg)
                continue
            acking = time.monotonic()  # the broker applies the ack after this
            try:
                consumer.ack(msg)
            except Exception:  # not answered OK: it may come back, and that is allowed
                history.ack_failed(body, at=acking)
                continue
            history.acked(body, copy, at=acking)


@contextlib.contextmanager
def traffic(cluster: Cluster, topic: str, group: str, history: History,
            produce: Callable[[Producer, threading.Event], None]) -> Iterator[None]:  # fmt: skip
    """While the body runs: a producer thread runs `produce(client, stop)` (it sends until `stop`
    is set, recording each acknowledged send in `history`) and a consumer of `group` receives and
    acks everything. Then both stop, and the consumer goes on until every send is settled."""
    held: list[Message] = []
    stop = threading.Event()
    with producer(cluster.endpoints, topic) as client, \
            simple_consumer(cluster.endpoints, group, {topic: FilterExpression()}) as consumer:  # fmt: skip
        worker = threading.Thread(target=produce, args=(client, stop), name="producer")
        consuming = threading.Thread(target=consume, args=(consumer, history, held, stop.is_set), kwargs={
            "hold": False, "timeout_s": 300.0}, name="consumer")  # fmt: skip
        worker.start()
        consuming.start()
        try:
            yield
        finally:
            stop.set()
            worker.join(60)
            consuming.join(60)
        everything = set(history.sends)
        consume(consumer, history, held, lambda: everything <= history.settled(), hold=False)


def run_through_failovers(cluster: Cluster, topic: str, group: str, history: History,
                          send_one: Callable[[Producer], None], *, kills: int, rng: random.Random) -> None:  # fmt: skip
    """`traffic` in which the producer calls `send_one` in a loop (it sends one message and records
    it in `history`, or raises on a refusal, which is retried after a short pause) while the primary
    is SIGKILLed `kills` times at random moments, each time waiting for acks to succeed again."""

    def produce(client: Producer, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                send_one(client)
            except Exception:  # retriable refusals during a failover
                time.sleep(0.05)

    with traffic(cluster, topic, group, history, produce):
        for _ in range(kills):
            time.sleep(rng.uniform(1.0, 3.0))
            acked_before = len(history.acks)
            fail_over(cluster)
            wait("acks to succeed again", lambda n=acked_before: len(history.acks) > n + 5)  # type: ignore[misc]
