"""Send and receive with the official Python client over TLS (`tls_enable=True`), in a process of
its own: gRPC reads its trusted roots (`GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`, set by the caller to the
test's self-signed certificate) once per process, so the end-to-end process itself stays untouched.

    python -m tests.e2e.support.tls_client ENDPOINTS TOPIC GROUP COUNT

Prints one JSON line: {"sent": [ids], "received": [ids]}.
"""

from __future__ import annotations

import json
import sys

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from tests.e2e.support.clients import REQUEST_TIMEOUT_S, message, receive_count, send_all


def main(endpoints: str, topic: str, group: str, count: int) -> None:
    config = ClientConfiguration(endpoints, Credentials(), request_timeout=REQUEST_TIMEOUT_S)
    producer = Producer(config, (topic,), tls_enable=True)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=1, tls_enable=True)
    producer.startup()
    consumer.startup()
    try:
        sent = send_all(producer, [message(topic, f"tls {i}".encode()) for i in range(count)])
        received = [m.message_id for m in receive_count(consumer, count)]
    finally:
        producer.shutdown()
        consumer.shutdown()
    print(json.dumps({"sent": sent, "received": received}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
