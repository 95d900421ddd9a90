// Drive Sluice with the official Node.js client (rocketmq-client-nodejs), as an application would
// (tests/bench/client_bench.py):
//
//   node official_node.js '<json options>'
//
// options: endpoint, mode ("produce" | "consume"), topic, group, concurrency (sends in flight, or
// receive loops), batch (receive size), bodyBytes, warmupS, seconds, modulesDir (where npm installed
// the client: tests/e2e/node/node_modules). After warmupS it prints {"event":"start"}, after seconds
// more {"event":"end","messages":N,"errors":E,"seconds":S}, then stops by itself.
'use strict';

const path = require('path');

function emit(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

async function main() {
  const opts = JSON.parse(process.argv[2]);
  const { Producer, SimpleConsumer } = require(path.join(opts.modulesDir, 'rocketmq-client-nodejs'));
  const state = { counting: false, stop: false, messages: 0, errors: 0 };
  const count = (messages, errors) => {
    if (state.counting) { state.messages += messages; state.errors += errors; }
  };
  let client;
  let loop;
  if (opts.mode === 'produce') {
    client = new Producer({ endpoints: opts.endpoint, requestTimeout: 10000 });
    await client.startup();
    const body = Buffer.alloc(opts.bodyBytes, 'x');
    loop = async () => {
      while (!state.stop) {
        try { await client.send({ topic: opts.topic, body }); count(1, 0); } catch (err) { count(0, 1); }
      }
    };
  } else {
    client = new SimpleConsumer({
      endpoints: opts.endpoint,
      consumerGroup: opts.group,
      subscriptions: new Map([[opts.topic, '*']]),
      awaitDuration: 2000,
      requestTimeout: 10000,
    });
    await client.startup();
    loop = async () => {
      while (!state.stop) {
        let received = [];
        try { received = await client.receive(opts.batch, 30000); } catch (err) { count(0, 1); continue; }
        for (const m of received) {
          try { await client.ack(m); count(1, 0); } catch (err) { count(0, 1); }
        }
      }
    };
  }
  const loops = Array.from({ length: opts.concurrency }, () => loop());
  await new Promise(r => setTimeout(r, opts.warmupS * 1000));
  state.counting = true;
  emit({ event: 'start' });
  const started = Date.now();
  await new Promise(r => setTimeout(r, opts.seconds * 1000));
  state.counting = false;
  emit({ event: 'end', messages: state.messages, errors: state.errors, seconds: (Date.now() - started) / 1000 });
  state.stop = true;
  await Promise.race([Promise.all(loops), new Promise(r => setTimeout(r, 35000))]);
  await client.shutdown();
  process.exit(0);
}

main().catch(err => { emit({ event: 'error', error: String(err && err.stack || err) }); process.exit(1); });
