"""Topic filters (common/litefilter.py) and the MQTT topic mapping (proxy/mqtt/topics.py): the trie
finds exactly the filters a brute-force match finds, escaping is reversible, and matching escaped
filters against escaped names is MQTT's matching of the topics they spell."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.litefilter import FilterTrie, matches
from common.model import validate_lite_filter, validate_lite_topic_name
from proxy.litenames import lite_name, lite_of_routing_key, mqtt_topic, routing_key_of
from proxy.mqtt.codes import MqttError
from proxy.mqtt.topics import Filter, TopicMap, bind_name, parse_filter

level = st.sampled_from(["a", "b", "c", "", "$x", "é", "a b", "=", "|"])
topics = st.lists(level, min_size=1, max_size=4).map("/".join)
filter_level = st.sampled_from(["a", "b", "", "$x", "+", "é"])


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(filter_level, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


def mqtt_match(topic_filter: str, topic: str) -> bool:
    """MQTT 4.7 written out plainly, as the reference."""
    f, t = topic_filter.split("/"), topic.split("/")
    if f[0] in ("+", "#") and topic.startswith("$"):
        return False
    for i, lv in enumerate(f):
        if lv == "#":
            return True
        if i >= len(t) or (lv != "+" and lv != t[i]):
            return False
    return len(f) == len(t)


@settings(max_examples=300, deadline=None)
@given(fs=st.lists(filters(), min_size=1, max_size=12), names=st.lists(topics, min_size=1, max_size=8))
def test_trie_matches_as_mqtt_does_on_escaped_names(fs: list[str], names: list[str]) -> None:
    trie: FilterTrie[int] = FilterTrie()
    escaped = [Filter(f, f).lite_filter() for f in fs]
    for i, f in enumerate(escaped):
        trie.add(f, i)
    for name in names:
        want = {i for i, f in enumerate(fs) if mqtt_match(f, name)}
        assert trie.match(lite_name(name)) == want
        assert {i for i, f in enumerate(escaped) if matches(f, lite_name(name))} == want
    for i, f in enumerate(escaped):
        trie.remove(f, i)
    assert trie.count == 0 and list(trie.filters()) == []


@settings(max_examples=300, deadline=None)
@given(topic=topics)
def test_lite_names_are_valid_and_reversible(topic: str) -> None:
    name = lite_name(topic)
    if name:
        validate_lite_topic_name(name, 10_000)
    assert mqtt_topic(name) == topic


def test_names() -> None:
    assert lite_name("home kitchen/t") == "home=20kitchen/t"
    assert lite_name("a=b") == "a=3Db" and mqtt_topic("a=3Db") == "a=b"
    assert mqtt_topic("own=name") == "own=name"  # a RocketMQ producer's own '=' stays
    assert bind_name("$SYS") == "|24SYS" and bind_name("") == "|" and bind_name("sensors") == "sensors"
    assert bind_name("a|b.c") == "a|7Cb|2Ec"
    validate_lite_filter(Filter("+/é/#", "+/é/#").lite_filter(), 64)


@settings(max_examples=300, deadline=None)
@given(topic=topics)
def test_amqp_routing_keys_name_the_same_lite_topics(topic: str) -> None:
    """A routing key is the MQTT topic with '.' and '/' swapped (RabbitMQ's MQTT plugin does the same)."""
    key = topic.translate(str.maketrans("./", "/."))
    assert lite_of_routing_key(key) == lite_name(topic)
    assert routing_key_of(lite_name(topic)) == key


def test_routing_keys() -> None:
    assert lite_of_routing_key("sensors.kitchen.temp") == "sensors/kitchen/temp"
    assert routing_key_of("sensors/kitchen/temp") == "sensors.kitchen.temp"
    assert lite_of_routing_key("v1/a.b") == "v1.a/b"


def test_filters_and_shares() -> None:
    assert parse_filter("$share/g/a/+") == Filter("$share/g/a/+", "a/+", "g")
    for bad in ("a/#/b", "a+", "", "$share/g", "$share//a", "$share/g+/a", "$share/g/a/#/b"):
        with pytest.raises(MqttError):
            parse_filter(bad)
    assert parse_filter("#").wild_first and not parse_filter("a/#").wild_first


def test_topic_map_prefixes_and_limits() -> None:
    m = TopicMap({"factory/line1/": "line1"}, 64)
    assert m.bind_of("factory/line1/press") == "line1" and m.bind_of("factory/line2/x") == "factory"
    assert m.binds_of_filter(parse_filter("factory/#")) == ["factory", "line1"]
    assert m.binds_of_filter(parse_filter("factory/line1/+")) == ["line1"]
    assert m.binds_of_filter(parse_filter("+/x")) is None
    with pytest.raises(MqttError):
        m.lite_of("x" * 65)
