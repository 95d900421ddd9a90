"""SendMessage at the edge: encode each message into its record, send through the producer service,
report per entry. A request with a message refused here (its topic's name, its fields, an empty or
too large body) stores nothing: every entry carries that refusal (its own, for a refused message).

Per-message work is what a batched send costs, so what is the same for every message of a request
is done once per request: a topic's name is checked and wrapped in its namespace, and noted for
transaction check-backs, once per distinct topic of the request.
"""

from __future__ import annotations

from common import record
from common.codes import Code
from common.errors import BadRequest, MessageBodyEmpty, MessageBodyTooLarge, SluiceError
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.app import ProxyApp
from proxy.context import RequestContext
from proxy.grpc import convert
from proxy.grpc.status import OK, common_status, status, status_of

Item = tuple[str, bytes]  # (cluster-wide topic, record: common.record.outgoing)
_OK_ENTRY = spb.SendResultEntry(status=OK).SerializeToString()  # an entry's OK status, as bytes to merge


async def send_message(app: ProxyApp, ctx: RequestContext, request: spb.SendMessageRequest) -> spb.SendMessageResponse:
    msgs = request.messages
    if not msgs:
        return spb.SendMessageResponse(status=status(Code.MESSAGE_CORRUPTED, "the request carries no message"))
    limit = app.config.input.max_messages_per_send
    if len(msgs) > limit:
        return spb.SendMessageResponse(status=status(Code.BAD_REQUEST, f"the request carries {len(msgs)} messages; "
                                                                       f"at most {limit} are accepted"))  # fmt: skip
    topics: dict[tuple[str, str], str | SluiceError] = {}
    converted = [_convert(app, ctx, msg, topics) for msg in msgs]
    refused = next((c for c in converted if isinstance(c, SluiceError)), None)
    if refused is not None:  # all or nothing, as a broker stores a batch: the others carry the first refusal
        converted = [c if isinstance(c, SluiceError) else refused for c in converted]
    items = [c for c in converted if not isinstance(c, SluiceError)]
    outcomes = iter(await app.producer.send(ctx, items)) if items else iter(())
    response = spb.SendMessageResponse()
    add = response.entries.add
    all_ok = True
    for c in converted:
        outcome = c if isinstance(c, SluiceError) else next(outcomes)
        if isinstance(outcome, BaseException):
            all_ok = False
            add(status=status_of(outcome, "SendMessage"))
        else:  # filled in place (no entry built apart and copied in); the OK status merged from bytes
            entry = add(message_id=outcome.message_id, offset=outcome.queue_offset)
            entry.MergeFromString(_OK_ENTRY)
            if outcome.transaction_id or outcome.recall_handle:
                entry.transaction_id = outcome.transaction_id
                entry.recall_handle = outcome.recall_handle
    # All OK (the common case) needs no look at the entries' statuses.
    response.status.CopyFrom(OK if all_ok else common_status(e.status for e in response.entries))
    return response


def _topic(app: ProxyApp, ctx: RequestContext, key: tuple[str, str]) -> str | SluiceError:
    """The cluster-wide name of a topic given on the wire as (namespace, name), noted for check-backs."""
    try:
        ns, topic = convert.topic_name(key[0], key[1], ctx.namespace)
    except SluiceError as exc:
        return exc
    app.checkbacks.note_sent(ctx.client_id, topic, ns)
    return topic


def _convert(
    app: ProxyApp, ctx: RequestContext, msg: pb.Message, topics: dict[tuple[str, str], str | SluiceError]
) -> Item | SluiceError:
    """(cluster-wide topic, record) of one message, or the error that refuses it alone."""
    try:
        resource = msg.topic
        key = (resource.resource_namespace, resource.name)
        topic = topics.get(key)
        if topic is None:
            topic = topics[key] = _topic(app, ctx, key)
        if isinstance(topic, SluiceError):
            return topic
        data = convert.outgoing(msg, ctx.peer)
        # The RocketMQ protocol's body rules (the store carries any body up to the broker's limit:
        # AMQP publishes may be empty). The limit is the one this proxy tells clients in Settings,
        # enforced for those that send before their Settings reply arrives (it is below the
        # broker's own limit, see config.py).
        max_body = app.config.settings.max_body_bytes
        size = record.peek_body_size(data)
        if not size:
            raise MessageBodyEmpty("message body is empty; send at least one byte")
        if size > max_body:
            raise MessageBodyTooLarge(f"message body is {size} bytes; at most {max_body} are accepted")
        return topic, data
    except SluiceError as exc:
        return exc


async def recall_message(
    app: ProxyApp, ctx: RequestContext, request: spb.RecallMessageRequest
) -> spb.RecallMessageResponse:
    _, topic = convert.resource_name(request.topic, ctx.namespace)
    limit = app.config.input.max_handle_bytes
    if len(request.recall_handle) > limit:
        raise BadRequest(f"the recall handle is {len(request.recall_handle)} characters long; Sluice's are at most "
                         f"{limit}")  # fmt: skip
    message_id = await app.producer.recall(ctx, topic, request.recall_handle)
    return spb.RecallMessageResponse(status=OK, message_id=message_id)
