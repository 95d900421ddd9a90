"""Declares, bindings and deletes applied to the metadata document, with RabbitMQ's checks and
reply texts. Each function changes the `MetaDoc` it is given (inside `MetaStore.change`) or
raises an `AmqpError` and changes nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.amqp.codes import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    AmqpError,
)
from proxy.amqp.meta import (
    BUILTIN_EXCHANGES,
    EXCHANGE_TYPES,
    TOPIC_ARG,
    Args,
    BindingMeta,
    ExchangeMeta,
    MetaDoc,
    QueueMeta,
    VhostMeta,
)

_TOPIC_RE = re.compile(r"^[a-zA-Z0-9_-]{1,127}$")


def _where(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"


def _b(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _inequivalent(field: str, what: str, got: object, current: object) -> AmqpError:
    detail = f"inequivalent arg '{field}' for {what}: received {_b(got)} but current is {_b(current)}"
    return AmqpError(PRECONDITION_FAILED, detail)


def find_exchange(doc: MetaDoc, vhost: str, name: str) -> str:
    """The exchange's type; NOT_FOUND when there is none."""
    kind = doc.vhost(vhost).exchange_type(name)
    if kind is None:
        raise AmqpError(NOT_FOUND, f"no {_where('exchange', name, vhost)}")
    return kind


def find_queue(doc: MetaDoc, vhost: str, name: str, owner: str) -> QueueMeta:
    queue = doc.vhost(vhost).queues.get(name)
    if queue is None:
        raise AmqpError(NOT_FOUND, f"no {_where('queue', name, vhost)}")
    check_owner(queue, vhost, owner)
    return queue


def check_owner(queue: QueueMeta, vhost: str, owner: str) -> None:
    if queue.exclusive_owner and queue.exclusive_owner != owner:
        what = _where("queue", queue.name, vhost)
        raise AmqpError(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked {what}. It could be originally "
                        "declared on another connection or the exclusive property value does not match that of the "
                        "original declaration.")  # fmt: skip


@dataclass(frozen=True)
class ExchangeDeclare:
    name: str
    type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Args


def declare_exchange(doc: MetaDoc, vhost: str, d: ExchangeDeclare) -> None:
    v = doc.vhost(vhost)
    what = _where("exchange", d.name, vhost)
    current = v.exchange_type(d.name)
    if d.passive:
        if current is None:
            raise AmqpError(NOT_FOUND, f"no {what}")
        return
    if d.name in BUILTIN_EXCHANGES or (d.name.startswith("amq.") and current is None):
        if current is not None and current == d.type:
            return  # redeclaring a built-in exchange as it is: fine, as in RabbitMQ
        raise AmqpError(ACCESS_REFUSED, f"{what} contains reserved prefix 'amq.*'" if d.name
                        else "operation not permitted on the default exchange")  # fmt: skip
    if d.type not in EXCHANGE_TYPES:
        raise AmqpError(COMMAND_INVALID, f"unknown exchange type '{d.type}'")
    new = ExchangeMeta(d.name, d.type, d.durable, d.auto_delete, d.internal, d.arguments)
    old = v.exchanges.get(d.name)
    if old is None:
        _check_topic(v, vhost, new)
        v.exchanges[d.name] = new
        return
    if TOPIC_ARG not in d.arguments and old.topic is not None:  # an application's own declare, unchanged,
        new = replace(new, arguments={**d.arguments, TOPIC_ARG: old.topic})  # of an exchange an operator mapped
    for field in ("type", "durable", "auto_delete", "internal", "arguments"):
        if getattr(old, field) != getattr(new, field):
            raise _inequivalent(field, what, getattr(new, field), getattr(old, field))


def valid_topic(topic: str) -> bool:
    """A name `x-sluice-topic` may give: a plain RocketMQ topic, not a system or AMQP queue topic."""
    return bool(_TOPIC_RE.match(topic)) and not topic.startswith("AMQP_")


