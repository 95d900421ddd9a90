"""One bench run: options, clients, workload tasks and progress, bounded in time, then a result.

    produce  C tasks, each one SendMessage of B messages in flight (max) or on a schedule (rate)
    consume  C loops of receive (batch, long polling) + one AckMessage per batch
    e2e      produce (rate or max) and consume at once; end-to-end latency per message of this run
    echo     produce against the echo server (`bench.echo`): the gRPC ceiling

The first `warmup_s` seconds are not counted (connections, routes, caches warm up); then the run is
measured for `duration_s`, or until `stop` is set. Every task is created and awaited (or
cancelled, after a bounded grace) here; the clients are closed before returning.

Calls follow the topic's route as the official clients do (`follow_routes`, the default): the route
is asked of the first endpoint given, and each send goes to the endpoint of the next writable queue
of the route (round robin, as the official producers pick a queue per send), each receive and its
ack to the endpoint of the queue received from. Under `sluice up --shards N` those are the shards
owning the queues (docs/shards.md), so nothing is forwarded. Without it, every call goes to the
endpoints given (tasks spread over them): a node forwards what another node owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.client import SEND_PATH, TRANSPORTS, BenchClient, CallError
from bench.cpu import CpuSample, cpu_between
from bench.echo import ECHO_SEND_PATH
from bench.payload import SendPayload, new_run_id
from bench.stats import Meter, progress
from bench.workloads import ConsumeSpec, Deadline, Rotation, consume_loop, produce_loop
from common.config import ConfigError
from proto.apache.rocketmq.v2 import definition_pb2 as pb

MODES = ("produce", "consume", "e2e", "echo")
CONCURRENCY_MAX = 4096
BATCH_MAX = 1024
RECEIVE_BATCH_MAX = 32
SIZE_BYTES_MAX = 4 * 1024 * 1024
DURATION_S_MAX = 24 * 3600.0
CHANNELS_MAX = 64
START_DELAY_S = 0.05  # lets every task be created before the first call is due


@dataclass(frozen=True)
class BenchOptions:
    mode: str
    endpoints: tuple[str, ...]
    topic: str = "bench"
    group: str = "sluice-bench"
    namespace: str = ""
    size_bytes: int = 1024
    rate_per_s: float | None = None  # None: as fast as the server answers
    duration_s: float = 10.0
    warmup_s: float = 1.0
    concurrency: int = 16
    consumers: int = 0  # e2e: consume loops (0: as many as `concurrency`)
    batch: int = 1
    receive_batch: int = 32
    invisible_s: float = 30.0
    long_poll_s: float = 1.0
    timeout_s: float = 5.0
    channels: int = 1  # per endpoint: one HTTP/2 connection each
    progress: bool = True
    watch_pids: tuple[int, ...] = ()  # local server processes whose CPU time to report
    access_key: str = ""  # with secret: sign every request (auth on)
    secret: str = field(default="", repr=False)
    generator: str = "http2"  # who makes the calls: bench/http2.py, or grpc.aio ("grpc")
    follow_routes: bool = True  # each call to its queue's endpoint in the route; False: to `endpoints`

    def validate(self) -> None:
        checks = [
            (self.mode in MODES, f"mode must be one of {', '.join(MODES)}"),
            (bool(self.endpoints) and all(":" in e for e in self.endpoints), "--endpoint wants HOST:PORT[;HOST:PORT]"),
            (bool(self.topic), "--topic must not be empty"),
            (1 <= self.size_bytes <= SIZE_BYTES_MAX, f"--size must be 1..{SIZE_BYTES_MAX} bytes"),
            (self.rate_per_s is None or self.rate_per_s > 0, "--rate must be positive"),
            (0 < self.duration_s <= DURATION_S_MAX, f"--duration must be in (0, {DURATION_S_MAX:g}] s"),
            (0 <= self.warmup_s <= DURATION_S_MAX, "--warmup must not be negative"),
            (1 <= self.concurrency <= CONCURRENCY_MAX, f"--concurrency must be 1..{CONCURRENCY_MAX}"),
            (0 <= self.consumers <= CONCURRENCY_MAX, f"--consumers must be 0..{CONCURRENCY_MAX}"),
            (1 <= self.batch <= BATCH_MAX, f"--batch must be 1..{BATCH_MAX}"),
            (1 <= self.receive_batch <= RECEIVE_BATCH_MAX, f"--receive-batch must be 1..{RECEIVE_BATCH_MAX}"),
            (self.long_poll_s >= 0 and self.invisible_s > 0, "--long-poll must be >= 0 and --invisible > 0"),
            (self.timeout_s > 0, "--timeout must be positive"),
            (1 <= self.channels <= CHANNELS_MAX, f"--channels must be 1..{CHANNELS_MAX}"),
            (self.generator in TRANSPORTS, f"--generator must be one of {', '.join(TRANSPORTS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


async def run_bench(opts: BenchOptions, stop: asyncio.Event) -> dict[str, Any]:
    """Run one bench; raises `CallError` when the setup (connect, QueryRoute) fails."""
    opts.validate()
    send_path = ECHO_SEND_PATH if opts.mode == "echo" else SEND_PATH
    credentials = (opts.access_key, opts.secret) if opts.access_key else None

    def connect(endpoints: Sequence[str]) -> list[BenchClient]:
        return [BenchClient(ep, namespace=opts.namespace, timeout_s=opts.timeout_s, send_path=send_path,
                            credentials=credentials, transport=opts.generator)
                for ep in endpoints for _ in range(opts.channels)]  # fmt: skip

    clients = connect(opts.endpoints)
    try:
        await asyncio.gather(*(c.wait_ready(opts.timeout_s) for c in clients))
        queues = [] if opts.mode == "echo" else await clients[0].query_route(opts.topic)
        if opts.follow_routes:
            routed = connect([ep for ep in route_endpoints(queues) if ep not in opts.endpoints])
            clients += routed
            await _ready_routed(routed, opts)
        result = await _measure(opts, clients, queues, stop)
        result["calls_per_endpoint"] = calls_per_endpoint(clients)
        result["generator"] = clients[0].transport
        return result
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def queue_endpoint(queue: pb.MessageQueue) -> str:
    """HOST:PORT a call about `queue` goes to: the first address of the queue's endpoints (a
    channel to several addresses connects to the first that answers, in order); "" for none."""
    addresses = queue.broker.endpoints.addresses
    return f"{addresses[0].host}:{addresses[0].port}" if addresses else ""


def route_endpoints(queues: Sequence[pb.MessageQueue]) -> list[str]:
    """Every endpoint the route's queues name, in order of first appearance."""
    return list(dict.fromkeys(ep for ep in map(queue_endpoint, queues) if ep))


