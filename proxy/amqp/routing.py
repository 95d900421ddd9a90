"""Which queues a publish reaches: the exchange types' routing rules over a vhost's bindings,
following exchange-to-exchange bindings (each exchange visited once, so cycles end)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from pamqp import commands, header

from proxy.amqp.meta import DIRECT, FANOUT, HEADERS, TOPIC, Args, BindingMeta, QueueMeta, VhostMeta, jsonable

Headers = Callable[[], dict[str, object]]


def route(
    vhost: VhostMeta, exchange: str, routing_key: str, headers: Headers = dict
) -> tuple[list[QueueMeta], list[str]]:
    """Where a message published to `exchange` (which exists) with `routing_key` goes: the queues,
    each once, in binding order, and the RocketMQ topics of the mapped exchanges (`x-sluice-topic`)
    it reaches (`exchange` itself and those reached through exchange-to-exchange bindings), each
    topic once, in the order reached. `headers` gives the message's headers (asked for only when
    a headers exchange is on the way)."""
    if exchange == "":  # the default exchange: every queue is bound by its name
        queue = vhost.queues.get(routing_key)
        return ([] if queue is None else [queue]), []
    names: dict[str, None] = {}
    seen = {exchange: None}  # exchanges reached, in the order reached
    frontier = [exchange]
    cached: list[dict[str, object]] = []

    def message_headers() -> dict[str, object]:
        if not cached:
            cached.append(headers())
        return cached[0]

    while frontier:
        source = frontier.pop(0)
        kind = vhost.exchange_type(source)
        for b in vhost.bindings:
            if b.exchange != source or not _matches(kind, b, routing_key, message_headers):
                continue
            if b.to_exchange:
                if b.queue not in seen:
                    seen[b.queue] = None
                    frontier.append(b.queue)
            elif b.queue not in names:
                names[b.queue] = None
    topics: dict[str, None] = {}
    if vhost.exchanges:
        for name in seen:
            meta = vhost.exchanges.get(name)
            if meta is not None and meta.topic is not None:
                topics[meta.topic] = None
    return [vhost.queues[n] for n in names if n in vhost.queues], list(topics)


def _matches(kind: str | None, b: BindingMeta, routing_key: str, headers: Headers) -> bool:
    if kind == FANOUT:
        return True
    if kind == DIRECT:
        return b.routing_key == routing_key
    if kind == TOPIC:
        return topic_matches(b.routing_key, routing_key)
    if kind == HEADERS:
        return headers_match(b.arguments, headers())
    return False


def headers_match(arguments: Args, headers: dict[str, object]) -> bool:
    """A headers exchange's binding against a message's headers: `x-match` all (the default) or
    any, and all-with-x / any-with-x to compare `x-` keys too; a binding value that is None asks
    only for the key's presence."""
    mode = str(arguments.get("x-match", "all"))
    with_x = mode.endswith("-with-x")
    wanted = {k: v for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))}
    got = {k: jsonable(v) for k, v in headers.items()}
    hits = [k in got and (v is None or got[k] == v) for k, v in wanted.items()]
    if mode.startswith("any"):
        return any(hits)
    return all(hits)


def decode_headers(properties: bytes) -> dict[str, object]:
    """The headers table of a content header's property bytes (flags and values); {} when there
    is none. The bytes were checked when the publish arrived (proxy/amqp/frames.py)."""
    if not properties:
        return {}
    return dict(decode_properties(properties).headers or {})


def decode_properties(raw: bytes) -> commands.Basic.Properties:
    """A content header's property bytes (flags and values) decoded; empty ones for no bytes."""
    props = commands.Basic.Properties()
    if raw:
        offset, flags = header.ContentHeader._get_flags(raw)
        props.unmarshal(flags, raw[offset:])
    return props


@lru_cache(maxsize=4096)
def topic_matches(pattern: str, key: str) -> bool:
    """A topic exchange's binding pattern against a routing key: words split on '.', '*' is one
    word, '#' zero or more."""
    words, parts = key.split("."), pattern.split(".")
    # reach[j]: the first i pattern words can match the first j key words
    reach = [True] + [False] * len(words)
    for part in parts:
        nxt = [False] * (len(words) + 1)
        for j in range(len(words) + 1):
            if part == "#":
                nxt[j] = reach[j] or (j > 0 and nxt[j - 1])
            elif j > 0 and reach[j - 1] and (part == "*" or part == words[j - 1]):
                nxt[j] = True
        reach = nxt
    return reach[len(words)]