def _check_topic(v: VhostMeta, vhost: str, exchange: ExchangeMeta) -> None:
    """`x-sluice-topic`: a RocketMQ topic name, mapped by one exchange of the vhost at most."""
    if TOPIC_ARG not in exchange.arguments:
        return
    what = _where("exchange", exchange.name, vhost)
    topic = exchange.arguments[TOPIC_ARG]
    if not isinstance(topic, str) or not valid_topic(topic):
        raise AmqpError(PRECONDITION_FAILED, f"invalid arg '{TOPIC_ARG}' for {what}: a RocketMQ topic name (1-127 "
                        "letters, digits, '-', '_', not starting with '%' or 'AMQP_') is needed, got "
                        f"{topic!r}")  # fmt: skip
    for other in v.exchanges.values():
        if other.topic == topic and other.name != exchange.name:
            raise AmqpError(PRECONDITION_FAILED, f"invalid arg '{TOPIC_ARG}' for {what}: topic '{topic}' is "
                            f"already mapped by exchange '{other.name}'")  # fmt: skip


def delete_exchange(doc: MetaDoc, vhost: str, name: str, if_unused: bool) -> ExchangeMeta | None:
    """The exchange removed with its bindings; None when there was none."""
    v = doc.vhost(vhost)
    what = _where("exchange", name, vhost)
    if name in BUILTIN_EXCHANGES or name.startswith("amq."):
        raise AmqpError(ACCESS_REFUSED, f"operation not permitted on {what}" if name
                        else "operation not permitted on the default exchange")  # fmt: skip
    if name not in v.exchanges:
        return None  # deleting a missing exchange is fine (RabbitMQ 3.x+)
    used = [b for b in v.bindings if b.exchange == name]
    if if_unused and used:
        raise AmqpError(PRECONDITION_FAILED, f"{what} in use")
    removed = v.exchanges.pop(name)
    _remove_bindings(v, lambda b: b.exchange == name or (b.to_exchange and b.queue == name))
    return removed


def _remove_bindings(v: VhostMeta, gone: Callable[[BindingMeta], bool]) -> None:
    """Drop the bindings `gone` selects; an auto-delete exchange that so lost its last binding
    (as the source) goes too, as in RabbitMQ."""
    sources = {b.exchange for b in v.bindings if gone(b)}
    v.bindings = [b for b in v.bindings if not gone(b)]
    for name in sources:
        exchange = v.exchanges.get(name)
        if exchange is not None and exchange.auto_delete and not any(b.exchange == name for b in v.bindings):
            del v.exchanges[name]
            _remove_bindings(v, _to_exchange(name))


def _to_exchange(name: str) -> Callable[[BindingMeta], bool]:
    return lambda b: b.to_exchange and b.queue == name


@dataclass(frozen=True)
class QueueDeclare:
    name: str
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: Args


def declare_queue(doc: MetaDoc, vhost: str, d: QueueDeclare, owner: str, broker: str, now_ms: int = 0) -> QueueMeta:
    """The queue, created when new (on `broker`, with the next number); a declare is a use (x-expires)."""
    v = doc.vhost(vhost)
    what = _where("queue", d.name, vhost)
    old = v.queues.get(d.name)
    if d.passive:
        if old is None:
            raise AmqpError(NOT_FOUND, f"no {what}")
        check_owner(old, vhost, owner)
        return old
    if d.name.startswith("amq.") and old is None and not d.name.startswith("amq.gen-"):
        raise AmqpError(ACCESS_REFUSED, f"{what} contains reserved prefix 'amq.*'")
    check_queue_arguments(d.arguments, what)
    new = QueueMeta(d.name, doc.next_id, broker, d.durable, owner if d.exclusive else "", d.auto_delete, d.arguments,
                    now_ms if "x-expires" in d.arguments else 0)  # fmt: skip
    if old is None:
        v.queues[d.name] = new
        doc.next_id += 1
        return new
    check_owner(old, vhost, owner)
    checks = (
        ("durable", old.durable, new.durable),
        ("exclusive", bool(old.exclusive_owner), d.exclusive),
        ("auto_delete", old.auto_delete, new.auto_delete),
        ("arguments", old.arguments, new.arguments),
    )
    for field, current, got in checks:
        if current != got:
            raise _inequivalent(field, what, got, current)
    return touch_queue(doc, vhost, old, now_ms)


def touch_queue(doc: MetaDoc, vhost: str, queue: QueueMeta, now_ms: int) -> QueueMeta:
    """Record a use of a queue with x-expires (the same queue: same name and number); the queue as stored."""
    v = doc.vhost(vhost)
    current = v.queues.get(queue.name)
    if current is None or current.id != queue.id or current.expires_ms is None or current.used_ms >= now_ms:
        return current or queue
    v.queues[queue.name] = replace(current, used_ms=now_ms)
    return v.queues[queue.name]


