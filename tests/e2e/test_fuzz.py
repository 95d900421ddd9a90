"""The project's own fuzzer (tests/e2e/support/fuzz.py) against both topologies, CI-sized: a few
hundred generated and byte-mutated requests over every MessagingService RPC, sent by eight
threads. No answer may be INTERNAL or UNKNOWN (status or gRPC), lose the connection or outlive its
deadline; the processes must still run (teardown checks their exit codes) and the official client
must still produce and consume afterwards. tests/bench/fuzz_bench.py is the long run."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

import grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from tests.e2e.support import fuzz
from tests.e2e.support.cluster import Cluster

EXAMPLES = 18  # each one request per RPC (17), per topology
WORKERS = 17


def run(target: fuzz.Target, batch: list[fuzz.Request]) -> collections.Counter[tuple[str, str]]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(target.address, options=options) as channel, ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(lambda r: fuzz.call(channel, r), batch))
    bad = [(r, o) for r, o in zip(batch, outcomes, strict=True) if fuzz.is_bad(o)]
    assert not bad, f"{len(bad)} requests got a bad answer, e.g. {bad[:5]}"
    return collections.Counter((r.rpc, o) for r, o in zip(batch, outcomes, strict=True))


def test_fuzzed_requests_get_clear_answers(cluster: Cluster, unique: object) -> None:
    topic = cluster.create_topic(f"fuzz-{cluster.kind}", queues=2)
    group = cluster.create_group(f"fuzz-{cluster.kind}")
    target = fuzz.Target(cluster.first_proxy, topic, group, tuple(cluster.brokers))
    one_each = st.tuples(*(fuzz.requests(target, rpc) for rpc in sorted(fuzz.METHODS)))
    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    # Each example is one request per RPC, sent concurrently. No shrinking: a failure prints the
    # offending requests and their answers instead.
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(one_each)
    def fuzz_once(batch: tuple[fuzz.Request, ...]) -> None:
        seen.update(run(target, list(batch)))

    fuzz_once()
    assert sum(seen.values()) == EXAMPLES * len(fuzz.METHODS)
    assert {rpc for rpc, _ in seen} == set(fuzz.METHODS)
    assert any(o == "status:BAD_REQUEST" for _, o in seen), seen  # garbage bytes were among them

    # The official client still works on the same proxy.
    config = ClientConfiguration(cluster.endpoints, Credentials(), request_timeout=5)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        message = Message()
        message.topic, message.body = topic, b"after the fuzzing"
        producer.send(message)
        bodies = []
        for _ in range(10):
            for received in consumer.receive(16, 10):
                consumer.ack(received)
                bodies.append(received.body)
            if b"after the fuzzing" in bodies:
                break
        assert b"after the fuzzing" in bodies
    finally:
        producer.shutdown()
        consumer.shutdown()
