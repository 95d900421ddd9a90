// Transactions with the official RocketMQ Node.js client against Sluice, driven by
// tests/e2e/test_node_client.py:
//
//   node transactions.js '<json options>'
//
// options: endpoints, topic, group, timeoutMs. One producer (with a TransactionChecker that answers
// COMMIT (1) for the body "node-orphan") sends three half messages: "node-commit" is committed,
// "node-rollback" rolled back, "node-orphan" left for the server's check-back. A SimpleConsumer then
// receives (acking each) until "node-commit" and "node-orphan" arrived, and 3 s more.
// The last stdout line is the result as JSON: {"received": [...], "checked": [...], "error": null | "..."}.
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const COMMIT = 1;
const UNSPECIFIED = 0;
const QUIET_MS = 3000;

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const result = { received: [], checked: [], error: null };
  const checker = {
    async check(messageView) {
      const body = messageView.body.toString('utf8');
      result.checked.push({ messageId: messageView.messageId, body, topic: messageView.topic });
      return body === 'node-orphan' ? COMMIT : UNSPECIFIED;
    },
  };
  const producer = new Producer({ endpoints: opts.endpoints, topic: opts.topic, checker, requestTimeout: 3000 });
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
    for (const [body, end] of [['node-commit', 'commit'], ['node-rollback', 'rollback'], ['node-orphan', null]]) {
      const tx = producer.beginTransaction();
      await producer.send({ topic: opts.topic, body: Buffer.from(body) }, tx);
      if (end !== null) {
        await tx[end]();
      }
    }
    const deadline = Date.now() + opts.timeoutMs;
    let quietUntil = null;
    while (quietUntil === null || Date.now() < quietUntil) {
      if (Date.now() > deadline) {
        throw new Error(`timed out after ${opts.timeoutMs} ms`);
      }
      for (const m of await consumer.receive(16, 15000)) {
        await consumer.ack(m);
        result.received.push({ messageId: m.messageId, body: m.body.toString('utf8'), corrupted: m.corrupted === true });
      }
      const bodies = new Set(result.received.map(r => r.body));
      if (quietUntil === null && bodies.has('node-commit') && bodies.has('node-orphan')) {
        quietUntil = Date.now() + QUIET_MS;
      }
    }
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    await Promise.allSettled([consumer.shutdown(), producer.shutdown()]);
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(result.error ? 1 : 0);
}

main();
