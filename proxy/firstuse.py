"""Topics created on first use: one definition for the cluster, decided once (docs/shards.md,
"Topics, groups and admin").

Brokers hold the definitions (each its copy: queues, accepted types, permission); the NameServer
only gathers them. A topic that any broker of the cluster holds is never created on first use on
another: its definition (which brokers, how many queues, what types) is the one it was created
with. A topic no broker holds is created by the first broker, by name, that creates topics on
first use (the metadata home broker: shard-0 under `sluice up`, as for the AMQP gateway's
document), and that broker's answer is the definition; a directory that spreads such topics over
more brokers (merged nodes) gives the others that definition (`get_topic(like=...)`), never one of
their own. Two proxies creating the same topic at once ask the same broker first, which creates
it once, so they spread one definition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from broker.client.api import MessagingApi, TopicSpec
from common.errors import SluiceError, TopicNotFound
from common.model import is_system_topic


async def held(topic: str, brokers: Mapping[str, MessagingApi]) -> tuple[dict[str, TopicSpec], list[str]]:
    """The copies of `topic` the brokers hold (by broker), and the brokers that did not answer.
    Asked directly: a NameServer that restarted moments ago may not list every copy yet."""
    names = list(brokers)
    answers = await asyncio.gather(*(brokers[n].get_topic(topic) for n in names), return_exceptions=True)
    found: dict[str, TopicSpec] = {}
    unanswered: list[str] = []
    for name, answer in zip(names, answers, strict=True):
        if isinstance(answer, TopicSpec):
            found[name] = answer
        elif isinstance(answer, SluiceError):
            if not isinstance(answer, TopicNotFound):
                unanswered.append(name)
        else:
            raise answer
    return found, unanswered


async def create(topic: str, brokers: Mapping[str, MessagingApi]) -> tuple[str, TopicSpec]:
    """`topic` created by the first of `brokers` by name that creates topics on first use: that
    broker and its definition. TopicNotFound when none does, or for a system topic's name."""
    refuse_system(topic)
    for name in sorted(brokers):
        try:
            return name, await brokers[name].get_topic(topic, auto_create=True)
        except TopicNotFound:
            continue  # this broker does not create topics on first use
        except SluiceError:
            continue  # not answering: the next one by name decides (every proxy skips it alike)
    raise TopicNotFound(f"topic {topic} does not exist (and no broker creates topics on first use)")


def refuse_system(topic: str) -> None:
    """TopicNotFound for a system topic's name: brokers make their dead-letter topics themselves."""
    if is_system_topic(topic):
        raise TopicNotFound(f"topic {topic} does not exist: topics named %... are made by the brokers themselves (a "
                            "group's dead-letter topic with its first dead letter), never on first use")  # fmt: skip
