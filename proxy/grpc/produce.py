"""SendMessage at the edge: convert each message, send through the producer service, report per entry.

Per-message work is what a batched send costs, so what is the same for every message of a request
is done once per request: a topic's name is checked and wrapped in its namespace, and noted for
transaction check-backs, once per distinct topic of the request.
"""

from __future__ import annotations

from broker.api import SYSPROP_PRODUCER_CLIENT_ID, OutgoingMessage
from common.codes import Code
from common.errors import MessageBodyTooLarge, SluiceError
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.grpc import convert
from proxy.grpc.status import OK, common_status, status, status_of


async def send_message(app: ProxyApp, ctx: RequestContext, request: spb.SendMessageRequest) -> spb.SendMessageResponse:
    if not request.messages:
        return spb.SendMessageResponse(status=status(Code.MESSAGE_CORRUPTED, "the request carries no message"))
    converted: list[tuple[str, OutgoingMessage] | SluiceError] = []
    max_body = app.config.settings.max_body_bytes
    client_id, peer = ctx.client_id, ctx.peer
    topics: dict[tuple[str, str], str | SluiceError] = {}  # (namespace, name) on the wire -> cluster-wide name
    for msg in request.messages:
        try:
            resource = msg.topic
            key = (resource.resource_namespace, resource.name)
            topic = topics.get(key)
            if topic is None:
                try:
                    ns, topic = convert.resource_name(resource, ctx.namespace)
                    app.checkbacks.note_sent(client_id, topic, ns)
                except SluiceError as exc:
                    topic = exc
                topics[key] = topic
            if isinstance(topic, SluiceError):
                converted.append(topic)
                continue
            body = msg.body
            # The limit this proxy tells clients in Settings, enforced for those that send before
            # their Settings reply arrives (it is below the broker's own limit, see config.py).
            if len(body) > max_body:
                raise MessageBodyTooLarge(f"message body is {len(body)} bytes; at most {max_body} are accepted")
            out = convert.outgoing(msg, peer, body)
            out.system_properties[SYSPROP_PRODUCER_CLIENT_ID] = client_id  # for the trace; not stored
            converted.append((topic, out))
        except SluiceError as exc:
            converted.append(exc)
    items = [c for c in converted if not isinstance(c, SluiceError)]
    outcomes = iter(await app.producer.send(items)) if items else iter(())
    entries: list[spb.SendResultEntry] = []
    all_ok = True
    add = entries.append
    for c in converted:
        outcome = c if isinstance(c, SluiceError) else next(outcomes)
        if isinstance(outcome, BaseException):
            all_ok = False
            add(spb.SendResultEntry(status=status_of(outcome, "SendMessage")))
        else:
            add(spb.SendResultEntry(status=OK, message_id=outcome.message_id, transaction_id=outcome.transaction_id,
                                    offset=outcome.queue_offset, recall_handle=outcome.recall_handle))  # fmt: skip
    # All OK (the common case) needs no look at the entries' statuses.
    overall = OK if all_ok else common_status(e.status for e in entries)
    return spb.SendMessageResponse(status=overall, entries=entries)


async def recall_message(
    app: ProxyApp, ctx: RequestContext, request: spb.RecallMessageRequest
) -> spb.RecallMessageResponse:
    _, topic = convert.resource_name(request.topic, ctx.namespace)
    message_id = await app.producer.recall(topic, request.recall_handle)
    return spb.RecallMessageResponse(status=OK, message_id=message_id)
