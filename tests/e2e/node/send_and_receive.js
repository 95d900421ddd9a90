// The official RocketMQ Node.js client (rocketmq-client-nodejs, pinned in package.json) against Sluice,
// driven by tests/e2e/test_node_client.py:
//
//   node send_and_receive.js '<json options>'
//
// options: endpoints, topic, group, count (messages to send), expect (message ids sent by others that
// must be received too), timeoutMs. Sends `count` messages (tag, keys, properties), then receives with
// a SimpleConsumer, acking each, until every sent and expected id arrived or the timeout passed.
// The last stdout line is the result as JSON: {"sent": [...], "received": [...], "error": null | "..."}.
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const result = { sent: [], received: [], error: null };
  const producer = new Producer({ endpoints: opts.endpoints, requestTimeout: 3000 });
  const consumer = new SimpleConsumer({
    endpoints: opts.endpoints,
    consumerGroup: opts.group,
    subscriptions: new Map([[opts.topic, '*']]),
    awaitDuration: 1000,
    requestTimeout: 3000,
  });
  try {
    await producer.startup();
    await consumer.startup();
    for (let i = 0; i < opts.count; i++) {
      const body = `from-node-${i}`;
      const receipt = await producer.send({
        topic: opts.topic,
        tag: 'FromNode',
        keys: [`node-key-${i}`],
        properties: new Map([['index', String(i)], ['client', 'nodejs']]),
        body: Buffer.from(body),
      });
      result.sent.push({ messageId: receipt.messageId, body });
    }
    const wanted = new Set([...result.sent.map(s => s.messageId), ...opts.expect]);
    const deadline = Date.now() + opts.timeoutMs;
    while ([...wanted].some(id => !result.received.some(r => r.messageId === id))) {
      if (Date.now() > deadline) {
        throw new Error(`timed out after ${opts.timeoutMs} ms`);
      }
      for (const m of await consumer.receive(16, 15000)) {
        await consumer.ack(m);
        result.received.push({
          messageId: m.messageId,
          topic: m.topic,
          body: m.body.length > 1024 ? null : m.body.toString('utf8'),
          bodyLength: m.body.length,
          tag: m.tag ?? null,
          keys: m.keys,
          properties: Object.fromEntries(m.properties),
          deliveryAttempt: m.deliveryAttempt,
          corrupted: m.corrupted === true, // set only when the digest check fails
        });
      }
    }
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    await Promise.allSettled([consumer.shutdown(), producer.shutdown()]);
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  // grpc-js keeps timers alive for a while after shutdown; the result is out, so leave now.
  process.exit(result.error ? 1 : 0);
}

main();
