"""The Celery application of tests/e2e/test_amqp.py: its worker runs as a real `celery worker`
process (kombu over py-amqp) against a cluster's AMQP endpoint, given in SLUICE_CELERY_BROKER;
results come back over AMQP too (the `rpc://` backend: a reply queue per client)."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("sluice_e2e", broker=os.environ.get("SLUICE_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
             backend="rpc://")  # fmt: skip
app.conf.update(broker_connection_retry_on_startup=True,
                task_default_queue=os.environ.get("SLUICE_CELERY_QUEUE", "celery"))  # fmt: skip


@app.task(name="sluice_e2e.add")
def add(x: int, y: int) -> int:
    return x + y
