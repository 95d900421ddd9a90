"""The client-side flags shared by `sluice up`, `sluice proxy` and `sluice node`: `--amqp-port`,
`--mqtt-port`, `--mqtt-ws-port`, and the `[proxy]` overrides of `--auth`, `--tls-cert`, `--tls-key`.

A module of their own so that `sluice proxy` does not import `sluice up` (and with it the broker,
the NameServer and the console) to read two flags.
"""

from __future__ import annotations

import argparse


def add_amqp_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """`--amqp-port`."""
    parser.add_argument("--amqp-port", type=int, help=f"AMQP 0-9-1 port for RabbitMQ clients (docs/amqp.md; "
                        f"{default}; 0 picks one; -1: off)")  # fmt: skip


def add_mqtt_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """`--mqtt-port` and `--mqtt-ws-port`."""
    parser.add_argument("--mqtt-port", type=int, help=f"MQTT 3.1.1/5.0 port (docs/mqtt.md; {default}; 0 picks one; "
                        "-1: off; TLS with --tls-cert)")  # fmt: skip
    parser.add_argument("--mqtt-ws-port", type=int, help="MQTT over WebSocket port, for browsers (subprotocol mqtt; "
                        "default: off; 0 picks one)")  # fmt: skip


def mqtt_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {"mqtt.port": args.mqtt_port, "mqtt.ws_port": args.mqtt_ws_port}


def security_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The `[proxy]` overrides of `--auth`, `--tls-cert`, `--tls-key`."""
    return {
        "auth.enabled": None if args.auth is None else args.auth == "on",
        "tls.cert_file": args.tls_cert,
        "tls.key_file": args.tls_key,
    }
