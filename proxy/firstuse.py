"""Topics and consumer groups created on first use: one definition for the cluster, decided once
(docs/shards.md, "Topics, groups and admin").

Brokers hold the definitions (each its copy: queues, accepted types, permission); the NameServer
only gathers them. A topic that any broker of the cluster holds is never created on first use on
another: its definition (which brokers, how many queues, what types) is the one it was created
with. A topic no broker holds is created by the first broker, by name, that creates topics on
first use (the metadata home broker: shard-0 under `sluice up`, as for the AMQP gateway's
document), and that broker's answer is the definition; a directory that spreads such topics over
more brokers (merged nodes) gives the others that definition (`get_topic(like=...)`), never one of
their own. Two proxies creating the same topic at once ask the same broker first, which creates
it once, so they spread one definition. A consumer group likewise (`ensure_group`): a broker that
lacks it (one that joined later) gets the definition another broker holds, never its defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from broker.client.api import GroupInfo, GroupSpec, MessagingApi, TopicSpec
from common.errors import ConsumerGroupNotFound, SluiceError, TopicNotFound
from common.model import is_system_topic

_UNANSWERED = object()  # a broker that did not answer whether it holds a group
# How long a group's creation waits for each broker (a stalled one is left out; settings and
# heartbeats come again).
GROUP_WAIT_S = 2.0


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


async def ensure_group(brokers: Sequence[tuple[str, MessagingApi]], group: str, wait_s: float) -> GroupInfo | None:
    """`group` on every broker of `brokers` (by name) that answers within `wait_s` and creates
    groups on first use, as the cluster defines it: as the first broker holding it has it (created
    with `sluice admin`, or on first use before; a FIFO group stays FIFO on a broker that joined
    later), else as the first broker that creates it on first use decides (its defaults). The
    definition; None when no broker holds or creates it. A broker that does not answer in time is
    left to the client's next settings or heartbeat, which do not wait for it either."""

    async def holds(api: MessagingApi) -> GroupInfo | object | None:
        try:
            return await asyncio.wait_for(api.get_group(group), wait_s)
        except ConsumerGroupNotFound:
            return None
        except (SluiceError, TimeoutError):
            return _UNANSWERED

    answers = await asyncio.gather(*(holds(api) for _, api in brokers))
    definition = next((a for a in answers if isinstance(a, GroupInfo)), None)
    lacking = [api for (_, api), a in zip(brokers, answers, strict=True) if a is None]
    if definition is None:
        for api in list(lacking):
            lacking.remove(api)
            try:
                definition = await asyncio.wait_for(api.get_group(group, auto_create=True), wait_s)
                break
            except (SluiceError, TimeoutError):
                continue  # does not create groups on first use, or stalled: the next one decides
    if definition is not None and lacking:
        spec = definition.spec
        await asyncio.gather(*(_create_group(api, group, spec, wait_s) for api in lacking))
    return definition


async def _create_group(api: MessagingApi, group: str, like: GroupSpec, wait_s: float) -> None:
    with contextlib.suppress(SluiceError, TimeoutError):
        await asyncio.wait_for(api.get_group(group, auto_create=True, like=like), wait_s)