async def _ready_routed(clients: list[BenchClient], opts: BenchOptions) -> None:
    """Connect to the endpoints the route named; one that cannot be reached fails the setup with a
    hint (an address this machine does not reach: a proxy's `advertise`)."""
    try:
        await asyncio.gather(*(c.wait_ready(opts.timeout_s) for c in clients))
    except CallError as exc:
        raise CallError(exc.code, f"{exc} (an endpoint the route of {opts.topic} names; give --ignore-routes "
                                  "to send every call to --endpoint)") from None  # fmt: skip


def calls_per_endpoint(clients: list[BenchClient]) -> dict[str, int]:
    """Data-plane calls made to each endpoint over the whole run (warm-up included): how the tasks,
    spread over the endpoints, shared the load — a closed loop gives a faster endpoint more calls."""
    calls: dict[str, int] = {}
    for c in clients:
        calls[c.endpoint] = calls.get(c.endpoint, 0) + c.calls
    return calls


async def _measure(
    opts: BenchOptions, clients: list[BenchClient], queues: list[pb.MessageQueue], stop: asyncio.Event
) -> dict[str, Any]:
    run_id = new_run_id()
    start_s = time.monotonic() + START_DELAY_S
    measure_from_s = start_s + opts.warmup_s
    deadline = Deadline(measure_from_s + opts.duration_s, stop)
    meters: dict[str, Meter] = {}
    coros: list[Coroutine[Any, Any, None]] = []
    if opts.mode in ("produce", "echo", "e2e"):
        coros += _produce_loops(opts, clients, queues, meters, deadline, start_s, run_id)
    if opts.mode in ("consume", "e2e"):
        coros += _consume_loops(opts, clients, queues, meters, deadline, run_id)
    window: list[CpuSample] = []
    ended_s = await _run_tasks(coros, list(meters.values()), opts, measure_from_s, deadline, window)
    elapsed_s = max(0.0, min(ended_s, deadline.at_s) - measure_from_s)
    summaries = {name: m.summary(elapsed_s) for name, m in meters.items()}
    primary = meters["ack"] if opts.mode == "consume" else next(iter(meters.values()))
    return {
        "mode": opts.mode,
        "options": {k: v for k, v in asdict(opts).items() if k not in ("mode", "progress", "secret")},
        "measured_s": round(elapsed_s, 3),
        "stopped_early": stop.is_set(),
        "meters": summaries,
        "error_total": sum(s["error_total"] for s in summaries.values()),
        # Per message of the primary meter (sent, or acked for consume), over the measured window.
        "cpu": cpu_between(window[0], window[1], primary.messages) if len(window) == 2 else None,
    }


