"""Pure parts of lite topics and priority messages: names, key layouts, conversions, admin parsing."""

from __future__ import annotations

import pytest

from admin.parse import parse_duration_s, parse_message_types
from broker.client import grpc_convert as convert
from broker.client.api import LiteAction, LiteOffset, LiteOffsetPolicy, LiteSync, TopicSpec
from broker.lite import keys as K
from broker.priority import EmptyLevels, level_of, level_queue, pop_queues, priority_of
from common import record
from common.config import ConfigError
from common.errors import BadRequest, IllegalLiteTopic, MessageTypeConflict
from common.model import MessageType, validate_lite_topic_name
from common.record import SYSPROP_PRIORITY, MessageRecord, outgoing
from proxy.context import RequestContext
from proxy.grpc.lite import python_split_name


@pytest.mark.parametrize("name", ["", "x" * 65, "has space", "tab\t", "plus+", "%RETRY%x", "é"])
def test_bad_lite_topic_names_are_refused(name: str) -> None:
    with pytest.raises(IllegalLiteTopic):
        validate_lite_topic_name(name, 64)


def test_good_lite_topic_names_pass() -> None:
    for name in ("a", "chat-42", "user@tenant:session.7", "k=v#1", "x" * 64, "sensors/kitchen/t"):
        assert validate_lite_topic_name(name, 64) == name


def test_priority_range_and_queues() -> None:
    spec = TopicSpec("p", 1, frozenset({MessageType.PRIORITY}), max_priority=3)

    def msg(level: str) -> MessageRecord:
        return record.decode(outgoing(b"x", "id", MessageType.PRIORITY, system_properties={SYSPROP_PRIORITY: level}))

    assert priority_of(msg("3"), spec) == 3
    for bad in ("4", "-1", "high"):
        with pytest.raises(BadRequest):
            priority_of(msg(bad), spec)
    assert [level_of(q) for q in pop_queues(spec)] == [3, 2, 1, 0]
    assert level_of(level_queue(7)) == 7


def test_lite_key_layouts_round_trip_and_order() -> None:
    key = K.subr_key(7, "chat-1", "group-a", "client-b")
    assert K.parse_subr_tail(key, len(K.subr_prefix(7, "chat-1"))) == ("group-a", "client-b")
    sub = K.sub_key("group-a", 7, "client-b", "chat-1")
    assert K.parse_group_client(sub, len(K.group_prefix("group-a", 7))) == ("client-b", "chat-1")
    assert K.exp_key(1, 9, "zz") < K.exp_key(2, 0, "a"), "the expiry index is ordered by deadline first"
    assert K.parse_exp_key(K.exp_key(1_700_000_000_000, 7, "chat:1")) == (1_700_000_000_000, 7, "chat:1")
    assert K.next_prefix(b"ab\xff") == b"ac"


def test_lite_sync_converts_both_ways() -> None:
    for offset in (None, LiteOffset(LiteOffsetPolicy.MAX), LiteOffset(offset=5), LiteOffset(tail_n=2),
                   LiteOffset(timestamp_ms=123)):  # fmt: skip
        sync = LiteSync("g", "t", "c", LiteAction.COMPLETE_ADD, ("a", "b"), 3, offset, 10)
        assert convert.lite_sync_from_pb(convert.lite_sync_to_pb(sync)) == sync


def test_topic_spec_attributes_travel_and_default_when_absent() -> None:
    spec = TopicSpec("p", 2, frozenset({MessageType.PRIORITY}), max_priority=5, lite_expiration_s=30, max_lite_topics=9)
    assert convert.topic_spec_from_pb(convert.topic_spec_to_pb(spec)) == spec
    old = convert.pb.TopicSpec(name="n", queue_count=1, message_types=[1], permission=4)  # from an older sender
    got = convert.topic_spec_from_pb(old)
    assert (got.max_priority, got.lite_expiration_s, got.max_lite_topics) == (9, 600, 0)


