// RabbitMQ's Node.js client (amqplib), unchanged, against Sluice's AMQP gateway: work queue with
// confirms, prefetch and acks; a topic exchange; a passive declare of a missing queue (404).
// Usage: node amqp_tutorials.js amqp://guest:guest@127.0.0.1:PORT TAG   -> one JSON line on stdout.
'use strict';
const amqp = require('amqplib');

async function main(url, tag) {
  const conn = await amqp.connect(url);
  const ch = await conn.createConfirmChannel();
  const queue = `node-tasks-${tag}`;
  await ch.assertQueue(queue, { durable: true });
  for (let i = 0; i < 5; i++) {
    ch.sendToQueue(queue, Buffer.from(`task ${i}`), { persistent: true, headers: { n: i } });
  }
  await ch.waitForConfirms();

  const exchange = `node-topic-${tag}`;
  await ch.assertExchange(exchange, 'topic', { durable: false });
  const { queue: kern } = await ch.assertQueue('', { exclusive: true });
  await ch.bindQueue(kern, exchange, 'kern.*');
  ch.publish(exchange, 'kern.critical', Buffer.from('kern.critical'));
  ch.publish(exchange, 'app.info', Buffer.from('app.info'));
  await ch.waitForConfirms();

  const worker = await conn.createChannel();
  await worker.prefetch(2);
  const tasks = [];
  await new Promise((resolve) => {
    worker.consume(queue, (m) => {
      if (m === null) return; // the server cancelled the consumer (the queue is deleted at the end)
      tasks.push({ body: m.content.toString(), n: m.properties.headers.n, redelivered: m.fields.redelivered });
      worker.ack(m);
      if (tasks.length === 5) resolve();
    });
  });
  const topic = [];
  for (;;) {
    const m = await worker.get(kern, { noAck: true });
    if (!m) break;
    topic.push(m.content.toString());
  }

  let missing = null;
  const probe = await conn.createChannel();
  probe.on('error', () => {});
  try {
    await probe.checkQueue(`node-missing-${tag}`);
  } catch (e) {
    missing = e.code;
  }
  await ch.deleteQueue(queue);
  await conn.close();
  return { tasks, topic, missing };
}

main(process.argv[2], process.argv[3]).then(
  (out) => console.log(JSON.stringify(out)),
  (err) => { console.error(err && err.stack ? err.stack : err); process.exit(1); },
);
