"""Screenshots of every console page, against a real merged Sluice with traffic, tiering and a dead letter.

    PYTHONPATH=. .venv/bin/python scripts/console_screenshots.py [--out DIR] [--widths 1280,1920] [--traffic-s 40]

Starts a moto S3 server and `sluice up` (tiering into it, the console sampling every 2 s) on free
loopback ports, produces to a topic while a consumer group keeps up, dead-letters one message, tiers
a topic and evicts its local copy, then saves `<page>-<width>.png` of every page in `--out` (default:
a temporary directory, printed; a page is cut at 1,400 px high). docs/img/console-<page>.png are the
cluster, topic, tiered-topic, group and message pages at 1280 px of this script. Needs Debian's
chromium and Playwright (tests/e2e/support/browser.py) and moto.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
from playwright.sync_api import sync_playwright

from tests.e2e.support.browser import ARGS, chromium_path
from tests.e2e.support.clients import message, producer, receive_until, send_all, simple_consumer
from tests.e2e.support.cluster import Cluster, start_merged
from tests.helpers.procs import LOOPBACK, free_port, start_process

PAGES = ["cluster", "topics", "topic", "tiered-topic", "groups", "group", "messages", "message", "dlq", "dlq-group",
         "access"]  # fmt: skip
SHOT_HEIGHT_MAX = 1400  # a long list (200 messages) is cut there
CONFIG = """
[console]
sample_interval_s = 2.0

[broker.store.commitlog]
segment_bytes = 16384

[broker.tiering]
region = "us-east-1"
addressing_style = "path"
segment_target_bytes = 8192
row_group_rows = 16
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--widths", default="1280,1920")
    parser.add_argument("--traffic-s", type=float, default=40.0)
    args = parser.parse_args()
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="console-shots-"))
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="console-cluster-"))
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    moto_port = free_port()
    moto = start_process([sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(moto_port)],
                         port=moto_port, log_path=root / "moto.log", name="moto-s3")  # fmt: skip
    try:
        endpoint = f"http://{LOOPBACK}:{moto_port}"
        bucket = f"sluice-shots-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        (root / "sluice.toml").write_text(CONFIG)
        cluster = start_merged(root, extra_args=["--config", str(root / "sluice.toml"), "--s3-endpoint", endpoint,
                                                 "--s3-bucket", bucket, "--tier-min-age", "3600"])  # fmt: skip
        try:
            shoot(cluster, out, [int(w) for w in args.widths.split(",")], args.traffic_s)
        finally:
            cluster.stop()
    finally:
        moto.stop()
    print(f"screenshots in {out}")
    return 0


def shoot(cluster: Cluster, out: Path, widths: list[int], traffic_s: float) -> None:
    orders = cluster.create_topic("orders", queues=4)
    archive = cluster.create_topic("archive-2026", queues=1)
    cluster.create_topic("payments", queues=2)
    billing = cluster.create_group("billing", consume_from="earliest")
    cluster.create_group("audit-trail", consume_from="earliest")
    payer = cluster.create_group("payment-processor", max_attempts=1)
    with producer(cluster.endpoints, archive) as p:
        send_all(p, [message(archive, b"archived record %d " % i * 8, keys=[f"a{i}"]) for i in range(300)])
    cluster.admin("tier", "upload-now", archive, timeout_s=120)
    cluster.admin("tier", "evict-local", archive)
    payments = {"payments": _all()}
    with producer(cluster.endpoints, "payments") as p, simple_consumer(cluster.endpoints, payer, payments) as c:
        send_all(p, [message("payments", b'{"amount": 12.5, "currency": "EUR"}', tag="card", keys=["pay-1"])])
        receive_until(c, lambda got: len(got) >= 1, invisible_s=1, ack=False)
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(cluster, orders, billing, stop), daemon=True)
    traffic.start()
    first_id = ""
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": widths[0], "height": 900})
            for path in ("/cluster", f"/topics/{orders}", f"/groups/{billing}", "/topics", "/groups"):  # start sampling
                page.goto(cluster.console + path)
            time.sleep(traffic_s)
            page.goto(f"{cluster.console}/messages?topic={orders}")
            first_id = page.locator("#results a").first.inner_text()
            urls = {
                "cluster": "/cluster", "topics": "/topics", "topic": f"/topics/{orders}",
                "tiered-topic": f"/topics/{archive}", "groups": "/groups", "group": f"/groups/{billing}",
                "messages": f"/messages?topic={orders}", "message": f"/messages/{orders}/{first_id}",
                "dlq": "/dlq", "dlq-group": f"/dlq/{payer}", "access": "/access",
            }  # fmt: skip
            for width in widths:
                page.set_viewport_size({"width": width, "height": 900})
                for name in PAGES:
                    page.goto(cluster.console + urls[name])
                    height = min(SHOT_HEIGHT_MAX, page.evaluate("document.documentElement.scrollHeight"))
                    page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=True,
                                    clip={"x": 0, "y": 0, "width": width, "height": height})  # fmt: skip
            browser.close()
    finally:
        stop.set()
        traffic.join(timeout=30)


def _all() -> Any:
    from rocketmq import FilterExpression

    return FilterExpression()


def _traffic(cluster: Cluster, topic: str, group: str, stop: threading.Event) -> None:
    """10 to 20 messages a second into `topic`; `group` consumes them."""
    with producer(cluster.endpoints, topic) as p, simple_consumer(cluster.endpoints, group, {topic: _all()}) as c:
        i = 0
        while not stop.is_set():
            burst = 10 if (i // 100) % 2 else 5  # the rate changes, so that the plots show something
            send_all(p, [message(topic, b'{"order": %d, "items": 3}' % (i + k), tag="new", keys=[f"order-{i + k}"])
                         for k in range(burst)])  # fmt: skip
            i += burst
            for m in c.receive(16, 30):
                c.ack(m)
            time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
