// One send, then one receive, repeated (issue 30), with the official Node.js client, driven by
// tests/e2e/test_receive_anywhere.py:
//
//   node single_receive.js '<json options>'
//
// options: endpoints, topic, group, runs. Each run starts a new SimpleConsumer (a 3 s await, as the
// README's Python snippet), sends one message and makes a single receive(16, 15 s), acking what
// came. The last stdout line is the result as JSON: {"runs": [{"sent", "received": [ids], "handle"}],
// "error": null | "..."}.
'use strict';

const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const result = { runs: [], error: null };
  const producer = new Producer({ endpoints: opts.endpoints, requestTimeout: 3000 });
  try {
    await producer.startup();
    for (let run = 0; run < opts.runs; run++) {
      const consumer = new SimpleConsumer({
        endpoints: opts.endpoints,
        consumerGroup: opts.group,
        subscriptions: new Map([[opts.topic, '*']]),
        awaitDuration: 3000,
        requestTimeout: 3000,
      });
      try {
        await consumer.startup();
        const receipt = await producer.send({ topic: opts.topic, body: Buffer.from(`run ${run}`) });
        const got = await consumer.receive(16, 15000);
        for (const m of got) {
          await consumer.ack(m);
        }
        result.runs.push({
          sent: receipt.messageId,
          received: got.map(m => m.messageId),
          handle: got.length ? got[0].receiptHandle : null,
        });
      } finally {
        await consumer.shutdown();
      }
    }
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    await Promise.allSettled([producer.shutdown()]);
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(result.error ? 1 : 0);
}

main();
