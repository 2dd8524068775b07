// Unit tests of static/presence-client.js's own logic (reconnect order,
// re-sent status and watches, refused statuses), with a scripted WebSocket
// class in place of the network. The real thing, against a real server in a
// real browser, is demo.test.js.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const path = require("node:path");
const PresenceClient = require(path.join(__dirname, "..", "..", "static", "presence-client.js"));

/** Records what the client does with its sockets; the test plays the server. */
class ScriptedSocket {
  static all = [];
  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    ScriptedSocket.all.push(this);
  }
  send(data) { this.sent.push(JSON.parse(data)); }
  close() { this.readyState = 3; }
  // The server's side:
  open() {
    this.readyState = 1;
    if (this.onopen) this.onopen();
  }
  hello() {
    if (this.readyState === 0) this.open();
    this.readyState = 1;
    this.onmessage({ data: JSON.stringify({ type: "hello", user: "alice", device: "d1", heartbeat_ms: 15000, ttl_ms: 45000 }) });
  }
  frame(f) { this.onmessage({ data: JSON.stringify(f) }); }
  drop(code = 1006) { this.readyState = 3; this.onclose({ code, reason: "" }); }
}

/** Resolves once `cond()` holds (the client reconnects on a timer). */
async function until(cond, ms = 2000) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 5));
  }
}

function client(extra = {}) {
  ScriptedSocket.all = [];
  const events = { states: [], errors: [], snapshots: [], changes: [] };
  const c = new PresenceClient({
    url: ["ws://a/ws", "ws://b/ws"], user: "alice", device: "d1", WebSocket: ScriptedSocket, minBackoffMs: 5, maxBackoffMs: 20,
    onState: (s, info) => events.states.push([s, info]),
    onError: (e) => events.errors.push(e),
    onSnapshot: (r) => events.snapshots.push(r),
    onChange: (r) => events.changes.push(r),
    ...extra,
  });
  return { c, events };
}

test("status and watches chosen before the connection opens are sent after hello", () => {
  const { c } = client();
  c.watch(["bob"]);
  c.setStatus("busy", "in a meeting");
  c.connect();
  c.connect(); // a second call while opening does nothing
  assert.equal(ScriptedSocket.all.length, 1);
  const ws = ScriptedSocket.all[0];
  // The chosen status travels with the handshake as well.
  assert.equal(ws.url, "ws://a/ws?device=d1&user=alice&status=busy");
  assert.deepEqual(ws.sent, []);
  ws.hello();
  assert.deepEqual(ws.sent, [
    { type: "status", status: "busy", text: "in a meeting" },
    { type: "watch", users: ["bob"] },
  ]);
  c.close();
});

test("frames reach the callbacks; presence records lose their type", () => {
  const { c, events } = client();
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello();
  ws.frame({ type: "snapshot", presence: [{ user: "bob", status: "online", devices: 1, last_seen: null, text: null }] });
  ws.frame({ type: "presence", user: "bob", status: "away", devices: 1, last_seen: null, text: null });
  ws.frame({ type: "something_new" });
  assert.equal(events.snapshots[0][0].user, "bob");
  assert.deepEqual(events.changes, [{ user: "bob", status: "away", devices: 1, last_seen: null, text: null }]);
  assert.equal(events.errors.length, 0);
  c.close();
});

test("a refused status falls back to the previous one and is not re-sent", async () => {
  const { c, events } = client();
  c.connect();
  let ws = ScriptedSocket.all[0];
  ws.hello();
  c.setStatus("away");
  c.setStatus("invisible");
  ws.frame({ type: "error", code: "invalid_status", message: "invisible is not supported by this server yet" });
  assert.equal(events.errors[0].status, "invisible");
  assert.deepEqual(c.status, { status: "away", text: null });
  ws.drop();
  await until(() => ScriptedSocket.all.length === 2);
  ws = ScriptedSocket.all[1];
  ws.hello();
  assert.deepEqual(ws.sent[0], { type: "status", status: "away", text: null });
  c.close();
});

test("reconnects move through the endpoints with growing delays, and re-watch", async () => {
  const { c, events } = client();
  c.watch(["bob", "carol"]);
  c.connect();
  ScriptedSocket.all[0].hello();
  c.unwatch(["carol"]);
  ScriptedSocket.all[0].drop();
  await until(() => ScriptedSocket.all.length === 2);
  assert.match(ScriptedSocket.all[1].url, /^ws:\/\/b\/ws\?/);
  ScriptedSocket.all[1].drop();
  await until(() => ScriptedSocket.all.length === 3);
  assert.match(ScriptedSocket.all[2].url, /^ws:\/\/a\/ws\?/);
  const waits = events.states.filter(([s, i]) => s === "reconnecting" && i.willRetry).map(([, i]) => i.delayMs);
  assert.equal(waits.length, 2);
  assert.ok(waits[0] <= 5 && waits[1] <= 10, `delays ${waits}`);
  ScriptedSocket.all[2].hello();
  assert.deepEqual(ScriptedSocket.all[2].sent, [{ type: "watch", users: ["bob"] }]);
  assert.equal(c.attempt, 0, "a hello resets the backoff");
  c.close();
  assert.equal(c.state, "closed");
});

test("no reconnect after 4001 (the same device connected elsewhere)", () => {
  const { c, events } = client();
  c.connect();
  ScriptedSocket.all[0].hello();
  ScriptedSocket.all[0].drop(4001);
  assert.equal(c.state, "closed");
  assert.equal(events.states.at(-1)[1].willRetry, false);
  assert.equal(c._timer, null, "no reconnect scheduled");
  assert.equal(ScriptedSocket.all.length, 1);
});

test("a token goes as the first frame, never into the URL", async () => {
  const { c } = client({ user: undefined, token: "eyJ.tok.en" });
  c.connect();
  const ws = ScriptedSocket.all[0];
  assert.ok(!ws.url.includes("eyJ"), `token in the URL: ${ws.url}`);
  assert.ok(!ws.url.includes("user="), ws.url);
  ws.open();
  await until(() => ws.sent.length === 1);
  assert.deepEqual(ws.sent[0], { type: "auth", token: "eyJ.tok.en" });
  ws.frame({ type: "hello", user: "auth0|alice", device: "d1", heartbeat_ms: 15000, ttl_ms: 45000 });
  assert.equal(c.user, "auth0|alice");
  c.close();
});

test("auth_expiring asks refreshToken for a fresh token and sends it", async () => {
  let n = 0;
  const warned = [];
  const { c } = client({
    user: undefined, token: "t0", refreshToken: async () => `t${++n}`, onAuthExpiring: (f) => warned.push(f.in_ms),
  });
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello();
  await until(() => ws.sent.length === 1);
  ws.frame({ type: "auth_expiring", in_ms: 60000 });
  await until(() => ws.sent.length === 2);
  assert.deepEqual(ws.sent[1], { type: "auth", token: "t1" });
  assert.deepEqual(warned, [60000]);
  // Closed for an expired token anyway: the reconnect brings a fresh one.
  ws.drop(4401);
  await until(() => ScriptedSocket.all.length === 2);
  ScriptedSocket.all[1].open();
  await until(() => ScriptedSocket.all[1].sent.length === 1);
  assert.deepEqual(ScriptedSocket.all[1].sent[0], { type: "auth", token: "t2" });
  c.close();
});
