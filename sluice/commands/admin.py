"""`sluice admin`: manage topics and consumer groups and look messages up, through the NameServers.

    sluice admin [--namesrv HOST:PORT[;HOST:PORT]] [--json] [--timeout-s S] AREA ACTION ...

    topic create NAME --type normal|fifo|delay|transaction|mixed|a,b --queues N [--brokers a,b]
    topic create NAME ... --update    (change an existing topic: more queues, other types)
    topic create NAME --type lite [--lite-expiration 10m] [--max-lite-topics N] | --type priority [--max-priority 9]
    topic update NAME --perm rw|r|w|none [--brokers a,b]
    lite list BIND_TOPIC [--group G] [--limit N]
    topic list | topic describe NAME | topic delete NAME
    group create NAME [--fifo] [--max-attempts N] [--retry-policy P] [--consume-from C]
    group list | group describe NAME | group delete NAME
    group reset-offset NAME --topic T --to earliest|latest|TIME|OFFSET [--queue Q] [--broker B] [--dry-run]
    client list [--group G | --topic T]    (who is connected, through which proxy)
    message get TOPIC --id ID | message find TOPIC --key K [--limit N]
    message range TOPIC --from TIME [--to TIME] [--limit N]    (stored in that time range; TIME may be now-2h)
    message trace --id ID    (the life of a message: sent, delivered, acked, dead-lettered, tiered)
    message send TOPIC [--tag T] [--key K]... [--property K=V]... [--message-group MG] [--deliver-at TIME]
                 (BODY | --file F | one message per line of stdin)
    message tail TOPIC [--from latest|earliest|TIME] [--group G [--ack]] [--count N] [--for-s S]
    message list TOPIC --queue Q --from-offset N [--count N] [--broker B]
    dlq list [GROUP] | dlq resend GROUP (--id ID ... | --all) [--to TOPIC]
    broker list [--etcd URL] | broker drain NAME [--wait-s S] | broker undrain NAME
    broker switchover GROUP --to NAME --etcd URL [--wait-s S]
    proxy list --navigation HOST:PORT    (zone, load, draining)
    nameserver list    (each NameServer of --namesrv: answering, brokers, topics)
    tier status | tier upload-now TOPIC [--wait-s S] | tier evict-local TOPIC
    user create ACCESS_KEY --secret SECRET|- | user delete ACCESS_KEY | user list
    acl grant ACCESS_KEY --resource topic:NAME|group:NAME|topic:PREFIX*|* --actions PUB,SUB,ADMIN [--deny]
    acl revoke ACCESS_KEY --resource R [--actions A] | acl list [ACCESS_KEY]
    limit set [--topic T | --group G] [--messages-per-s N] [--bytes-per-s N] | limit delete [...] | limit list
    amqp vhosts | amqp exchanges | amqp queues | amqp bindings [--vhost V]  (the AMQP gateway's metadata, docs/amqp.md)
    mqtt clients | mqtt sessions | mqtt subscriptions | mqtt retained [--filter F] [--limit N]
    mqtt kick CLIENT_ID | mqtt drop-session CLIENT_ID | mqtt delete-retained TOPIC  (docs/mqtt.md)

`--namespace NS` puts topic, group, message, acl and limit commands in namespace NS (topic `t` of
namespace `NS` is the cluster-wide topic `NS%t`).

The shared options may also follow the action (`sluice admin topic list --json`). Output is an
aligned table on stdout, or JSON with `--json`. A failure prints exactly one line on stderr,
`sluice admin: AREA ACTION: CODE: message`, and exits 1 (2 for a bad argument).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeAlias

# amqp, brokers, produce and proxies (and navigation's client) are imported by the actions that use
# them: they pull in modules no other command needs (the AMQP gateway's, replication's, the proxy's
# routing), and every `sluice admin` run, a test's or a script's, pays for what it imports.
from admin import clients, dlq, drain, groups, messages, nameservers, offsets, security, tier, topics, trace
from admin.cluster import DEFAULT_ROUTE_WAIT_S, DEFAULT_TIMEOUT_S, Cluster
from admin.output import Report, render_json, render_table
from admin.parse import (
    parse_consume_from,
    parse_duration_s,
    parse_message_types,
    parse_names,
    parse_reset_target,
    parse_retry_policy,
    parse_time_ms,
)
from broker.client.api import ConsumeFrom, GroupSpec
from common.config import ConfigError
from common.errors import SluiceError
from common.security import Effect, Limit, LimitScope, parse_actions, parse_pattern, validate_namespace
from proxy import names

NAME = "admin"
HELP = "Manage topics, groups, messages, dead letters, brokers, tiering and access, through the NameServers."
DEFAULT_UPLOAD_WAIT_S = 300.0
SWITCHOVER_WAIT_S = 30.0
DEFAULT_NAMESRV = "127.0.0.1:9876"
DEFAULT_QUEUES = 8
DEFAULT_FIND_LIMIT = 64
DEFAULT_LIST_COUNT = 20
EXIT_FAILED = 1
EXIT_BAD_ARGUMENT = 2

Action = Callable[[Cluster, argparse.Namespace], Awaitable[Report]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_shared(parser, suppress=False)
    # Leaves accept the shared options too; SUPPRESS keeps a leaf from resetting what came first.
    shared = argparse.ArgumentParser(add_help=False)
    _add_shared(shared, suppress=True)
    areas = parser.add_subparsers(dest="area", metavar="AREA", required=True)
    _add_topic(areas.add_parser("topic", help="create, list, describe and delete topics"), shared)
    _add_group(areas.add_parser("group", help="create, list, describe and delete consumer groups"), shared)
    _add_message(areas.add_parser("message", help="send, tail, browse, look up and trace messages"), shared)
    _add_dlq(areas.add_parser("dlq", help="list a group's dead letters and send them again"), shared)
    _add_broker(areas.add_parser("broker", help="list the registered brokers"), shared)
    _add_client(areas.add_parser("client", help="list the clients connected to the proxies"), shared)
    _add_proxy(areas.add_parser("proxy", help="list the proxies a navigation server knows"), shared)
    _add_nameserver(areas.add_parser("nameserver", help="ask each NameServer of --namesrv on its own"), shared)
    _add_lite(areas.add_parser("lite", help="lite topics of a LITE bind topic: list"), shared)
    _add_tier(areas.add_parser("tier", help="tiered storage: status, upload now, evict local copies"), shared)
    _add_user(areas.add_parser("user", help="create, delete and list users (access key and secret)"), shared)
    _add_acl(areas.add_parser("acl", help="grant, revoke and list access rules of users"), shared)
    _add_limit(areas.add_parser("limit", help="set, delete and list rate limits (produce and receive)"), shared)
    _add_amqp(areas.add_parser("amqp", help="the AMQP gateway's exchanges, queues (ready, unacked) and bindings"),
              shared)  # fmt: skip
    _add_mqtt(areas.add_parser("mqtt", help="the MQTT gateway's clients, sessions, subscriptions, retained messages"),
              shared)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    what = f"{args.area} {args.action}"
    try:
        report = asyncio.run(_execute(args))
    except ConfigError as exc:
        return _fail(what, f"bad argument: {exc}", EXIT_BAD_ARGUMENT)
    except SluiceError as exc:
        return _fail(what, f"{exc.code.name}: {exc}", EXIT_FAILED)
    if not report.streamed:
        print(render_json(report) if args.json else render_table(report), flush=True)
    return 0


async def _execute(args: argparse.Namespace) -> Report:
    if args.timeout_s <= 0:
        raise ConfigError(f"--timeout-s must be positive, got {args.timeout_s}")
    _resolve_topic(args)
    if args.namespace:
        validate_namespace(args.namespace)
        for attr in ("name", "topic", "group", "to"):  # resources of topic, group, message, client, dlq, lite
            if attr == "to" and args.area != "dlq":
                continue  # `group reset-offset --to` names a position, not a topic
            value = getattr(args, attr, None)
            if args.area in ("topic", "group", "message", "client", "dlq", "lite") and isinstance(value, str) and value:
                setattr(args, attr, names.wrap(args.namespace, getattr(args, attr)))
    async with Cluster(args.namesrv, timeout_s=args.timeout_s, route_wait_s=DEFAULT_ROUTE_WAIT_S) as cluster:
        action: Action = args.run_action
        return await action(cluster, args)


def _fail(what: str, message: str, code: int) -> int:
    line = " ".join(message.split())  # exactly one line, whatever the message holds
    print(f"sluice admin: {what}: {line}", file=sys.stderr, flush=True)
    return code


# -- argument tree ----------------------------------------------------------------------------------


def _add_shared(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--namesrv",
        metavar="HOST:PORT[;HOST:PORT]",
        default=default(DEFAULT_NAMESRV),
        help=f"NameServers to ask (default {DEFAULT_NAMESRV})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON instead of a table")
    parser.add_argument("--namespace", metavar="NS", default=default(""), help="the namespace of the resources named")
    parser.add_argument(
        "--timeout-s",
        type=float,
        metavar="S",
        default=default(DEFAULT_TIMEOUT_S),
        help=f"deadline of each call to a NameServer or broker (default {DEFAULT_TIMEOUT_S:g})",
    )


Actions: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _leaf(
    actions: Actions, name: str, shared: argparse.ArgumentParser, run: Action, text: str
) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=text, description=text, parents=[shared])
    parser.set_defaults(run_action=run)
    return parser


def _add_topic(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = _leaf(actions, "create", shared, _topic_create, "create a topic, its queues spread over brokers")
    create.add_argument("name", metavar="NAME")
    create.add_argument(
        "--type",
        default="normal",
        metavar="TYPE",
        help="normal, fifo, delay, transaction, mixed (all four), a comma list such as normal,delay; or lite, "
        "priority (alone)",
    )
    create.add_argument("--max-priority", type=int, metavar="N", help="priority topics: priorities 0..N (default 9)")
    create.add_argument("--lite-expiration", metavar="D", help="lite topics: removed after D without a message "
                        "(e.g. 30s, 10m; default 10m)")  # fmt: skip
    create.add_argument("--max-lite-topics", type=int, metavar="N",
                        help="lite topics per broker: on k brokers the topic holds up to k x N "
                             "(default: the broker's limit)")  # fmt: skip
    create.add_argument("--queues", type=int, default=DEFAULT_QUEUES, metavar="N", help="queues in all (default 8)")
    create.add_argument("--brokers", metavar="A,B", help="brokers to hold the queues (default: every registered one)")
    create.add_argument("--update", action="store_true", help="change the topic if it exists (else refused)")
    update = _leaf(actions, "update", shared, _topic_update, "make a topic read-only, write-only, both or neither")
    update.add_argument("name", metavar="NAME")
    update.add_argument(
        "--perm", required=True, choices=sorted(topics.PERMISSIONS), help="rw (default of a topic), r, w or none"
    )
    update.add_argument("--brokers", metavar="A,B", help="only on these brokers (default: every broker holding it)")
    _leaf(actions, "list", shared, _topic_list, "list topics with their brokers and queue counts")
    describe = _leaf(actions, "describe", shared, _topic_describe, "offsets of every queue of a topic")
    describe.add_argument("name", metavar="NAME")
    delete = _leaf(actions, "delete", shared, _topic_delete, "delete a topic from every broker holding it")
    delete.add_argument("name", metavar="NAME")


def _add_lite(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    lst = _leaf(actions, "list", shared, _lite_list, "lite topics of a bind topic: backlog, last write, subscribers")
    lst.add_argument("topic", metavar="BIND_TOPIC")
    lst.add_argument("--group", default="", metavar="G", help="backlog as seen by consumer group G")
    lst.add_argument("--limit", type=int, default=100, metavar="N", help="at most N, largest backlog first")


def _add_group(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = _leaf(actions, "create", shared, _group_create, "create (or update) a consumer group on every broker")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--fifo", action="store_true", help="deliver each message group in order, one at a time")
    create.add_argument("--max-attempts", type=int, metavar="N", help="deliveries before dead-lettering (default 16)")
    create.add_argument(
        "--retry-policy",
        metavar="POLICY",
        help="exponential:INITIAL_MS:MAX_MS:MULTIPLIER or customized:MS,MS,... (default exponential:1000:60000:2)",
    )
    create.add_argument(
        "--consume-from",
        default="latest",
        metavar="WHERE",
        help="latest (default), earliest, or a time: epoch ms or ISO-8601 (no zone: UTC)",
    )
    _leaf(actions, "list", shared, _group_list, "list consumer groups")
    describe = _leaf(actions, "describe", shared, _group_describe, "offsets, lag and in-flight messages of a group")
    describe.add_argument("name", metavar="NAME")
    delete = _leaf(actions, "delete", shared, _group_delete, "delete a consumer group from every broker")
    delete.add_argument("name", metavar="NAME")
    reset = _leaf(
        actions, "reset-offset", shared, _group_reset_offset,
        "move where a group consumes a topic from (safe while its consumers are connected)",
    )  # fmt: skip
    reset.add_argument("name", metavar="NAME")
    reset.add_argument("--topic", required=True, metavar="T")
    reset.add_argument(
        "--to",
        required=True,
        metavar="WHERE",
        help="earliest, latest, an ISO-8601 time (no zone: UTC), or a queue offset (a plain number)",
    )
    reset.add_argument("--queue", type=int, metavar="Q", help="only this queue id (on every broker holding it)")
    reset.add_argument("--broker", metavar="B", help="only the queues on this broker")
    reset.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")


def _add_message(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    get = _leaf(actions, "get", shared, _message_get, "a message by its id")
    _topic_argument(get)
    get.add_argument("--id", required=True, metavar="ID", dest="message_id")
    find = _leaf(actions, "find", shared, _message_find, "messages by key")
    _topic_argument(find)
    find.add_argument("--key", required=True, metavar="K")
    find.add_argument("--limit", type=int, default=DEFAULT_FIND_LIMIT, metavar="N", help="at most N per broker")
    ranged = _leaf(actions, "range", shared, _message_range, "messages stored in a time range")
    _topic_argument(ranged)
    ranged.add_argument("--from", required=True, dest="begin", metavar="TIME", help="epoch ms or ISO-8601")
    ranged.add_argument("--to", dest="end", metavar="TIME", help="epoch ms or ISO-8601 (default: now)")
    ranged.add_argument("--limit", type=int, default=DEFAULT_FIND_LIMIT, metavar="N", help="at most N in all")
    traced = _leaf(
        actions,
        "trace",
        shared,
        _message_trace,
        "the life of a message: sent, delivered (per group, per attempt), acked, dead-lettered, tiered",
    )
    traced.add_argument("--id", required=True, metavar="ID", dest="message_id")
    send = _leaf(actions, "send", shared, _message_send, "send messages: BODY, --file, or one per line of stdin")
    send.add_argument("topic", metavar="TOPIC")
    send.add_argument(
        "body", metavar="BODY", nargs="?", help="the body (UTF-8), right after TOPIC; without it --file or stdin"
    )
    send.add_argument("--file", metavar="F", help="send the whole file as one message")
    send.add_argument("--tag", metavar="T")
    send.add_argument("--key", metavar="K", action="append", default=[], help="a key (repeatable)")
    send.add_argument("--property", metavar="K=V", action="append", default=[], help="a property (repeatable)")
    send.add_argument(
        "--message-group", metavar="MG", help="send FIFO messages of message group MG (what a FIFO topic needs)"
    )
    send.add_argument("--deliver-at", metavar="TIME", help="a DELAY message: epoch ms or ISO-8601 (no zone: UTC)")
    tail = _leaf(actions, "tail", shared, _message_tail, "print a topic's messages as they arrive (Ctrl-C stops)")
    tail.add_argument("topic", metavar="TOPIC")
    tail.add_argument(
        "--from",
        dest="start",
        metavar="WHERE",
        help="latest (default: what arrives from now on), earliest, or a time (epoch ms or ISO-8601); with "
        "--group and no --from: what the group has not consumed yet",
    )
    tail.add_argument("--group", metavar="G", help="start at this group's consumed offsets (read only)")
    tail.add_argument("--ack", action="store_true", help="consume as --group: receive and acknowledge")
    tail.add_argument("--count", type=int, default=0, metavar="N", help="stop after N messages")
    tail.add_argument("--for-s", type=float, default=0.0, metavar="S", help="stop after S seconds")
    listing = _leaf(actions, "list", shared, _message_list, "browse a queue from an offset (changes no group)")
    listing.add_argument("topic", metavar="TOPIC")
    listing.add_argument("--queue", type=int, required=True, metavar="Q")
    listing.add_argument("--from-offset", type=int, required=True, metavar="N")
    listing.add_argument("--count", type=int, default=DEFAULT_LIST_COUNT, metavar="N", help="at most N per broker")
    listing.add_argument("--broker", metavar="B", help="only this broker's queue Q")


def _topic_argument(parser: argparse.ArgumentParser) -> None:
    """TOPIC right after the action, as every message command takes it; `--topic T` (how get, find
    and range took it before) is still accepted."""
    parser.add_argument("topic", metavar="TOPIC", nargs="?")
    parser.add_argument("--topic", dest="topic_flag", metavar="T", help=argparse.SUPPRESS)


def _resolve_topic(args: argparse.Namespace) -> None:
    if not hasattr(args, "topic_flag"):
        return
    if args.topic and args.topic_flag and args.topic != args.topic_flag:
        raise ConfigError(f"two topics given ({args.topic} and --topic {args.topic_flag}): give TOPIC once")
    args.topic = args.topic or args.topic_flag
    if not args.topic:
        raise ConfigError(f"give the topic: message {args.action} TOPIC ...")


def _add_dlq(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = _leaf(actions, "list", shared, _dlq_list,
                    "the messages in %%DLQ%%GROUP: origin topic, attempts, body; without GROUP, every group that "
                    "has dead letters and how many")  # fmt: skip
    listing.add_argument("name", metavar="GROUP", nargs="?")
    resend = _leaf(actions, "resend", shared, _dlq_resend, "send dead letters again, as new messages, to their topic")
    resend.add_argument("name", metavar="GROUP")
    which = resend.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", action="append", dest="ids", metavar="ID", help="a dead letter's message id (repeat)")
    which.add_argument("--all", action="store_true", help="every dead letter of the group")
    resend.add_argument("--to", metavar="TOPIC", help="send to this topic instead of each message's origin topic")


def _add_client(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = _leaf(actions, "list", shared, _client_list, "clients connected to the proxies (reported every 5 s)")
    which = listing.add_mutually_exclusive_group()
    which.add_argument("--group", metavar="G", help="only the consumers of this group")
    which.add_argument("--topic", metavar="T", help="only clients publishing or subscribing this topic")


def _add_mqtt(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    """Listings are of every namespace unless --namespace names one; the others act in --namespace."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    _leaf(actions, "clients", shared, _mqtt_clients, "MQTT clients connected to every proxy (reported every 5 s)")
    _leaf(actions, "sessions", shared, _mqtt_sessions, "MQTT sessions kept: connected or not, expiry, subscriptions")
    _leaf(actions, "subscriptions", shared, _mqtt_subscriptions, "MQTT subscriptions of every session, with options")
    retained = _leaf(actions, "retained", shared, _mqtt_retained, "retained MQTT messages (topic, size, QoS)")
    retained.add_argument("--filter", metavar="F", default="", help="only topics this MQTT filter matches (a/+/c, a/#)")
    retained.add_argument("--limit", type=int, default=1000, help="at most this many rows (default 1000)")
    changes: list[tuple[str, Action, str]] = [
        ("kick", _mqtt_kick, "close an MQTT client's connection (its session is kept)"),
        ("drop-session", _mqtt_drop, "end an MQTT session: connection, subscriptions, state"),
        ("delete-retained", _mqtt_delete_retained, "delete the retained message of a topic"),
    ]
    for name, run, text in changes:
        leaf = _leaf(actions, name, shared, run, text)
        leaf.add_argument("target", metavar="TOPIC" if name == "delete-retained" else "CLIENT_ID")