def expire_queue(doc: MetaDoc, vhost: str, queue: QueueMeta, now_ms: int) -> QueueMeta | None:
    """Remove the queue when it is still the same one and unused for its x-expires; the removed one."""
    current = doc.vhost(vhost).queues.get(queue.name)
    if current is None or current.id != queue.id or current.expires_ms is None:
        return None
    if now_ms - current.used_ms < current.expires_ms:
        return None
    return delete_queue(doc, vhost, queue.name, current.exclusive_owner)


# Integer queue arguments and their lowest value; the others are checked by `check_queue_arguments`.
_INT_ARGS = {"x-message-ttl": 0, "x-expires": 1, "x-max-length": 0, "x-max-length-bytes": 0, "x-delivery-limit": 0,
             "x-max-priority": 0}  # fmt: skip
MAX_PRIORITY = 255  # RabbitMQ's largest x-max-priority
_CHOICES = {"x-queue-type": ("classic", "quorum"), "x-overflow": ("drop-head", "reject-publish", "reject-publish-dlx")}


def check_queue_arguments(arguments: Args, what: str) -> None:
    """RabbitMQ's checks of the queue arguments it knows (406 for a bad one); others are kept as given."""

    def bad(name: str, why: str) -> AmqpError:
        return AmqpError(PRECONDITION_FAILED, f"invalid arg '{name}' for {what}: {why}")

    for name, low in _INT_ARGS.items():
        value = arguments.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise bad(name, f"must be an integer of at least {low}, got {value!r}")
    priority = arguments.get("x-max-priority")
    if isinstance(priority, int) and priority > MAX_PRIORITY:
        raise bad("x-max-priority", f"must be at most {MAX_PRIORITY}, got {priority}")
    for name, allowed in _CHOICES.items():
        value = arguments.get(name)
        if value is not None and value not in allowed:
            raise bad(name, f"must be one of {', '.join(allowed)}, got {value!r} (Sluice does not serve streams)")
    for name in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
        if name in arguments and not isinstance(arguments[name], str):
            raise bad(name, f"must be a string, got {arguments[name]!r}")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise bad("x-dead-letter-routing-key", "routing key given but no x-dead-letter-exchange")


def delete_queue(doc: MetaDoc, vhost: str, name: str, owner: str) -> QueueMeta | None:
    """The queue removed with its bindings; None when there was none."""
    v = doc.vhost(vhost)
    queue = v.queues.get(name)
    if queue is None:
        return None
    check_owner(queue, vhost, owner)
    del v.queues[name]
    _remove_bindings(v, lambda b: not b.to_exchange and b.queue == name)
    return queue


def _binding_checks(v: VhostMeta, vhost: str, binding: BindingMeta, owner: str) -> None:
    if binding.exchange == "" or (binding.to_exchange and binding.queue == ""):
        raise AmqpError(ACCESS_REFUSED, "operation not permitted on the default exchange")
    if binding.to_exchange:
        if v.exchange_type(binding.queue) is None:
            raise AmqpError(NOT_FOUND, f"no {_where('exchange', binding.queue, vhost)}")
    else:
        find_queue_in(v, vhost, binding.queue, owner)
    if v.exchange_type(binding.exchange) is None:
        raise AmqpError(NOT_FOUND, f"no {_where('exchange', binding.exchange, vhost)}")


def find_queue_in(v: VhostMeta, vhost: str, name: str, owner: str) -> QueueMeta:
    queue = v.queues.get(name)
    if queue is None:
        raise AmqpError(NOT_FOUND, f"no {_where('queue', name, vhost)}")
    check_owner(queue, vhost, owner)
    return queue


def bind(doc: MetaDoc, vhost: str, binding: BindingMeta, owner: str) -> None:
    v = doc.vhost(vhost)
    _binding_checks(v, vhost, binding, owner)
    if binding not in v.bindings:
        v.bindings.append(binding)


def unbind(doc: MetaDoc, vhost: str, binding: BindingMeta, owner: str) -> None:
    v = doc.vhost(vhost)
    _binding_checks(v, vhost, binding, owner)
    if binding in v.bindings:
        _remove_bindings(v, lambda b: b == binding)