def test_admin_parses_lite_and_priority_types_and_durations() -> None:
    assert parse_message_types("lite") == frozenset({MessageType.LITE})
    assert parse_message_types("priority") == frozenset({MessageType.PRIORITY})
    with pytest.raises(ConfigError):
        parse_message_types("lite,normal")
    assert [parse_duration_s(t, "--x") for t in ("90", "30s", "10m", "2h", "1d")] == [90, 30, 600, 7200, 86400]
    for bad in ("", "0", "m", "5w", "-3s"):
        with pytest.raises(ConfigError):
            parse_duration_s(bad, "--x")


def test_python_split_subscribe_name_is_recognised_only_where_it_can_happen() -> None:
    py = RequestContext("r", "c", language="PYTHON", client_version="5.1.2", peer="peer")
    node = RequestContext("r", "c", language="NODE_JS", client_version="1.0.8", peer="peer")
    assert python_split_name(py, LiteAction.PARTIAL_ADD, list("chat-a"))
    assert not python_split_name(py, LiteAction.PARTIAL_ADD, ["a"])
    assert not python_split_name(py, LiteAction.COMPLETE_ADD, list("chat-a"))
    assert not python_split_name(node, LiteAction.PARTIAL_ADD, list("chat-a"))
    assert not python_split_name(py, LiteAction.PARTIAL_ADD, ["ab", "c"])


def test_proxy_refuses_a_priority_or_lite_topic_on_the_wrong_type() -> None:
    from proto.apache.rocketmq.v2 import definition_pb2 as pb
    from proxy.grpc import convert as edge

    msg = pb.Message(body=b"x")
    msg.topic.name = "t"
    msg.system_properties.message_id = "id"
    msg.system_properties.message_type = pb.FIFO
    msg.system_properties.message_group = "g"
    msg.system_properties.priority = 1
    with pytest.raises(MessageTypeConflict):
        edge.outgoing(msg, "peer")
    msg.system_properties.message_type = pb.PRIORITY
    msg.system_properties.ClearField("message_group")
    assert record.decode(edge.outgoing(msg, "peer")).system_properties[SYSPROP_PRIORITY] == "1"


def test_empty_levels_hold_until_a_dispatch_or_a_forget() -> None:
    levels = EmptyLevels()
    assert not levels.is_drained("g", "t", 65545)
    levels.drained("g", "t", 65545)
    assert levels.is_drained("g", "t", 65545) and not levels.is_drained("g2", "t", 65545)
    levels.dispatched("t", 65545)
    assert not levels.is_drained("g", "t", 65545), "a write to the level makes it worth reading"
    levels.drained("g", "t", 65545)
    levels.drained("g2", "t", 65544)
    levels.forget("g", "t")
    assert not levels.is_drained("g", "t", 65545) and levels.is_drained("g2", "t", 65544)
    levels.forget(None, "t")
    assert not levels.is_drained("g2", "t", 65544)


def test_recent_lite_records_keep_the_latest_used_and_forget_the_idle() -> None:
    """LiteState's cache: two generations of `size` each. The `size` most recently used records
    are always held, never more than twice that; a record used in the previous generation moves
    forward; one unused for two generations is forgotten; `pop` removes one from both."""
    from broker.lite.state import LiteRecord, _Recent

    cache = _Recent(3)
    recs = {f"n{i}": LiteRecord(i, 0, 0) for i in range(8)}
    for name in ("n0", "n1", "n2"):
        cache.put(1, name, recs[name])
    assert cache.get_many(1, ["n0", "n1", "n2"]) == ({n: recs[n] for n in ("n0", "n1", "n2")}, [])
    cache.put(1, "n3", recs["n3"])  # a new generation: n0..n2 are the previous one
    found, missing = cache.get_many(1, ["n0", "n3", "n7"])
    assert found == {"n0": recs["n0"], "n3": recs["n3"]} and missing == ["n7"]
    for name in ("n4", "n5", "n6"):  # n0 moved forward; n1, n2 stay behind in the generation that goes
        cache.put(1, name, recs[name])
    found, missing = cache.get_many(1, [f"n{i}" for i in range(7)])
    assert sorted(found) == ["n0", "n3", "n4", "n5", "n6"] and missing == ["n1", "n2"]
    assert cache.get_many(2, ["n0"]) == ({}, ["n0"])  # per bind topic
    cache.pop(1, "n0")
    assert cache.get_many(1, ["n0"]) == ({}, ["n0"])
