"""Telemetry: the bidirectional stream every client keeps open with each proxy it uses.

Each client Settings gets an immediate reply (status OK + effective settings). Writes go through a
small bounded queue, because some clients stop reading the stream (the Python push consumer does
after its first settings): a full queue drops settings replies instead of
blocking the proxy. The server never ends the stream; it ends when the client closes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import cast

from broker.client.api import GroupInfo
from common.errors import BadRequest, SluiceError
from common.logs import kv
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy import firstuse
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.core.checkback import Deliver
from proxy.core.lite import Notify
from proxy.grpc import convert, lite, transaction
from proxy.grpc.settings import settings_reply
from proxy.grpc.status import status_of

log = logging.getLogger("sluice.proxy.telemetry")

MAX_QUEUED_COMMANDS = 16
# How long a client's settings reply waits for its group to be created on the other brokers.
GROUP_CREATE_WAIT_S = firstuse.GROUP_WAIT_S


async def _group_info(app: ProxyApp, group: str) -> GroupInfo | None:
    """The group's settings as the cluster defines them, the group created on first use on every
    broker (where they auto-create) with that definition (proxy/firstuse.py). A group starting from
    "latest" starts at its creation on each broker: created on one broker only, it would be created
    on another at the client's first receive or heartbeat there (a second after its start), and skip
    what a producer sent to that broker in between (seen with `sluice up --shards 2` and the README's
    snippet). Bounded: a stalled broker does not hold the client's settings reply."""
    brokers = [(name, app.directory.broker(name)) for name in app.directory.broker_names()]
    return await firstuse.ensure_group(brokers, group, GROUP_CREATE_WAIT_S)


def language_name(value: int) -> str:
    """The Language enum's name of `value`; a number no name is known for (a language added by a
    newer client) as its decimal digits, never an error."""
    try:
        return pb.Language.Name(cast(pb.Language, value))
    except ValueError:
        return str(value)


async def on_settings(app: ProxyApp, ctx: RequestContext, settings: pb.Settings) -> spb.TelemetryCommand:
    kind = settings.WhichOneof("pub_sub")
    language = language_name(settings.user_agent.language) if settings.HasField("user_agent") else ctx.language
    group_name = ""
    topics: set[str] = set()
    group: GroupInfo | None = None
    limit = app.config.input.max_settings_entries
    if kind == "subscription" and settings.subscription.HasField("group"):
        if len(settings.subscription.subscriptions) > limit:
            raise BadRequest(f"the settings name {len(settings.subscription.subscriptions)} subscriptions; at most "
                             f"{limit} are accepted")  # fmt: skip
        _, group_name = convert.resource_name(settings.subscription.group, ctx.namespace, "consumer group")
        topics = {convert.resource_name(e.topic, ctx.namespace)[1] for e in settings.subscription.subscriptions}
        group = await _group_info(app, group_name)
    elif kind == "publishing":
        if len(settings.publishing.topics) > limit:
            raise BadRequest(f"the settings name {len(settings.publishing.topics)} topics; at most {limit} are "
                             "accepted")  # fmt: skip
        topics = {convert.resource_name(t, ctx.namespace)[1] for t in settings.publishing.topics}
    app.sessions.touch(ctx.client_id, language=language, client_type=int(settings.client_type), group=group_name,
                       topics=topics, version=ctx.client_version, address=ctx.peer)  # fmt: skip
    return settings_reply(settings, header_language=ctx.language, group=group, cfg=app.config.settings)


async def _settings_reply(
    app: ProxyApp, ctx: RequestContext, settings: pb.Settings, stream_id: int, deliver: Deliver, notify: Notify
) -> spb.TelemetryCommand:
    """The reply to one Settings: the effective settings, or a status saying why they were not
    applied (the stream stays open either way; the client may send corrected settings)."""
    try:
        reply = await on_settings(app, ctx, settings)
    except Exception as exc:  # SluiceError: the client's mistake, told in the status; else INTERNAL, logged
        return spb.TelemetryCommand(status=status_of(exc, "Telemetry"))
    if settings.client_type in lite.LITE_CLIENT_TYPES:  # its stream carries removal notices
        app.lite.register(stream_id, ctx.client_id, notify)
    if settings.client_type == pb.PRODUCER:  # its stream can carry transaction check-backs
        app.checkbacks.register(stream_id, ctx.client_id, transaction.producer_topics(ctx, settings), deliver)
    return reply


async def telemetry(
    app: ProxyApp, ctx: RequestContext, commands: AsyncIterator[spb.TelemetryCommand | SluiceError]
) -> AsyncIterator[spb.TelemetryCommand]:
    out: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()  # bounded by the qsize check below
    app.sessions.stream_opened(ctx.client_id)
    stream_id = id(out)
    deliver = transaction.stream_deliver(out, MAX_QUEUED_COMMANDS)
    notify = lite.removal_notify(out, MAX_QUEUED_COMMANDS, ctx.namespace)  # lite consumers' removal notices

    async def read() -> None:
        try:
            async for cmd in commands:
                if isinstance(cmd, SluiceError):  # undecodable bytes (proxy/grpc/edge.py): say so, go on
                    reply = spb.TelemetryCommand(status=status_of(cmd, "Telemetry"))
                elif cmd.WhichOneof("command") != "settings":
                    continue  # stack traces, verify results: accepted and ignored
                else:
                    reply = await _settings_reply(app, ctx, cmd.settings, stream_id, deliver, notify)
                if out.qsize() < MAX_QUEUED_COMMANDS:
                    out.put_nowait(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-stream
            log.debug("telemetry stream read ended", extra=kv(client_id=ctx.client_id, error=str(exc)))
        finally:
            out.put_nowait(None)

    reader = asyncio.create_task(read(), name=f"telemetry-{ctx.client_id}")
    try:
        while (item := await out.get()) is not None:
            yield item
    finally:
        reader.cancel()
        app.checkbacks.unregister(stream_id)
        app.lite.unregister(stream_id)
        app.sessions.stream_closed(ctx.client_id)
