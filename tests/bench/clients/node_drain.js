// Drain a backlog with the official Node.js client (rocketmq-client-nodejs), for
// tests/bench/backlog_drain_bench.py:
//
//   node node_drain.js '<json options>'
//
// options: endpoint, topic, group, count, timeoutS, modulesDir (where npm installed the client:
// tests/e2e/node/node_modules). One SimpleConsumer (a 3 s await) receives 32 at a time (30 s
// invisible) and acks each message, until `count` messages came or `timeoutS` passed. The last
// stdout line is {"messages": N, "seconds": S, "by": {broker: N}, "error": null | "..."}: seconds
// from the first receive to the last message.
'use strict';

const path = require('path');

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const { SimpleConsumer } = require(path.join(opts.modulesDir, 'rocketmq-client-nodejs'));
  const result = { messages: 0, seconds: 0, by: {}, error: null };
  const consumer = new SimpleConsumer({
    endpoints: opts.endpoint,
    consumerGroup: opts.group,
    subscriptions: new Map([[opts.topic, '*']]),
    awaitDuration: 3000,
    requestTimeout: 10000,
  });
  try {
    await consumer.startup();
    const start = process.hrtime.bigint();
    const deadline = Date.now() + opts.timeoutS * 1000;
    while (result.messages < opts.count && Date.now() < deadline) {
      for (const m of await consumer.receive(32, 30000)) {
        await consumer.ack(m);
        const broker = m.receiptHandle.split('~', 1)[0];
        result.by[broker] = (result.by[broker] || 0) + 1;
        result.messages += 1;
      }
    }
    result.seconds = Number(process.hrtime.bigint() - start) / 1e9;
    if (result.messages < opts.count) {
      result.error = `drained ${result.messages} of ${opts.count} in ${opts.timeoutS} s`;
    }
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    await Promise.allSettled([consumer.shutdown()]);
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  process.exit(result.error ? 1 : 0);
}

main();
