// The official RocketMQ Node.js client's LitePushConsumer at the edges of lite topics, driven by
// tests/e2e/test_node_client.py:
//
//   node lite_limits.js '<json options>'
//
// options: mode, endpoints, liteTopic (a LITE bind topic), liteGroup, timeoutMs; per mode:
//
// - "quota": the bind topic holds few lite topics per broker (--max-lite-topics). The consumer waits
//   for the server's settings (its subscription quota and name size), subscribes to lite topics
//   q0..q7 one by one and a producer sends to new lite topics n0..n7; each outcome is recorded
//   ({name, ok, code, exception}): beyond the bind topic's quota the server refuses with
//   LITE_TOPIC_QUOTA_EXCEEDED (42901).
// - "expiry": the bind topic expires lite topics after 4 s without a message. The consumer subscribes
//   to "short-lived", prints {"stage": "ready", "clientId": ...} and waits for a line on stdin (the
//   test waits for the server to remove the lite topic and notify the client), records its lite
//   topic set, then subscribes to "next" and receives a message there.
// - "resync": the consumer subscribes to "keep" and receives "before"; the script prints
//   {"stage": "ready", "clientId": ...} and waits for a line on stdin, meanwhile the test restarts the
//   proxy and drops the client's subscriptions on the server; then it sends "after" to "keep" and
//   waits for it: only the consumer's own COMPLETE_ADD resync (every 30 s) can bring it.
//
// The last stdout line is the result as JSON: {..., "error": null | "..."}.
'use strict';

const readline = require('readline');
const { ConsumeResult, LitePushConsumerImpl, Producer } = require('rocketmq-client-nodejs');

const SETTINGS_DEFAULT_QUOTA = 100; // the client's quota until the server's settings arrive

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

function newConsumer(opts, received) {
  return new LitePushConsumerImpl({
    endpoints: opts.endpoints,
    consumerGroup: opts.liteGroup,
    bindTopic: opts.liteTopic,
    requestTimeout: 3000,
    longPollingTimeout: 5000,
    messageListener: {
      consume(m) {
        received.push({ liteTopic: m.liteTopic ?? null, body: m.body.toString('utf8'), at: Date.now() });
        return ConsumeResult.SUCCESS;
      },
    },
  });
}

function outcome(name, err) {
  if (!err) {
    return { name, ok: true, code: null, exception: null };
  }
  return { name, ok: false, code: err.code ?? null, exception: err.name ?? String(err) };
}

async function quota(opts, consumer, result, deadline) {
  // The client checks subscriptions against the quota the server's settings announce.
  const manager = consumer.liteSubscriptionManager;
  await until(() => manager.liteSubscriptionQuota !== SETTINGS_DEFAULT_QUOTA, deadline, 'the server settings');
  result.settings = { liteSubscriptionQuota: manager.liteSubscriptionQuota, maxLiteTopicSize: manager.maxLiteTopicSize };
  for (let i = 0; i < 8; i++) {
    const name = `q${i}`;
    try {
      await consumer.subscribeLite(name);
      result.subscribed.push(outcome(name, null));
    } catch (err) {
      result.subscribed.push(outcome(name, err));
    }
  }
  result.liteTopicSet = [ ...consumer.getLiteTopicSet() ].sort();
  const producer = new Producer({ endpoints: opts.endpoints, requestTimeout: 3000, maxAttempts: 1 });
  await producer.startup();
  try {
    for (let i = 0; i < 8; i++) {
      const name = `n${i}`;
      try {
        await producer.send({ topic: opts.liteTopic, liteTopic: name, body: Buffer.from(name) });
        result.sent.push(outcome(name, null));
      } catch (err) {
        result.sent.push(outcome(name, err));
      }
    }
  } finally {
    await producer.shutdown();
  }
}

async function expiry(opts, consumer, result, deadline) {
  await consumer.subscribeLite('short-lived');
  result.liteTopicSet = [ ...consumer.getLiteTopicSet() ].sort();
  process.stdout.write(`${JSON.stringify({ stage: 'ready', clientId: consumer.clientId })}\n`);
  await nextLine(); // the server removed the expired lite topic and sent its notification
  result.liteTopicSetAfter = [ ...consumer.getLiteTopicSet() ].sort();
  // The consumer still works: a new subscription receives.
  const producer = new Producer({ endpoints: opts.endpoints, requestTimeout: 3000 });
  await producer.startup();
  try {
    await consumer.subscribeLite('next');
    await producer.send({ topic: opts.liteTopic, liteTopic: 'next', body: Buffer.from('next-1') });
    await until(() => result.received.some(r => r.body === 'next-1'), deadline, 'next-1');
  } finally {
    await producer.shutdown();
  }
}

function nextLine() {
  const rl = readline.createInterface({ input: process.stdin });
  return new Promise(resolve => rl.once('line', line => {
    rl.close();
    resolve(line);
  }));
}

async function sendUntilStored(producer, message, deadline) {
  // The producer's channels reconnect to the restarted proxy on their own; retry until one send lands.
  for (;;) {
    try {
      return await producer.send(message);
    } catch (err) {
      if (Date.now() > deadline) {
        throw err;
      }
      await sleep(500);
    }
  }
}

async function resync(opts, consumer, result, deadline) {
  const producer = new Producer({ endpoints: opts.endpoints, requestTimeout: 3000 });
  await producer.startup();
  try {
    await consumer.subscribeLite('keep');
    await producer.send({ topic: opts.liteTopic, liteTopic: 'keep', body: Buffer.from('before') });
    await until(() => result.received.some(r => r.body === 'before'), deadline, 'before');
    process.stdout.write(`${JSON.stringify({ stage: 'ready', clientId: consumer.clientId })}\n`);
    await nextLine(); // the test restarted the proxy and dropped this client's subscriptions
    result.sentAfterAt = Date.now();
    await sendUntilStored(producer, { topic: opts.liteTopic, liteTopic: 'keep', body: Buffer.from('after') }, deadline);
    await until(() => result.received.some(r => r.body === 'after'), deadline, 'after (the COMPLETE_ADD resync)');
    result.liteTopicSet = [ ...consumer.getLiteTopicSet() ].sort();
  } finally {
    await producer.shutdown();
  }
}

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const result = { mode: opts.mode, subscribed: [], sent: [], received: [], error: null };
  const consumer = newConsumer(opts, result.received);
  const deadline = Date.now() + opts.timeoutMs;
  try {
    await consumer.startup();
    if (opts.mode === 'quota') {
      await quota(opts, consumer, result, deadline);
    } else if (opts.mode === 'expiry') {
      await expiry(opts, consumer, result, deadline);
    } else if (opts.mode === 'resync') {
      await resync(opts, consumer, result, deadline);
    } else {
      throw new Error(`unknown mode ${opts.mode}`);
    }
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    await Promise.allSettled([ consumer.shutdown() ]);
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
  // grpc-js keeps timers alive for a while after shutdown; the result is out, so leave now.
  process.exit(result.error ? 1 : 0);
}

main();
