// RabbitMQ's Node.js client (amqplib), unchanged, against Sluice's AMQP gateway: an empty body and a
// body of the largest size round-trip; one byte more is refused with 406 PRECONDITION_FAILED;
// connection.update-secret (how OAuth2 clients refresh a token) is answered and the connection
// goes on. amqplib offers 4 KiB frames, so the largest body crosses as 4,096 frames each way.
// Usage: node amqp_bodies.js amqp://USER:SECRET@127.0.0.1:PORT TAG MAX_BODY_BYTES -> one JSON line on stdout.
'use strict';
const crypto = require('crypto');
const amqp = require('amqplib');

const sha = (buf) => crypto.createHash('sha256').update(buf).digest('hex');

async function main(url, tag, maxBytes) {
  const conn = await amqp.connect(url);
  await conn.updateSecret(Buffer.from(decodeURIComponent(new URL(url).password)), 'token refreshed');

  const ch = await conn.createConfirmChannel();
  const queue = `node-bodies-${tag}`;
  await ch.assertQueue(queue, { exclusive: true });
  const big = crypto.randomBytes(maxBytes);
  ch.sendToQueue(queue, Buffer.alloc(0), { headers: { kind: 'signal' } });
  ch.sendToQueue(queue, big);
  await ch.waitForConfirms();

  const got = [];
  await new Promise((resolve) => {
    ch.consume(queue, (m) => {
      if (m === null) return;
      got.push({ size: m.content.length, sha: sha(m.content), kind: (m.properties.headers || {}).kind || null });
      ch.ack(m);
      if (got.length === 2) resolve();
    });
  });

  const over = await conn.createChannel();
  const refused = new Promise((resolve) => over.on('error', (e) => resolve({ code: e.code, text: e.message })));
  over.sendToQueue(queue, Buffer.alloc(maxBytes + 1));
  const refusal = await refused;

  await ch.close();
  await conn.close();
  return { got, sent: sha(big), refusal };
}

main(process.argv[2], process.argv[3], Number(process.argv[4])).then(
  (out) => {
    console.log(JSON.stringify(out));
    process.exit(0);
  },
  (err) => {
    console.error(err && err.stack ? err.stack : err);
    process.exit(1);
  },
);