def _produce_loops(
    opts: BenchOptions, clients: list[BenchClient], queues: list[pb.MessageQueue], meters: dict[str, Meter],
    deadline: Deadline, start_s: float, run_id: str,
) -> list[Coroutine[Any, Any, None]]:  # fmt: skip
    name = "echo" if opts.mode == "echo" else "send"
    send = meters[name] = Meter(name, opts.size_bytes)
    payload = SendPayload(opts.topic, opts.namespace, opts.size_bytes, run_id)
    # On a schedule, the tasks share the rate and are staggered evenly over one interval.
    interval_s = None if opts.rate_per_s is None else opts.batch * opts.concurrency / opts.rate_per_s
    writable = _writable_endpoints(queues) if opts.follow_routes else []
    stagger_s = interval_s / opts.concurrency if interval_s else 0.0
    return [
        produce_loop(_send_rotation(clients, writable, i), payload, send, deadline, batch=opts.batch,
                     interval_s=interval_s, first_s=start_s + i * stagger_s)
        for i in range(opts.concurrency)
    ]  # fmt: skip


def _writable_endpoints(queues: list[pb.MessageQueue]) -> list[str]:
    """The endpoint of each writable queue of the route, in route order (by broker, then queue id)."""
    writable = (pb.WRITE, pb.READ_WRITE)
    ordered = sorted((q for q in queues if q.permission in writable), key=lambda q: (q.broker.name, q.id))
    return [ep for ep in map(queue_endpoint, ordered) if ep]


def _send_rotation(clients: list[BenchClient], writable: list[str], i: int) -> Rotation:
    """Task `i`'s clients: one per writable queue (its endpoint's, channel `i`), starting at queue
    `i`; without a route to follow, the task's one client of the endpoints given (round robin)."""
    if not writable:
        return Rotation([clients[i % len(clients)]])
    by_endpoint: dict[str, list[BenchClient]] = {}
    for c in clients:
        by_endpoint.setdefault(c.endpoint, []).append(c)
    return Rotation([by_endpoint[ep][i % len(by_endpoint[ep])] for ep in writable], start=i)


