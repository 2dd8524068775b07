// One WebSocket device for deploy/image/test.sh: connects to the URL in
// argv[2] and prints one line per event: `open`, `hello` when the server's
// hello arrives, and `close <code>` (then exits 0) or `error <message>`
// (then exits 1). Uses the `ws` package of clients/js (`npm ci` there).
'use strict';
const path = require('path');
const { createRequire } = require('module');

const fromClient = createRequire(path.join(__dirname, '..', '..', 'clients', 'js', 'package.json'));
let WebSocket;
try {
  WebSocket = fromClient('ws');
} catch (e) {
  console.log(`error the ws package is missing: run npm ci in clients/js (${e.message})`);
  process.exit(1);
}

const ws = new WebSocket(process.argv[2]);
ws.on('open', () => console.log('open'));
ws.on('message', (data) => {
  let frame;
  try {
    frame = JSON.parse(data);
  } catch {
    return;
  }
  if (frame.type === 'hello') console.log('hello');
});
ws.on('close', (code) => {
  console.log(`close ${code}`);
  process.exit(0);
});
ws.on('error', (e) => {
  console.log(`error ${e.message}`);
  process.exit(1);
});
