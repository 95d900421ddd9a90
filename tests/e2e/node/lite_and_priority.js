// The official RocketMQ Node.js client's lite topics and priority messages against Sluice, driven by
// tests/e2e/test_node_client.py:
//
//   node lite_and_priority.js '<json options>'
//
// options: endpoints, liteTopic (a LITE bind topic), liteGroup, priorityTopic (a PRIORITY topic),
// priorityGroup, perLite (messages per lite topic), timeoutMs.
//
// Lite: a LitePushConsumer subscribes to lite topics "a" and "b" of the bind topic; a Producer sends
// perLite messages to each of "a", "b" and "c" (not subscribed); the consumer must get those of "a"
// and "b" and none of "c". It then unsubscribes "b"; one more message to each of "a" and "b" follows,
// and only the one of "a" may arrive. Priority: a Producer sends a backlog at priorities 1..9, then a
// SimpleConsumer receives it (the test checks the order per broker from the receipt handles).
// The last stdout line is the result as JSON:
//   {"lite": [{liteTopic, body, messageId}...], "priority": [{body, priority, handle}...], "error": ...}
'use strict';

const { ConsumeResult, LitePushConsumerImpl, Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const LEVELS = 9; // priorities 1..9: the client types a message with priority 0 as NORMAL (`!this.priority`)
const PRIORITY_BACKLOG = 30;
const QUIET_MS = 3000; // how long "c" and the unsubscribed "b" have to stay silent

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

async function until(predicate, deadline, what) {
  while (!predicate()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await sleep(100);
  }
}

async function lite(opts, producer, result, deadline) {
  const consumer = new LitePushConsumerImpl({
    endpoints: opts.endpoints,
    consumerGroup: opts.liteGroup,
    bindTopic: opts.liteTopic,
    requestTimeout: 3000,
    longPollingTimeout: 5000,
    messageListener: {
      consume(m) {
        result.lite.push({ liteTopic: m.liteTopic ?? null, body: m.body.toString('utf8'), messageId: m.messageId });
        return ConsumeResult.SUCCESS;
      },
    },
  });
  try {
    await consumer.startup();
    await consumer.subscribeLite('a');
    await consumer.subscribeLite('b');
    for (let i = 0; i < opts.perLite; i++) {
      for (const liteTopic of [ 'a', 'b', 'c' ]) {
        await producer.send({ topic: opts.liteTopic, liteTopic, body: Buffer.from(`${liteTopic}-${i}`) });
      }
    }
    await until(() => result.lite.length >= 2 * opts.perLite, deadline, 'the messages of lite topics a and b');
    await consumer.unsubscribeLite('b');
    result.liteTopicSet = [ ...consumer.getLiteTopicSet() ].sort();
    await producer.send({ topic: opts.liteTopic, liteTopic: 'b', body: Buffer.from('b-after') });
    await producer.send({ topic: opts.liteTopic, liteTopic: 'a', body: Buffer.from('a-after') });
    await until(() => result.lite.some(r => r.body === 'a-after'), deadline, 'a-after');
    await sleep(QUIET_MS);
  } finally {
    await consumer.shutdown();
  }
}

async function priority(opts, producer, result, deadline) {
  for (let i = 0; i < PRIORITY_BACKLOG; i++) {
    await producer.send({ topic: opts.priorityTopic, priority: 1 + (i % LEVELS), body: Buffer.from(`p${i}`) });
  }
  const consumer = new SimpleConsumer({
    endpoints: opts.endpoints,
    consumerGroup: opts.priorityGroup,
    subscriptions: new Map([[ opts.priorityTopic, '*' ]]),
    awaitDuration: 1000,
    requestTimeout: 3000,
  });
  try {
    await consumer.startup();
    while (result.priority.length < PRIORITY_BACKLOG) {
      if (Date.now() > deadline) {
        throw new Error('timed out waiting for the priority backlog');
      }
      for (const m of await consumer.receive(32, 15000)) {
        result.priority.push({ body: m.body.toString('utf8'), priority: m.priority ?? null, handle: m.receiptHandle });
        await consumer.ack(m);
      }
    }
  } finally {
    await consumer.shutdown();
  }
}

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const result = { lite: [], liteTopicSet: null, priority: [], error: null };
  const producer = new Producer({ endpoints: opts.endpoints, requestTimeout: 3000 });
  const deadline = Date.now() + opts.timeoutMs;
  try {
    await producer.startup();
    await lite(opts, producer, result, deadline);
    await priority(opts, producer, result, deadline);
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    await Promise.allSettled([ producer.shutdown() ]);
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  // grpc-js keeps timers alive for a while after shutdown; the result is out, so leave now.
  process.exit(result.error ? 1 : 0);
}

main();