def _consume_loops(
    opts: BenchOptions, clients: list[BenchClient], queues: list[pb.MessageQueue], meters: dict[str, Meter],
    deadline: Deadline, run_id: str,
) -> list[Coroutine[Any, Any, None]]:  # fmt: skip
    receive = meters["receive"] = Meter("receive", opts.size_bytes)
    ack = meters["ack"] = Meter("ack", opts.size_bytes)
    e2e: Meter | None = None
    if opts.mode == "e2e":
        e2e = meters["e2e"] = Meter("e2e", opts.size_bytes)
    spec = ConsumeSpec(opts.group, opts.topic, opts.receive_batch, opts.invisible_s, opts.long_poll_s, run_id)
    targets = _receive_queues(queues)
    loops = (opts.consumers or opts.concurrency) if opts.mode == "e2e" else opts.concurrency
    return [
        consume_loop(_client_for(clients, targets[i % len(targets)], i), targets[i % len(targets)], spec, receive, ack,
                     deadline, e2e)
        for i in range(loops)
    ]  # fmt: skip


def _client_for(clients: list[BenchClient], queue: pb.MessageQueue, i: int) -> BenchClient:
    """Loop `i`'s client for `queue`: one of the queue's own endpoint when there is one (as the
    official clients receive from the queue's endpoints: with `sluice up --shards N` each queue names
    the shard that owns it; following the route, there always is), else the loops' round robin."""
    addresses = {f"{a.host}:{a.port}" for a in queue.broker.endpoints.addresses}
    own = [c for c in clients if c.endpoint in addresses]
    pool = own or clients
    return pool[i % len(pool)]


async def _run_tasks(
    coros: list[Coroutine[Any, Any, None]], meters: list[Meter], opts: BenchOptions, measure_from_s: float,
    deadline: Deadline, window: list[CpuSample],
) -> float:  # fmt: skip
    """Run the workload tasks until they end; when they ended. Stragglers (long polls, slow calls) get
    one call deadline past the end, then are cancelled. `window` receives the CPU samples taken at the
    start and the end of the measured time."""
    done_event = asyncio.Event()
    tasks = [asyncio.create_task(c) for c in coros]
    watchers = [asyncio.create_task(_sample_window(meters, measure_from_s, deadline, opts.watch_pids, window))]
    if opts.progress:
        watchers.append(asyncio.create_task(progress(meters, measure_from_s - opts.warmup_s, done_event)))
    try:
        grace_s = opts.timeout_s + opts.long_poll_s
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline.at_s - time.monotonic()) + grace_s)
        if deadline.stop.is_set() and pending:  # a signal: do not wait for long polls
            _, pending = await asyncio.wait(pending, timeout=0.5)
        for t in pending:
            t.cancel()
        ended_s = time.monotonic()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t  # re-raises a loop's unexpected failure
        if len(window) == 1:  # stopped early: close the window now
            window.append(CpuSample.take(opts.watch_pids))
        return ended_s
    finally:
        done_event.set()
        for t in [*tasks, watchers[0]]:
            t.cancel()
        await asyncio.gather(*tasks, *watchers, return_exceptions=True)


async def _sample_window(
    meters: list[Meter], measure_from_s: float, deadline: Deadline, pids: tuple[int, ...], window: list[CpuSample]
) -> None:
    """At the end of the warm-up: reset the meters and take the first CPU sample; the second at the deadline."""
    await asyncio.sleep(max(0.0, measure_from_s - time.monotonic()))
    if deadline.stop.is_set():
        return
    for m in meters:
        m.reset()
    window.append(CpuSample.take(pids))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(deadline.stop.wait(), max(0.0, deadline.at_s - time.monotonic()))
    window.append(CpuSample.take(pids))


def _receive_queues(queues: list[pb.MessageQueue]) -> list[pb.MessageQueue]:
    """One readable queue per broker (queue id 0 preferred): the proxy pops from any queue of it."""
    by_broker: dict[str, pb.MessageQueue] = {}
    readable = (pb.READ, pb.READ_WRITE)
    for q in sorted(queues, key=lambda q: q.id):
        if q.permission in readable and q.broker.name not in by_broker:
            by_broker[q.broker.name] = q
    if not by_broker:
        raise ConfigError("the topic's route has no readable queue")
    return [by_broker[b] for b in sorted(by_broker)]
