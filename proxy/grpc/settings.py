"""The effective Settings the proxy answers each client's Telemetry Settings with.

Rules the official clients rely on: always status OK plus settings of the same kind (publishing or
subscription) as the request; producers get `max_body_size > 0` and an exponential backoff policy
(the Node client crashes without one); push consumers get the group's FIFO flag, a receive batch
size, a long-polling timeout and a retry policy in the form their client reads: Python reads only
`customized_backoff`, Node only `exponential_backoff`.
"""

from __future__ import annotations

from broker.client.api import BackoffKind, GroupInfo, RetryPolicy
from proto.apache.rocketmq.v2 import definition_pb2 as pb
from proto.apache.rocketmq.v2 import service_pb2 as spb
from proxy.config import ClientSettingsConfig
from proxy.grpc.status import OK

LANGUAGE_PYTHON = 6
MAX_CUSTOMIZED_STEPS = 32


def wants_customized_backoff(settings: pb.Settings, header_language: str) -> bool:
    if settings.HasField("user_agent") and settings.user_agent.language:
        return int(settings.user_agent.language) == LANGUAGE_PYTHON
    return header_language.upper() == "PYTHON"


def _set_ms(duration: object, ms: int) -> None:
    duration.FromMilliseconds(ms)  # type: ignore[attr-defined]


def _consumer_backoff(out: pb.RetryPolicy, policy: RetryPolicy, max_attempts: int, customized: bool) -> None:
    out.max_attempts = max_attempts
    if customized:
        steps = min(max(max_attempts - 1, 1), MAX_CUSTOMIZED_STEPS)
        for attempt in range(1, steps + 1):
            # Python truncates to whole seconds; keep at least one second.
            _set_ms(out.customized_backoff.next.add(), max(1000, policy.delay_ms(attempt)))
        return
    exp = out.exponential_backoff
    if policy.kind is BackoffKind.CUSTOMIZED and policy.customized_ms:
        _set_ms(exp.initial, policy.customized_ms[0])
        _set_ms(exp.max, max(policy.customized_ms))
        exp.multiplier = 2.0
    else:
        _set_ms(exp.initial, policy.initial_ms)
        _set_ms(exp.max, policy.max_ms)
        exp.multiplier = policy.multiplier


def settings_reply(
    request: pb.Settings, *, header_language: str, group: GroupInfo | None, cfg: ClientSettingsConfig
) -> spb.TelemetryCommand:
    out = pb.Settings()
    for name in ("access_point", "request_timeout", "user_agent"):  # echoed, as the reference does
        if request.HasField(name):
            getattr(out, name).CopyFrom(getattr(request, name))
    if request.HasField("client_type"):
        out.client_type = request.client_type
    out.metric.on = False
    kind = request.WhichOneof("pub_sub")
    if kind == "publishing":
        out.publishing.CopyFrom(request.publishing)
        out.publishing.max_body_size = cfg.max_body_bytes
        out.publishing.validate_message_type = True
        out.backoff_policy.max_attempts = cfg.producer_max_attempts
        exp = out.backoff_policy.exponential_backoff
        _set_ms(exp.initial, cfg.producer_backoff_initial_ms)
        _set_ms(exp.max, cfg.producer_backoff_max_ms)
        exp.multiplier = 2.0
    elif kind == "subscription":
        sub = out.subscription
        sub.CopyFrom(request.subscription)
        sub.fifo = bool(group and group.spec.fifo)
        sub.receive_batch_size = cfg.receive_batch_size
        if not request.subscription.HasField("long_polling_timeout") or int(request.client_type) == pb.PUSH_CONSUMER:
            sub.long_polling_timeout.seconds = cfg.long_polling_timeout_s
        if int(request.client_type) in (pb.LITE_PUSH_CONSUMER, pb.LITE_SIMPLE_CONSUMER):
            sub.lite_subscription_quota = cfg.lite_subscription_quota
            sub.max_lite_topic_size = cfg.max_lite_topic_chars
        policy = group.spec.retry_policy if group else RetryPolicy()
        attempts = group.spec.max_delivery_attempts if group else 16
        _consumer_backoff(out.backoff_policy, policy, attempts, wants_customized_backoff(request, header_language))
    return spb.TelemetryCommand(status=OK, settings=out)