async def _mqtt_clients(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.list_clients(cluster, args.namespace or None)


async def _mqtt_sessions(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.list_sessions(cluster, args.namespace or None)


async def _mqtt_subscriptions(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.list_subscriptions(cluster, args.namespace or None)


async def _mqtt_retained(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.list_retained(cluster, args.namespace, args.filter, args.limit)


async def _mqtt_kick(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.kick(cluster, args.namespace, args.target)


async def _mqtt_drop(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.drop_session(cluster, args.namespace, args.target)


async def _mqtt_delete_retained(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import mqtt

    return await mqtt.delete_retained(cluster, args.namespace, args.target)


def _add_amqp(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listings: list[tuple[str, Action, str]] = [
        ("vhosts", _amqp_vhosts, "AMQP vhosts (Sluice namespaces): exchanges, queues, bindings, users allowed"),
        ("exchanges", _amqp_exchanges, "AMQP exchanges (built-in ones too) per vhost"),
        ("queues", _amqp_queues, "AMQP queues: ready and unacked messages, flags, topic"),
        ("bindings", _amqp_bindings, "AMQP bindings: source, destination, routing key"),
        ("connections", _amqp_connections, "AMQP connections of every proxy (reported every 5 s)"),
        ("channels", _amqp_channels, "AMQP channels of every proxy: consumers, unacked, prefetch, confirm, tx"),
    ]
    for name, run, text in listings:
        leaf = _leaf(actions, name, shared, run, text)
        if name != "vhosts":
            leaf.add_argument("--vhost", metavar="V", help="only this vhost")


def _add_nameserver(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    _leaf(actions, "list", shared, _nameserver_list, "each NameServer: does it answer, how many brokers and topics")


def _add_proxy(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = _leaf(actions, "list", shared, _proxy_list, "proxies of a navigation server: zone, load, draining")
    listing.add_argument("--navigation", required=True, metavar="HOST:PORT", help="the navigation server to ask")


def _add_broker(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = _leaf(actions, "list", shared, _broker_list, "brokers registered with the NameServer")
    listing.add_argument(
        "--etcd", metavar="URL", help="etcd of the broker groups: list every member with its role, epoch and lag"
    )
    draining = _leaf(actions, "drain", shared, _broker_drain, "stop writes to a broker; consumers finish what it holds")
    draining.add_argument("broker", metavar="NAME")
    draining.add_argument(
        "--wait-s", type=float, default=0.0, metavar="S", help="wait up to S seconds for its backlog to be consumed"
    )
    undrain = _leaf(actions, "undrain", shared, _broker_undrain, "let a drained broker take writes again")
    undrain.add_argument("broker", metavar="NAME")
    switching = _leaf(actions, "switchover", shared, _broker_switchover,
                      "planned switchover of a broker group's primary to another member, losing nothing")  # fmt: skip
    switching.add_argument("group", metavar="GROUP")
    switching.add_argument("--to", required=True, metavar="NAME", help="the in-sync member to become primary")
    switching.add_argument("--etcd", required=True, metavar="URL", help="etcd of the broker groups")
    switching.add_argument(
        "--wait-s", type=float, default=SWITCHOVER_WAIT_S, metavar="S", help="give up (and withdraw) after S seconds"
    )


# -- actions --------------------------------------------------------------------------------------


async def _topic_create(cluster: Cluster, args: argparse.Namespace) -> Report:
    brokers = parse_names(args.brokers) if args.brokers is not None else None
    attributes: dict[str, int] = {}
    if args.max_priority is not None:
        attributes["max_priority"] = args.max_priority
    if args.lite_expiration is not None:
        attributes["lite_expiration_s"] = parse_duration_s(args.lite_expiration, "--lite-expiration")
    if args.max_lite_topics is not None:
        attributes["max_lite_topics"] = args.max_lite_topics
    return await topics.create_topic(cluster, args.name, parse_message_types(args.type), args.queues, brokers,
                                     attributes, update=args.update)  # fmt: skip


async def _topic_update(cluster: Cluster, args: argparse.Namespace) -> Report:
    brokers = parse_names(args.brokers) if args.brokers is not None else None
    return await topics.update_permission(cluster, args.name, topics.PERMISSIONS[args.perm], brokers)


async def _lite_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    # The namespace (if any) is already on the topic and the group (see _execute).
    return await topics.list_lite_topics(cluster, args.topic, args.group, args.limit)


async def _topic_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await topics.list_topics(cluster)


async def _topic_describe(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await topics.describe_topic(cluster, args.name)


async def _topic_delete(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await topics.delete_topic(cluster, args.name)


async def _group_create(cluster: Cluster, args: argparse.Namespace) -> Report:
    consume_from, timestamp_ms = parse_consume_from(args.consume_from)
    spec = GroupSpec(args.name, fifo=args.fifo, consume_from=consume_from, consume_from_timestamp_ms=timestamp_ms)
    if args.max_attempts is not None:
        spec = dataclasses.replace(spec, max_delivery_attempts=args.max_attempts)
    if args.retry_policy is not None:
        spec = dataclasses.replace(spec, retry_policy=parse_retry_policy(args.retry_policy))
    return await groups.create_group(cluster, spec)


async def _group_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await groups.list_groups(cluster)


async def _group_describe(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await groups.describe_group(cluster, args.name)


async def _group_delete(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await groups.delete_group(cluster, args.name)


async def _group_reset_offset(cluster: Cluster, args: argparse.Namespace) -> Report:
    target = parse_reset_target(args.to)
    return await offsets.reset_offsets(cluster, args.name, args.topic, target, queue=args.queue,
                                       broker=args.broker, dry_run=args.dry_run)  # fmt: skip


async def _amqp_vhosts(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import amqp

    return amqp.list_vhosts(await amqp.metadata(cluster), await security.read(cluster))


async def _amqp_exchanges(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import amqp

    return await amqp.list_exchanges(cluster, args.vhost)


async def _amqp_queues(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import amqp

    return await amqp.list_queues(cluster, args.vhost, await amqp.consumer_counts(cluster, args.vhost))


async def _amqp_bindings(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import amqp

    return await amqp.list_bindings(cluster, args.vhost)


async def _amqp_connections(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import amqp

    return await amqp.list_connections(cluster, args.vhost)


async def _amqp_channels(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import amqp

    return await amqp.list_channels(cluster, args.vhost)


async def _client_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await clients.list_clients(cluster, group=args.group, topic=args.topic)


async def _message_get(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await messages.get_message(cluster, args.topic, args.message_id)


async def _message_find(cluster: Cluster, args: argparse.Namespace) -> Report:
    if args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    return await messages.find_messages(cluster, args.topic, args.key, args.limit)


def _bodies(args: argparse.Namespace) -> list[bytes]:
    """BODY, the whole --file, or one message per non-empty line of stdin (read before any call)."""
    if args.body is not None and args.file is not None:
        raise ConfigError("give a BODY or --file, not both")
    if args.body is not None:
        return [args.body.encode()]
    if args.file is not None:
        try:
            return [Path(args.file).read_bytes()]
        except OSError as exc:
            raise ConfigError(f"--file {args.file}: {exc.strerror}") from None
    return [line.rstrip(b"\r\n") for line in sys.stdin.buffer if line.strip()]


async def _message_send(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import produce

    bodies = _bodies(args)
    properties = {}
    for item in args.property:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--property {item!r}: use KEY=VALUE")
        properties[key] = value
    deliver_at = parse_consume_from(args.deliver_at)[1] if args.deliver_at is not None else 0
    options = produce.SendOptions(args.tag, tuple(args.key), properties, args.message_group, deliver_at)
    return await produce.send_messages(cluster, args.topic, bodies, options)


async def _message_tail(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import produce

    if args.count < 0 or args.for_s < 0:
        raise ConfigError("--count and --for-s must not be negative")
    if args.ack and not args.group:
        raise ConfigError("--ack consumes as a group: give --group")
    options = produce.TailOptions(group=args.group, ack=args.ack, count=args.count, for_s=args.for_s)
    if args.start is not None:
        where, at_ms = parse_consume_from(args.start)
        options.start, options.start_ms = ("time", at_ms) if where is ConsumeFrom.TIMESTAMP else (where.value, 0)
    elif args.group:
        options.start = "group"

    def started() -> None:
        print(produce.tail_start(args.topic, options), file=sys.stderr, flush=True)
        if not args.json:
            print(produce.tail_header(), flush=True)

    n = await produce.tail_messages(
        cluster, args.topic, options, lambda b, m: print(produce.tail_line(b, m, args.json), flush=True), started
    )
    if not args.json:
        print(f"{n} message(s)", flush=True)
    return Report(columns=[], streamed=True)


async def _message_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import produce

    return await produce.list_messages(cluster, args.topic, args.queue, args.from_offset, args.count, args.broker)


async def _message_range(cluster: Cluster, args: argparse.Namespace) -> Report:
    begin = parse_time_ms(args.begin, "--from")
    end = parse_time_ms(args.end, "--to") if args.end else int(time.time() * 1000)
    return await messages.list_messages(cluster, args.topic, begin, end, args.limit)


async def _message_trace(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await trace.trace_message(cluster, args.message_id)


async def _broker_drain(cluster: Cluster, args: argparse.Namespace) -> Report:
    if args.wait_s < 0:
        raise ConfigError(f"--wait-s must not be negative, got {args.wait_s}")
    return await drain.drain_broker(cluster, args.broker, wait_s=args.wait_s)


async def _broker_undrain(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await drain.undrain_broker(cluster, args.broker)


async def _dlq_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    if args.name is None:
        return await dlq.list_dead_letter_groups(cluster)
    return await dlq.list_dead_letters(cluster, args.name)


async def _dlq_resend(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await dlq.resend(cluster, args.name, None if args.all else args.ids, args.to)


async def _nameserver_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await nameservers.list_nameservers(args.namesrv, args.timeout_s)


async def _proxy_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import proxies
    from navigation.client import NavigationClient

    async with NavigationClient(args.navigation, timeout_s=args.timeout_s) as navigation:
        return await proxies.list_proxies(navigation)


async def _broker_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import brokers

    return await brokers.list_brokers(cluster, args.etcd)


async def _broker_switchover(cluster: Cluster, args: argparse.Namespace) -> Report:
    from admin import brokers

    if args.wait_s <= 0:
        raise ConfigError(f"--wait-s must be positive, got {args.wait_s}")
    return await brokers.switchover(cluster, args.etcd, args.group, args.to, args.wait_s)


# -- tiered storage -------------------------------------------------------------------------------


def _add_tier(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    _leaf(actions, "status", shared, _tier_status, "per broker and topic: local and tiered ranges, upload lag, bytes")
    upload = _leaf(
        actions, "upload-now", shared, _tier_upload_now, "tier everything of a topic stored so far, and wait for it"
    )
    upload.add_argument("topic", metavar="TOPIC")
    upload.add_argument(
        "--wait-s",
        type=float,
        default=DEFAULT_UPLOAD_WAIT_S,
        metavar="S",
        help=f"how long brokers may take (default {DEFAULT_UPLOAD_WAIT_S:g})",
    )
    evict = _leaf(actions, "evict-local", shared, _tier_evict_local, "drop local copies of a topic's tiered data now")
    evict.add_argument("topic", metavar="TOPIC")


async def _tier_status(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await tier.status(cluster)


async def _tier_upload_now(cluster: Cluster, args: argparse.Namespace) -> Report:
    if args.wait_s <= 0:
        raise ConfigError(f"--wait-s must be positive, got {args.wait_s}")
    return await tier.upload_now(cluster, args.topic, args.wait_s,
                                 progress=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip


async def _tier_evict_local(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await tier.evict_local(cluster, args.topic)


# -- users, access rules, limits (admin/security.py) ---------------------------------------


def _add_user(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = _leaf(actions, "create", shared, _user_create, "create a user; its secret is never shown again")
    create.add_argument("access_key", metavar="ACCESS_KEY")
    create.add_argument("--secret", required=True, metavar="SECRET", help="the secret, or - to read it from stdin")
    delete = _leaf(actions, "delete", shared, _user_delete, "delete a user and its access rules")
    delete.add_argument("access_key", metavar="ACCESS_KEY")
    _leaf(actions, "list", shared, _user_list, "list users (access keys only)")


def _add_acl(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    grant = _leaf(actions, "grant", shared, _acl_grant, "allow (or with --deny forbid) actions on resources")
    grant.add_argument("access_key", metavar="ACCESS_KEY")
    grant.add_argument("--resource", required=True, metavar="R", help="topic:NAME, group:NAME, topic:PREFIX*, *")
    grant.add_argument("--actions", required=True, metavar="A,B", help="PUB, SUB, ADMIN (ADMIN: every action)")
    grant.add_argument("--deny", action="store_true", help="a deny rule: wins over any allow rule")
    revoke = _leaf(actions, "revoke", shared, _acl_revoke, "remove actions (default all) from a user's rules")
    revoke.add_argument("access_key", metavar="ACCESS_KEY")
    revoke.add_argument("--resource", required=True, metavar="R")
    revoke.add_argument("--actions", metavar="A,B")
    listing = _leaf(actions, "list", shared, _acl_list, "list access rules (of one user)")
    listing.add_argument("access_key", metavar="ACCESS_KEY", nargs="?")


def _add_limit(parser: argparse.ArgumentParser, shared: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    text = "limit produce to a namespace (default) or --topic, or receives of a --group; 0 removes"
    setter = _leaf(actions, "set", shared, _limit_set, text)
    delete = _leaf(actions, "delete", shared, _limit_delete, "remove a limit")
    for leaf in (setter, delete):
        which = leaf.add_mutually_exclusive_group()
        which.add_argument("--topic", metavar="T")
        which.add_argument("--group", metavar="G")
    setter.add_argument("--messages-per-s", type=float, default=0.0, metavar="N")
    setter.add_argument("--bytes-per-s", type=float, default=0.0, metavar="N", help="produce only")
    _leaf(actions, "list", shared, _limit_list, "list limits")


async def _user_create(cluster: Cluster, args: argparse.Namespace) -> Report:
    secret = sys.stdin.readline().rstrip("\n") if args.secret == "-" else args.secret
    return await security.edit(cluster, security.create_user(args.access_key, secret))


async def _user_delete(cluster: Cluster, args: argparse.Namespace) -> Report:
    return await security.edit(cluster, security.delete_user(args.access_key))


async def _user_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return security.list_users(await security.read(cluster))


async def _acl_grant(cluster: Cluster, args: argparse.Namespace) -> Report:
    effect = Effect.DENY if args.deny else Effect.ALLOW
    change = security.grant(args.access_key, args.namespace, parse_pattern(args.resource),
                            parse_actions(args.actions), effect)  # fmt: skip
    return await security.edit(cluster, change)


async def _acl_revoke(cluster: Cluster, args: argparse.Namespace) -> Report:
    acts = parse_actions(args.actions) if args.actions else None
    return await security.edit(cluster, security.revoke(args.access_key, args.namespace,
                                                        parse_pattern(args.resource), acts))  # fmt: skip


async def _acl_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return security.list_rules(await security.read(cluster), args.access_key)


def _limit_key(args: argparse.Namespace) -> tuple[LimitScope, str]:
    if args.topic:
        return LimitScope.TOPIC, args.topic
    if args.group:
        return LimitScope.GROUP, args.group
    return LimitScope.NAMESPACE, ""


async def _limit_set(cluster: Cluster, args: argparse.Namespace) -> Report:
    scope, name = _limit_key(args)
    limit = Limit(scope, args.namespace, name, args.messages_per_s, args.bytes_per_s)
    return await security.edit(cluster, security.set_limit(limit))


async def _limit_delete(cluster: Cluster, args: argparse.Namespace) -> Report:
    scope, name = _limit_key(args)
    return await security.edit(cluster, security.delete_limit(scope, args.namespace, name))


async def _limit_list(cluster: Cluster, args: argparse.Namespace) -> Report:
    return security.list_limits(await security.read(cluster))
