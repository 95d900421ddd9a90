"""Hostile input at the gRPC edge, both topologies: bytes that do not parse, enum numbers from newer
clients, long polls longer than the call's deadline, absurd durations, requests over the size cap.
Raw requests through the official client's stubs and channels (tests/e2e/support/raw.py)."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from tests.e2e.support import fuzz, raw
from tests.e2e.support.cluster import Cluster

SERVICE = "/apache.rocketmq.v2.MessagingService/"
UNDECODABLE = b"\x83"  # a field header whose varint never ends


@pytest.fixture(scope="module")
def names(cluster: Cluster) -> tuple[str, str]:
    return cluster.create_topic(f"hostile-{cluster.kind}", queues=2), cluster.create_group(f"hostile-{cluster.kind}")


def _undecodable_total(cluster: Cluster) -> float:
    found = 0.0
    for address in cluster.ops.values():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        found += sum(float(v) for v in re.findall(r"^sluice_proxy_undecodable_requests_total\{[^}]*\} (\S+)$", text,
                                                  flags=re.MULTILINE))  # fmt: skip
    return found


def _status_name(rpc: str, frame: bytes) -> str:
    outcome = fuzz._status_outcome(rpc, frame)
    assert outcome is not None, f"{rpc} answered a frame without a status"
    return outcome.removeprefix("status:")


def test_undecodable_bytes_get_bad_request_on_every_rpc(cluster: Cluster) -> None:
    """Before: gRPC UNKNOWN ('Unexpected <class DecodeError>') and an ERROR traceback per request."""
    before = _undecodable_total(cluster)
    md = raw.headers()
    with grpc.insecure_channel(cluster.first_proxy) as channel:
        for rpc, method in fuzz.METHODS.items():
            if method.client_streaming:
                continue
            if method.server_streaming:
                frames = list(channel.unary_stream(SERVICE + rpc)(UNDECODABLE, metadata=md, timeout=raw.RPC_TIMEOUT_S))
                assert [_status_name(rpc, f) for f in frames] == ["BAD_REQUEST"], rpc
            else:
                reply = channel.unary_unary(SERVICE + rpc)(UNDECODABLE, metadata=md, timeout=raw.RPC_TIMEOUT_S)
                assert _status_name(rpc, reply) == "BAD_REQUEST", rpc
        # Telemetry: the garbage command is answered with a status, and the stream goes on to
        # answer the Settings that follow it.
        settings = spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER)).SerializeToString()
        commands = iter([UNDECODABLE, settings])
        stream = channel.stream_stream(SERVICE + "Telemetry")(commands, metadata=md, timeout=raw.RPC_TIMEOUT_S)
        replies = [spb.TelemetryCommand.FromString(f) for f in stream]
    assert [(raw.code_name(r.status.code), r.WhichOneof("command")) for r in replies] == [
        ("BAD_REQUEST", None), ("OK", "settings")]  # fmt: skip
    assert _undecodable_total(cluster) - before == len(fuzz.METHODS)


def test_settings_with_a_language_from_a_newer_client_are_answered(cluster: Cluster, names: tuple[str, str]) -> None:
    """Before: Language.Name(13) raised, the stream ended with OK and no settings reply."""
    topic, _ = names
    settings = pb.Settings(client_type=pb.PRODUCER, request_timeout=Duration(seconds=3))
    settings.publishing.topics.add(name=topic)
    settings.user_agent.language = 13  # not in this version's Language enum
    settings.user_agent.version = "9.9.9"
    with raw.stub(cluster.first_proxy) as s:
        replies = list(s.Telemetry(iter([spb.TelemetryCommand(settings=settings)]), metadata=raw.headers(),
                                   timeout=raw.RPC_TIMEOUT_S))  # fmt: skip
    assert [(raw.code_name(r.status.code), r.WhichOneof("command")) for r in replies] == [("OK", "settings")]
    assert replies[0].settings.publishing.max_body_size > 0


def test_settings_naming_a_malformed_group_get_a_status_and_the_stream_stays(cluster: Cluster) -> None:
    bad = pb.Settings(client_type=pb.SIMPLE_CONSUMER)
    bad.subscription.group.name = "not a group!"
    good = pb.Settings(client_type=pb.PRODUCER)
    commands = iter([spb.TelemetryCommand(settings=bad), spb.TelemetryCommand(settings=good)])
    with raw.stub(cluster.first_proxy) as s:
        replies = list(s.Telemetry(commands, metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S))
    assert [(raw.code_name(r.status.code), r.WhichOneof("command")) for r in replies] == [
        ("ILLEGAL_CONSUMER_GROUP", None), ("OK", "settings")]  # fmt: skip


def _pull(cluster: Cluster, names: tuple[str, str], long_poll: Duration, timeout_s: float) -> Iterator[str]:
    topic, group = names
    request = spb.PullMessageRequest(
        group=raw.resource(group), offset=0, batch_size=8, long_polling_timeout=long_poll,
        message_queue=pb.MessageQueue(topic=raw.resource(topic), id=0, broker=pb.Broker(name=cluster.brokers[0])),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
    )  # fmt: skip
    with raw.stub(cluster.first_proxy) as s:
        for frame in s.PullMessage(request, metadata=raw.headers(), timeout=timeout_s):
            if frame.HasField("status"):
                yield raw.code_name(frame.status.code)


def test_pull_long_poll_ends_before_the_call_deadline(cluster: Cluster, names: tuple[str, str]) -> None:
    """A 20 s long poll on a call with a 4 s deadline. Before: DEADLINE_EXCEEDED (the poll ignored it)."""
    started = time.monotonic()
    assert list(_pull(cluster, names, Duration(seconds=20), timeout_s=4.0)) == ["MESSAGE_NOT_FOUND"]
    assert time.monotonic() - started > 1.0  # it did poll: an empty queue is not answered at once


@pytest.mark.parametrize("long_poll", [Duration(seconds=-5), Duration(seconds=10**15), Duration(seconds=1, nanos=-1)])
def test_absurd_long_polls_are_refused_naming_the_field(cluster: Cluster, names: tuple[str, str],
                                                        long_poll: Duration) -> None:  # fmt: skip
    topic, group = names
    assert list(_pull(cluster, names, long_poll, timeout_s=raw.RPC_TIMEOUT_S)) == ["ILLEGAL_POLLING_TIME"]
    request = raw.receive_request(topic, group)
    request.long_polling_timeout.CopyFrom(long_poll)
    with raw.stub(cluster.first_proxy) as s:
        frames = list(s.ReceiveMessage(request, metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S))
    assert [raw.code_name(f.status.code) for f in frames] == ["ILLEGAL_POLLING_TIME"]
    assert "long_polling_timeout" in frames[0].status.message


def test_out_of_range_times_name_the_field(cluster: Cluster, names: tuple[str, str]) -> None:
    topic, group = names
    msg = raw.message(topic)
    msg.system_properties.born_timestamp.seconds = 2**62
    with raw.stub(cluster.first_proxy) as s:
        response = raw.send(s, msg)
        assert raw.code_name(response.status.code) == "BAD_REQUEST"
        assert "born_timestamp" in response.status.message
        request = raw.receive_request(topic, group)
        request.invisible_duration.CopyFrom(Duration(seconds=2**62))
        frames = list(s.ReceiveMessage(request, metadata=raw.headers(), timeout=raw.RPC_TIMEOUT_S))
    assert [raw.code_name(f.status.code) for f in frames] == ["ILLEGAL_INVISIBLE_TIME"]
    assert "invisible_duration" in frames[0].status.message


def test_a_request_over_the_size_cap_is_refused_by_grpc(cluster: Cluster, names: tuple[str, str]) -> None:
    """Before: 130 MiB were accepted (and parsed) per request."""
    topic, _ = names
    with raw.stub(cluster.first_proxy) as s, pytest.raises(grpc.RpcError) as refused:
        raw.send(s, *(raw.message(topic, b"x" * (3 * 1024 * 1024)) for _ in range(3)))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
