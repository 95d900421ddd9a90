"""Telemetry: the bidirectional stream every client keeps open with each proxy it uses.

Each client Settings gets an immediate reply (status OK + effective settings). Writes go through a
small bounded queue, because some clients stop reading the stream (the Python push consumer does
after its first settings, PROTOCOL.md §3.5): a full queue drops settings replies instead of
blocking the proxy. The server never ends the stream; it ends when the client closes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from broker.client.api import GroupInfo
from common.errors import SluiceError
from common.logs import kv
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy import names
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.grpc import lite, transaction
from proxy.grpc.settings import settings_reply

log = logging.getLogger("sluice.proxy.telemetry")

MAX_QUEUED_COMMANDS = 16


async def _group_info(app: ProxyApp, group: str) -> GroupInfo | None:
    for name in app.directory.broker_names():
        try:
            return await app.directory.broker(name).get_group(group, auto_create=True)
        except SluiceError:
            continue
    return None


async def on_settings(app: ProxyApp, ctx: RequestContext, settings: pb.Settings) -> spb.TelemetryCommand:
    kind = settings.WhichOneof("pub_sub")
    language = pb.Language.Name(settings.user_agent.language) if settings.HasField("user_agent") else ctx.language
    group_name = ""
    topics: set[str] = set()
    group: GroupInfo | None = None
    if kind == "subscription" and settings.subscription.HasField("group"):
        g = settings.subscription.group
        group_name = names.wrap(g.resource_namespace or ctx.namespace, g.name)
        topics = {names.wrap(e.topic.resource_namespace or ctx.namespace, e.topic.name)
                  for e in settings.subscription.subscriptions}  # fmt: skip
        group = await _group_info(app, group_name) if group_name else None
    elif kind == "publishing":
        topics = {names.wrap(t.resource_namespace or ctx.namespace, t.name) for t in settings.publishing.topics}
    app.sessions.touch(ctx.client_id, language=language, client_type=int(settings.client_type), group=group_name,
                       topics=topics, version=ctx.client_version)  # fmt: skip
    return settings_reply(settings, header_language=ctx.language, group=group, cfg=app.config.settings)


async def telemetry(
    app: ProxyApp, ctx: RequestContext, commands: AsyncIterator[spb.TelemetryCommand]
) -> AsyncIterator[spb.TelemetryCommand]:
    out: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()  # bounded by the qsize check below
    app.sessions.stream_opened(ctx.client_id)
    stream_id = id(out)
    deliver = transaction.stream_deliver(out, MAX_QUEUED_COMMANDS)

    async def read() -> None:
        try:
            async for cmd in commands:
                if cmd.WhichOneof("command") != "settings":
                    continue  # stack traces, verify results: accepted and ignored
                try:
                    reply = await on_settings(app, ctx, cmd.settings)
                except SluiceError as exc:
                    log.warning("settings not applied", extra=kv(client_id=ctx.client_id, error=exc.message))
                    continue
                if cmd.settings.client_type in lite.LITE_CLIENT_TYPES:  # its stream carries removal notices
                    app.lite.register(stream_id, ctx.client_id, lite.removal_notify(out, MAX_QUEUED_COMMANDS,
                                                                                    ctx.namespace))  # fmt: skip
                if cmd.settings.client_type == pb.PRODUCER:  # its stream can carry transaction check-backs
                    app.checkbacks.register(stream_id, ctx.client_id, transaction.producer_topics(ctx, cmd.settings),
                                            deliver)  # fmt: skip
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
