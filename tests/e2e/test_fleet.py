"""A proxy fleet with navigation, end to end: the shipped separated topology run by `sluice cluster up`
(support/fleet.py: 1 NameServer, 1 navigation server, broker-a, broker-b, proxy-a in zone-a,
proxy-b in zone-b with 2 workers), driven by the official Python client configured with what
navigation answers.

1. Navigation ranks proxies by zone, and its `format=text` answer, used unchanged as the Python
   client's endpoints setting, produces and consumes; the routes keep the traffic in the zone of the
   proxy the client reached (proxy/fleet.py `zoned`: the other zone's proxy carries none of it).
2. The NameServer stopped (SIGTERM) for RESTART_DELAY_S, then started again by the supervisor:
   producing and consuming go on through the proxies' cached routes without an exception, during
   the outage and after the restart.
3. One proxy drained, another killed, in the client's zone (routes list the proxies of its zone
   only). Three proxies in zone-a, so that one is always left: proxy-d and proxy-e are started by the
   test, proxy-d with `--drain-s 35` and drained with SIGTERM; proxy-a is then killed with SIGKILL
   (its process group); proxy-e survives. The drain must outlast the
   Python client's route refresh (10 s after start-up, then every 30 s): the next refresh after the
   drain began no longer lists proxy-d, and proxy-d serves whatever the clients still send it until
   then. No exception may reach the application from SIGTERM until proxy-d has exited. After the kill
   no send may fail (the client's retry moves to the next queue, which routes put on another
   proxy); receive and ack exceptions are allowed (calls to proxy-a fail until the supervisor
   restarts it RESTART_DELAY_S later; deliveries it made come back once their invisible duration
   ends), but every message whose send succeeded is finally consumed and acked.

The tests share one fleet (module scope), each waits until every supervised process runs, and the
destructive one runs last. 80-100 s in all here (under 2.5 min); every wait is bounded.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rocketmq import FilterExpression

from tests.e2e.support.clients import message, producer, receive_until, simple_consumer
from tests.e2e.support.fleet import RESTART_DELAY_S, Fleet, start_fleet, wait_for
from tests.e2e.support.traffic import Traffic
from tests.helpers.procs import LOOPBACK, port_open

# Drained proxy: serves this long after SIGTERM. Above the Python client's 30 s route refresh period.
DRAIN_S = 35.0
# Python client: first route refresh this long after start-up, then every ROUTE_REFRESH_PERIOD_S.
FIRST_ROUTE_REFRESH_S = 10.0
ROUTE_REFRESH_PERIOD_S = 30.0
# A proxy caches navigation's answer this long (proxy config endpoints_cache_s): a route served
# within it may still name a proxy that started draining.
ENDPOINTS_CACHE_S = 3.0
FLOW_TIMEOUT_S = 20.0
KEEP_PRODUCING_AFTER_KILL_S = 6.0
AFTER_NAMESRV_RESTART_S = 8.0
RECOVERY_TIMEOUT_S = 45.0
MESSAGES = 24


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    started = start_fleet(Path(tmp_path_factory.mktemp("fleet")))
    try:
        yield started
    finally:
        problems = started.stop()
        assert not problems, "fleet teardown:\n" + "\n".join(problems)


def test_navigation_ranks_by_zone_and_its_text_answer_configures_the_python_client(
    fleet: Fleet, unique: Callable[[str], str]
) -> None:
    fleet.wait_running()
    a, b = fleet.endpoint("proxy-a"), fleet.endpoint("proxy-b")
    for zone, first, other in (("zone-a", a, b), ("zone-b", b, a)):
        answer = fleet.endpoints_json(zone=zone)
        assert answer["endpoints"] == [first, other], answer
        assert answer["access_points"] == f"{first};{other}"
        assert answer["proxies"][0]["zone"] == zone
        assert {p["id"] for p in answer["proxies"]} == {"proxy-a", "proxy-b-w0", "proxy-b-w1"}
    assert fleet.endpoints_json(zone="zone-b", limit=1)["endpoints"] == [b]
    status, content_type, body = fleet.http_get("/v1/endpoints", network="no-such-network", format="text")
    assert (status, content_type.split(";")[0]) == (503, "text/plain"), body

    status, content_type, endpoints = fleet.http_get("/v1/endpoints", zone="zone-a", format="text")
    assert (status, content_type.split(";")[0], endpoints) == (200, "text/plain", f"{a};{b}")  # no newline

    topic = fleet.create_topic(unique("t"))
    group = fleet.create_group(unique("g"))
    with producer(endpoints, topic) as p, simple_consumer(endpoints, group, {topic: FilterExpression()}) as c:
        receipts = [p.send(message(topic, f"nav-{i}".encode())) for i in range(MESSAGES)]
        ids = {r.message_id for r in receipts}
        got = receive_until(c, lambda got: ids <= {m.message_id for m in got})
    # The client reached proxy-a (zone-a): the route lists the proxies of zone-a only, and none of
    # its sends and receives crosses to zone-b.
    assert {str(r.message_queue.endpoints) for r in receipts} == {a}
    assert {str(m.endpoints) for m in got} == {a}
    assert {m.message_id for m in got} == ids


@pytest.mark.slow
def test_traffic_continues_on_cached_routes_while_the_nameserver_is_down(
    fleet: Fleet, unique: Callable[[str], str]
) -> None:
    fleet.wait_running()
    topic = fleet.create_topic(unique("t"))
    group = fleet.create_group(unique("g"))
    namesrv_port = fleet.port("nameserver-1")
    with Traffic(fleet.endpoints_text(zone="zone-a"), topic, group, label="ns") as traffic:
        traffic.wait("messages flow", lambda: len(traffic.acked) >= 20, FLOW_TIMEOUT_S)
        stopped_at = time.monotonic()
        pid = fleet.signal("nameserver-1", signal.SIGTERM)
        fleet.wait_exited("nameserver-1", pid, 15.0)
        assert not port_open(LOOPBACK, namesrv_port), "the NameServer still listens"
        down_acked = len(traffic.acked)
        # The supervisor starts it again; it may answer (knowing no broker yet) from then on.
        fleet.wait_respawned("nameserver-1", pid, RESTART_DELAY_S + 15.0)
        restarted_at = time.monotonic()
        acked_while_down = len(traffic.acked) - down_acked
        fleet.wait_running()
        time.sleep(AFTER_NAMESRV_RESTART_S)  # brokers re-register; proxies refresh their routes meanwhile
        fleet.wait_brokers_registered()  # and the fleet is left as the next test expects it
        traffic.stop_producing()
        traffic.wait_all_acked(RECOVERY_TIMEOUT_S)
    down_s = restarted_at - stopped_at
    while_down = traffic.failures_between(stopped_at, restarted_at)
    after_restart = traffic.failures_between(restarted_at)
    assert down_s >= RESTART_DELAY_S * 0.9, "the NameServer was not down for long"
    assert acked_while_down >= 20, f"only {acked_while_down} messages consumed while the NameServer was down"
    assert while_down == [], f"exceptions reached the application while the NameServer was down: {while_down[:5]}"
    assert not traffic.not_acked(), traffic.summary()
    # A restarted NameServer knows no topic until the brokers' next heartbeat; proxies keep using
    # the routes they had (proxy/directory.py), so no client call fails meanwhile either.
    assert after_restart == [], f"exceptions reached the application after the restart: {after_restart[:5]}"


@pytest.mark.slow
def test_clients_ride_through_a_drained_and_a_killed_proxy(fleet: Fleet, unique: Callable[[str], str]) -> None:
    fleet.wait_running()
    fleet.wait_brokers_registered()
    d = fleet.start_proxy("proxy-d", zone="zone-a", drain_s=DRAIN_S)
    e = fleet.start_proxy("proxy-e", zone="zone-a", drain_s=0)
    a, b = fleet.endpoint("proxy-a"), fleet.endpoint("proxy-b")
    topic = fleet.create_topic(unique("t"))
    group = fleet.create_group(unique("g"))
    endpoints = fleet.endpoints_text(zone="zone-a")
    assert set(endpoints.split(";")) == {a, b, d, e}

    with Traffic(endpoints, topic, group, label="fleet") as traffic:
        # The route lists every proxy of the zone: sends go through all three, none through zone-b's.
        traffic.wait("sends through every proxy of zone-a", lambda: traffic.endpoints_used(0)[0] == {a, d, e},
                     FLOW_TIMEOUT_S)  # fmt: skip

        # -- drain proxy-d ---------------------------------------------------------------------------
        drained = fleet.extra["proxy-d"]
        drain_at = time.monotonic()
        drained.signal(signal.SIGTERM)
        wait_for("navigation leaves proxy-d out", lambda: d not in fleet.endpoints_json(zone="zone-a")["endpoints"],
                 5.0)  # fmt: skip
        assert [p["draining"] for p in fleet.listed_proxies() if p["id"] == "proxy-d"] == [True]
        code = drained.popen.wait(timeout=DRAIN_S + 20.0)
        drain_end = time.monotonic()
        assert code == 0, f"proxy-d exited {code}:\n{drained.tail(15)}"
        assert drain_end - drain_at >= DRAIN_S - 1.0, "proxy-d did not keep serving for its drain"
        drain_failures = traffic.failures_between(drain_at, drain_end)

        # Both clients' first route refresh at least ENDPOINTS_CACHE_S after the drain began left
        # proxy-d out: nothing went through it from then on (1 s for the refresh to be answered).
        refreshes = [traffic.started_at + FIRST_ROUTE_REFRESH_S + k * ROUTE_REFRESH_PERIOD_S for k in range(3)]
        moved_at = next(r for r in refreshes if r >= drain_at + ENDPOINTS_CACHE_S) + 1.0
        sends_after, deliveries_after = traffic.endpoints_used(moved_at)
        sends_during, _ = traffic.endpoints_used(drain_at, drain_end)

        # -- kill proxy-a --------------------------------------------------------------------------
        kill_at = time.monotonic()
        fleet.kill_group("proxy-a")
        time.sleep(KEEP_PRODUCING_AFTER_KILL_S)
        traffic.stop_producing()
        traffic.wait_all_acked(RECOVERY_TIMEOUT_S, lambda message_id: _acked_by_broker(fleet, group, message_id))
        after_kill = traffic.failures_between(kill_at)
        sends_after_kill, _ = traffic.endpoints_used(kill_at)

    assert drain_failures == [], f"exceptions reached the application during the drain: {drain_failures[:5]}"
    assert d not in sends_after | deliveries_after, "traffic still went through proxy-d after the route refresh"
    assert {a, e} <= sends_during, f"sends during the drain went through {sends_during}"
    assert e in sends_after_kill, f"sends after the kill went through {sends_after_kill}"
    assert b not in sends_during | sends_after_kill, "a zone-a client's sends crossed to zone-b"
    # Routes alternate proxies queue by queue: a send that met the dead proxy is retried by the
    # client on the next queue, through the live one (before, runs of one proxy's queues made it
    # fail all its attempts).
    failed_sends = [f for f in after_kill if f.call == "send"]
    assert not failed_sends, f"sends failed after the kill: {failed_sends[:5]}"
    assert not traffic.not_acked(), traffic.summary()
    print(f"drain/kill: {traffic.summary()}; {len(after_kill)} exceptions after the kill "
          f"({sorted({f.call for f in after_kill})})")  # fmt: skip


def _acked_by_broker(fleet: Fleet, group: str, message_id: str) -> bool:
    """Whether the message trace records an ack of the message by `group` (an ack the client saw fail
    because the proxy it went through was killed after the broker committed it)."""
    doc = fleet.admin("message", "trace", "--id", message_id)
    return bool(doc and doc.get("groups", {}).get(group, {}).get("acked"))
