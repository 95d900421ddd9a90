// MQTT.js, unchanged, against Sluice's MQTT gateway over TCP and over WebSocket (subprotocol mqtt,
// as browsers use it): MQTT 5 and 3.1.1 subscribers with wildcards, QoS 0/1/2 publishes, a retained
// message, user properties.
// Usage: node mqtt_js.js mqtt://127.0.0.1:PORT ws://127.0.0.1:WSPORT/mqtt TOPIC_ROOT  -> one JSON line.
'use strict';
const mqtt = require('mqtt');

function connect(url, options) {
  return new Promise((resolve, reject) => {
    const client = mqtt.connect(url, { connectTimeout: 15000, reconnectPeriod: 0, ...options });
    client.once('connect', () => resolve(client));
    client.once('error', reject);
  });
}

function collect(client, n) {
  return new Promise((resolve) => {
    const got = [];
    client.on('message', (topic, payload, packet) => {
      got.push({ topic, payload: payload.toString(), qos: packet.qos, retain: packet.retain,
                 user: (packet.properties || {}).userProperties || null });
      if (got.length === n) resolve(got);
    });
  });
}

async function main(tcpUrl, wsUrl, root) {
  const ws = await connect(wsUrl, { protocolVersion: 5, clientId: `js-ws-${root}` });
  const tcp = await connect(tcpUrl, { protocolVersion: 4, clientId: `js-tcp-${root}` });
  await ws.subscribeAsync(`${root}/+/temp`, { qos: 2 });
  await tcp.subscribeAsync(`${root}/#`, { qos: 1 });
  const wsGot = collect(ws, 3);
  const tcpGot = collect(tcp, 4);
  const pub = await connect(tcpUrl, { protocolVersion: 5, clientId: `js-pub-${root}` });
  await pub.publishAsync(`${root}/kitchen/temp`, '21', { qos: 0 });
  await pub.publishAsync(`${root}/hall/temp`, '19', { qos: 1, properties: { userProperties: { unit: 'C' } } });
  await pub.publishAsync(`${root}/roof/temp`, '7', { qos: 2 });
  await pub.publishAsync(`${root}/door`, 'open', { qos: 1, retain: true });
  const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error('timed out')), 20000));
  const [fromWs, fromTcp] = await Promise.race([Promise.all([wsGot, tcpGot]), timeout]);
  const late = await connect(wsUrl, { protocolVersion: 4, clientId: `js-late-${root}` });
  const retained = collect(late, 1);
  await late.subscribeAsync(`${root}/door`, { qos: 1 });
  const [door] = await Promise.race([retained, timeout]);
  for (const c of [ws, tcp, pub, late]) await c.endAsync();
  process.stdout.write(JSON.stringify({ ws: fromWs, tcp: fromTcp, retained: door }) + '\n');
}

main(process.argv[2], process.argv[3], process.argv[4]).then(
  () => process.exit(0),
  (err) => { process.stderr.write(`${err.stack || err}\n`); process.exit(1); },
);
