"""`sluice bench`: load-generate against a proxy, or measure the bare gRPC ceiling.

    sluice bench produce --endpoint HOST:PORT[;HOST:PORT] --topic T (--rate R | --max) --duration S
                         --concurrency C [--batch B] [--size BYTES] [--namespace NS] [--ignore-routes] [--json]
    sluice bench consume --endpoint ... --topic T --group G --duration S --concurrency C
    sluice bench e2e     --endpoint ... --topic T --group G (--rate R | --max) --duration S ...
    sluice bench echo-server --port P
    sluice bench echo    --endpoint HOST:PORT --size BYTES --batch B --concurrency C --duration S

Each call goes to the endpoint of its queue in the topic's route, as the official clients send
(`--ignore-routes`: to the endpoints given). Prints a progress line per second on stderr and a
table (or JSON with `--json`) on stdout at the end. Stops by itself after the warm-up plus
`--duration`, or on SIGINT/SIGTERM (then reports what it measured). Exit code: 0 when every call
succeeded, 1 when some failed or the setup failed (cannot connect, QueryRoute failed), 2 for a bad
argument. The topic and group should exist (`sluice admin topic create` / `group create`) unless
the server creates them on first use.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from bench.client import TRANSPORTS, CallError
from bench.echo import serve_echo
from bench.report import render_json, render_table
from bench.runner import BenchOptions, run_bench
from common.config import ConfigError
from processes.runtime import serve

NAME = "bench"
HELP = "Load-generate against a proxy (produce, consume, e2e) or measure the bare gRPC ceiling (echo)."
DEFAULT_ENDPOINT = "127.0.0.1:8081"
DEFAULT_ECHO_PORT = 8091
EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    for mode, text in (
        ("produce", "send messages (B per SendMessage call) at a fixed rate or as fast as possible"),
        ("consume", "receive batches (long polling) and ack each batch in one AckMessage"),
        ("e2e", "produce and consume at once; end-to-end latency from the born time to receipt"),
        ("echo", "send to `sluice bench echo-server`: the gRPC + protobuf ceiling for the same calls"),
    ):
        _add_client_arguments(modes.add_parser(mode, help=text, description=text), mode)
    server = modes.add_parser("echo-server", help="serve the echo method until SIGTERM/SIGINT")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=DEFAULT_ECHO_PORT, help=f"default {DEFAULT_ECHO_PORT}")


def _add_client_arguments(p: argparse.ArgumentParser, mode: str) -> None:
    p.add_argument(
        "--endpoint",
        default=DEFAULT_ENDPOINT,
        metavar="HOST:PORT[;HOST:PORT]",
        help=f"where to connect (default {DEFAULT_ENDPOINT}): the topic's route is asked of the first, then each "
        "call goes to its queue's endpoint in the route (see --ignore-routes)",
    )
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="measured seconds (default 10)")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S", help="seconds run but not counted (default 1)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        metavar="C",
        help="concurrent tasks: calls in flight (produce) or receive loops (consume) (default 16)",
    )
    p.add_argument("--channels", type=int, default=1, metavar="N", help="connections per endpoint (default 1)")
    if mode != "echo":
        p.add_argument("--ignore-routes", action="store_true",
                       help="send every call to --endpoint (tasks spread over its endpoints) instead of to the "
                            "endpoint of each call's queue in the topic's route, as the official clients do; with "
                            "`sluice up --shards N` a node then forwards what another node owns")  # fmt: skip
    p.add_argument("--timeout", type=float, default=5.0, metavar="S", help="deadline of each call (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.add_argument("--histograms", action="store_true", help="with --json: include raw latency histograms")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--watch-pids", default="", metavar="PID[,PID]",
                   help="also report the CPU time these local processes use while measuring (Linux)")  # fmt: skip
    p.add_argument("--size", type=int, default=1024, metavar="BYTES", help="message body size (default 1024)")
    p.add_argument("--generator", choices=TRANSPORTS, default="http2",
                   help="who makes the calls: http2 (the bench's own HTTP/2 client, the least CPU per call; "
                        "default) or grpc (grpc.aio, as before); the result says which ran")  # fmt: skip
    if mode != "echo":
        p.add_argument("--access-key", metavar="AK", help="sign every request as this user (proxies with auth on)")
        p.add_argument("--secret", metavar="SK", help="the user's secret")
        p.add_argument("--topic", default="bench", help="topic (default bench)")
        p.add_argument("--namespace", default="", metavar="NS", help="namespace header and resource namespace")
    if mode in ("consume", "e2e"):
        p.add_argument("--group", default="sluice-bench", metavar="G", help="consumer group (default sluice-bench)")
        p.add_argument("--receive-batch", type=int, default=32, metavar="N", help="messages per receive (max 32)")
        p.add_argument("--long-poll", type=float, default=1.0, metavar="S", help="long polling timeout (default 1)")
        p.add_argument("--invisible", type=float, default=30.0, metavar="S", help="invisible duration (default 30)")
    if mode == "e2e":
        p.add_argument("--consumers", type=int, default=0, metavar="N", help="receive loops (default --concurrency)")
    if mode != "consume":
        p.add_argument("--batch", type=int, default=1, metavar="B", help="messages per SendMessage (default 1)")
        pace = p.add_mutually_exclusive_group()
        pace.add_argument("--rate", type=float, metavar="R", help="total messages per second, on a fixed schedule")
        pace.add_argument("--max", action="store_true", help="as fast as the server answers (the default)")


def options(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        mode=args.mode,
        endpoints=tuple(e.strip() for e in args.endpoint.split(";") if e.strip()),
        topic=getattr(args, "topic", "echo"),
        group=getattr(args, "group", "sluice-bench"),
        namespace=getattr(args, "namespace", ""),
        size_bytes=args.size,
        rate_per_s=getattr(args, "rate", None),
        duration_s=args.duration,
        warmup_s=args.warmup,
        concurrency=args.concurrency,
        consumers=getattr(args, "consumers", 0),
        batch=getattr(args, "batch", 1),
        receive_batch=getattr(args, "receive_batch", 32),
        invisible_s=getattr(args, "invisible", 30.0),
        long_poll_s=getattr(args, "long_poll", 1.0),
        timeout_s=args.timeout,
        channels=args.channels,
        progress=not args.quiet,
        watch_pids=_pids(args.watch_pids),
        access_key=getattr(args, "access_key", "") or "",
        secret=getattr(args, "secret", "") or "",
        generator=args.generator,
        follow_routes=not getattr(args, "ignore_routes", False),
    )


def _pids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--watch-pids wants comma-separated process ids, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    if args.mode == "echo-server":
        return _run_echo_server(args)
    opts = options(args)
    opts.validate()  # a ConfigError here is a bad argument (exit 2, printed by the CLI)

    async def main(stop: asyncio.Event) -> int:
        try:
            result = await run_bench(opts, stop)
        except CallError as exc:
            print(f"sluice bench {opts.mode}: setup failed: {exc}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        print(render_json(result, histograms=args.histograms) if args.json else render_table(result), flush=True)
        return EXIT_FAILED if result["error_total"] else 0

    return serve(main)


def _run_echo_server(args: argparse.Namespace) -> int:
    async def main(stop: asyncio.Event) -> int:
        await serve_echo(args.host, args.port, stop,
                         on_ready=lambda a: print(f"echo server listening on {a}", flush=True))  # fmt: skip
        return 0

    return serve(main)
