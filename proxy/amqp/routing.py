"""Which queues a publish reaches: the exchange types' routing rules over a vhost's bindings."""

from __future__ import annotations

from functools import lru_cache

from proxy.amqp.meta import DIRECT, FANOUT, TOPIC, QueueMeta, VhostMeta


def route(vhost: VhostMeta, exchange: str, routing_key: str) -> list[QueueMeta]:
    """The queues a message published to `exchange` (which exists) with `routing_key` goes to,
    each once, in binding order."""
    if exchange == "":  # the default exchange: every queue is bound by its name
        queue = vhost.queues.get(routing_key)
        return [] if queue is None else [queue]
    kind = vhost.exchange_type(exchange)
    names: dict[str, None] = {}
    for b in vhost.bindings:
        if b.exchange != exchange or b.queue in names:
            continue
        if (
            kind == FANOUT
            or (kind == DIRECT and b.routing_key == routing_key)
            or (kind == TOPIC and topic_matches(b.routing_key, routing_key))
        ):
            names[b.queue] = None
    return [vhost.queues[n] for n in names if n in vhost.queues]


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
