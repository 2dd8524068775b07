// Unit tests of presence-client.js's own logic (reconnect order,
// re-sent status and watches, refused statuses), with a scripted WebSocket
// class in place of the network. The real thing: package.test.js (the packed
// package against a real server in Node) and tests/browser/demo.test.js (the
// demo page in a real browser).
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const path = require("node:path");
const PresenceClient = require(path.join(__dirname, "..", "presence-client.js"));

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
  hello(self = null) {
    if (this.readyState === 0) this.open();
    this.readyState = 1;
    this.onmessage({ data: JSON.stringify({ type: "hello", user: "alice", device: "d1", heartbeat_ms: 15000, ttl_ms: 45000, self }) });
  }
  frame(f) { this.onmessage({ data: JSON.stringify(f) }); }
  drop(code = 1006, reason = "") { this.readyState = 3; this.onclose({ code, reason }); }
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
  const events = { states: [], errors: [], snapshots: [], changes: [], selves: [] };
  const c = new PresenceClient({
    url: ["ws://a/ws", "ws://b/ws"], user: "alice", device: "d1", WebSocket: ScriptedSocket, minBackoffMs: 5, maxBackoffMs: 20,
    onState: (s, info) => events.states.push([s, info]),
    onError: (e) => events.errors.push(e),
    onSnapshot: (r) => events.snapshots.push(r),
    onChange: (r) => events.changes.push(r),
    onSelf: (r) => events.selves.push(r),
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

test("setStatus takes {text, until}; the kind rides the URL; an ended status is not re-sent", async () => {
  const { c } = client({ kind: "mobile" });
  const ends = Date.now() + 150;
  c.setStatus("busy", { text: "call", until: new Date(ends) });
  c.connect();
  let ws = ScriptedSocket.all[0];
  assert.equal(ws.url, "ws://a/ws?device=d1&user=alice&status=busy&kind=mobile");
  ws.hello();
  assert.deepEqual(ws.sent[0], { type: "status", status: "busy", text: "call", until: ends });
  // The old (text) form still works and clears until.
  c.setStatus("away", "lunch");
  assert.deepEqual(ws.sent[1], { type: "status", status: "away", text: "lunch" });
  c.setStatus("busy", { until: ends });
  // Past its end the server has reset it: a reconnect sends no status.
  await until(() => Date.now() > ends);
  ws.drop();
  await until(() => ScriptedSocket.all.length === 2);
  ws = ScriptedSocket.all[1];
  assert.ok(!ws.url.includes("status="), ws.url);
  ws.hello();
  assert.equal(ws.sent.filter((f) => f.type === "status").length, 0);
  assert.equal(c.status, null);
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

test("a 1013 with retry_after_ms waits at least that long, and spreads the clients out", async () => {
  const waits = [];
  for (let i = 0; i < 20; i++) {
    const { c, events } = client();
    c.connect();
    ScriptedSocket.all[0].hello();
    ScriptedSocket.all[0].drop(1013, "server overloaded, reconnect; retry_after_ms=2000");
    const [, info] = events.states.find(([s]) => s === "reconnecting");
    assert.equal(info.willRetry, true);
    assert.ok(info.delayMs >= 2000 && info.delayMs <= 4000, `delay ${info.delayMs}`);
    waits.push(info.delayMs);
    c.close();
  }
  assert.ok(new Set(waits).size > 10, `not spread: ${waits}`);
  // Without a hint (or for another code) the delay is full jitter under the bound.
  const { c, events } = client({ minBackoffMs: 1000, maxBackoffMs: 1000 });
  c.connect();
  ScriptedSocket.all[0].hello();
  ScriptedSocket.all[0].drop(1011, "retry_after_ms=9000");
  const [, info] = events.states.find(([s]) => s === "reconnecting");
  assert.ok(info.delayMs >= 0 && info.delayMs <= 1000, `delay ${info.delayMs}`);
  c.close();
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

test("rooms: joined after hello and again after each reconnect, except refused ones; unavailable retries", async () => {
  const { c, events } = client();
  const doc = c.join("doc:1", { state: { page: 1 } });
  const full = c.join("full:1");
  const busy = c.join("busy:1");
  assert.equal(c.rooms.size, 3);
  c.connect();
  let ws = ScriptedSocket.all[0];
  ws.hello();
  assert.deepEqual(ws.sent.map((f) => f.type === "join" && f.room), ["doc:1", "full:1", "busy:1"]);
  ws.frame({ type: "room", room: "doc:1", users: 1, devices: 1, members: [{ user: "alice", devices: [{ device: "d1", state: { page: 1 }, joined_at: 1 }] }] });
  ws.frame({ type: "error", code: "room_full", message: "full", room: "full:1" });
  ws.frame({ type: "error", code: "unavailable", message: "redis", room: "busy:1" });
  assert.equal(doc.joined, true);
  assert.equal(full.joined, false);
  assert.equal(full.error.code, "room_full");
  assert.deepEqual(events.errors.map((e) => [e.code, e.room]), [["room_full", "full:1"], ["unavailable", "busy:1"]]);
  assert.deepEqual([...c.rooms.keys()], ["doc:1", "busy:1"]);
  await until(() => ws.sent.filter((f) => f.room === "busy:1").length === 2); // retried after a backoff
  doc.update({ page: 2 });
  assert.deepEqual(doc.members.get("alice")[0].state, { page: 2 }, "own entry shows the last state set");
  ws.drop();
  assert.equal(doc.joined, false);
  await until(() => ScriptedSocket.all.length === 2);
  ws = ScriptedSocket.all[1];
  ws.hello();
  assert.deepEqual(ws.sent, [
    { type: "join", batch: true, room: "doc:1", state: { page: 2 } },
    { type: "join", batch: true, room: "busy:1", state: {} },
  ]);
  // A fresh token without busy:1: the server made the device leave it.
  ws.frame({ type: "room", room: "busy:1", users: 1, devices: 1, members: [] });
  assert.equal(busy.joined, true);
  ws.frame({ type: "error", code: "forbidden", message: "the token's rooms claim does not include \"busy:1\"", room: "busy:1" });
  assert.equal(busy.joined, false);
  assert.equal(c.rooms.has("busy:1"), false, "out for good: not joined again on reconnect");
  doc.leave();
  assert.deepEqual(ws.sent.at(-1), { type: "leave", room: "doc:1" });
  assert.equal(c.rooms.has("doc:1"), false);
  c.close();
});

test("rooms: typing lists others by user, sorted, for 5 s at most, and drops a user's last leave", () => {
  const { c } = client();
  const r = c.join("chat:1");
  const seen = [];
  r.onTyping = (u) => seen.push(u);
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello();
  ws.frame({ type: "room", room: "chat:1", users: 3, devices: 4, members: [] });
  const sig = (user, device, typing) => ws.frame({ type: "signal", room: "chat:1", user, device, data: { typing } });
  sig("carol", "a", true);
  sig("bob", "a", true);
  sig("bob", "b", true);
  sig("alice", "other", true); // ourselves, on another device
  ws.frame({ type: "room_leave", room: "chat:1", user: "carol", device: "a", last: true });
  sig("bob", "b", false);
  assert.deepEqual(seen, [["carol"], ["bob", "carol"], ["bob"], []]);
  r.typing();
  r.typing();
  r.stopTyping();
  r.stopTyping();
  assert.deepEqual(ws.sent.filter((f) => f.type === "signal").map((f) => f.data), [{ typing: true }, { typing: false }]);
  c.close();
});

test("rooms: update() on every move sends the latest at most every roomStateIntervalMs; room_updates reach onUpdate and onUpdates", async () => {
  const { c } = client({ roomStateIntervalMs: 40 });
  const r = c.join("doc:1", { state: { x: 0 } });
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello();
  assert.equal(ws.sent.find((f) => f.type === "join").batch, true, "joins ask for batches");
  ws.frame({ type: "room", room: "doc:1", users: 2, devices: 2, members: [
    { user: "alice", devices: [{ device: "d1", state: { x: 0 }, joined_at: 1 }] },
    { user: "bob", devices: [{ device: "b", state: { x: 0 }, joined_at: 1 }] },
  ] });
  for (let x = 1; x <= 50; x++) r.update({ x });
  const sent = () => ws.sent.filter((f) => f.type === "room_state").map((f) => f.state.x);
  assert.deepEqual(sent(), [1], "the first at once, the rest wait");
  await until(() => sent().length === 2);
  assert.deepEqual(sent(), [1, 50], "then only the latest");
  const one = [];
  const batches = [];
  r.onUpdate = (e) => one.push(e);
  r.onUpdates = (u) => batches.push(u);
  ws.frame({ type: "room_updates", room: "doc:1", updates: [{ user: "bob", device: "b", state: { x: 9 } }] });
  ws.frame({ type: "room_update", room: "doc:1", user: "bob", device: "b", state: { x: 10 } });
  assert.deepEqual(one.map((e) => e.state.x), [9, 10]);
  assert.deepEqual(batches.map((b) => b.map((e) => e.state.x)), [[9], [10]]);
  assert.deepEqual(r.members.get("bob")[0].state, { x: 10 });
  r.update({ x: 51 });
  r.leave();
  await new Promise((res) => setTimeout(res, 60));
  assert.deepEqual(sent(), [1, 50], "nothing after the leave");
  c.close();
});

// ---------------------------------------------------------------------------
// Rooms the app's backend controls: room tokens (getToken, room_token), and
// the errors that end a room or make the client join it again.

/** Connects `c` and plays the server's hello; the socket. */
function connected(c) {
  c.connect();
  const ws = ScriptedSocket.all.at(-1);
  ws.hello();
  return ws;
}
/** The frames of `type` (default: joins) sent on `ws`. */
const sentOf = (ws, type = "join") => ws.sent.filter((f) => f.type === type);
/** A room frame answering a join. */
const roomFrame = (room) => ({ type: "room", room, users: 1, devices: 1, members: [{ user: "alice", devices: [{ device: "d1", state: {}, joined_at: 1 }] }] });

/** A getToken whose calls the test answers: `calls` lists [room, resolve, reject]. */
function tokenService() {
  const calls = [];
  const getToken = (room) => new Promise((resolve, reject) => calls.push({ room, resolve, reject }));
  return { calls, getToken };
}

test("room tokens: getToken for a first join given none; a token given to join() goes as is; false: no token", async () => {
  const svc = tokenService();
  const { c, events } = client({ getToken: svc.getToken });
  const doc = c.join("doc:1", { state: { page: 1 } });
  const given = c.join("doc:2", { token: "given-2" });
  const lobby = c.join("lobby", { token: false });
  c.connect();
  assert.equal(svc.calls.length, 0, "not asked before the connection is open");
  const ws = ScriptedSocket.all[0];
  ws.hello();
  await until(() => svc.calls.length === 2);
  // The rejoin after a connect asks for every room with a token, the given one too;
  // a room that takes none is never asked for.
  assert.deepEqual(svc.calls.map((x) => x.room), ["doc:1", "doc:2"]);
  assert.deepEqual(sentOf(ws), [{ type: "join", batch: true, room: "lobby", state: {} }], "no join before its token");
  assert.equal(doc.joined, false);
  svc.calls[1].resolve("fresh-2");
  svc.calls[0].resolve("tok-1");
  await until(() => sentOf(ws).length === 3);
  assert.deepEqual(sentOf(ws).slice(1), [
    { type: "join", batch: true, room: "doc:2", state: {}, token: "fresh-2" },
    { type: "join", batch: true, room: "doc:1", state: { page: 1 }, token: "tok-1" },
  ]);
  ws.frame(roomFrame("doc:1"));
  assert.equal(doc.joined, true);
  // Joined while open: a token given to join() goes as is, getToken not asked.
  c.join("doc:3", { token: "given-3" });
  assert.deepEqual(sentOf(ws).at(-1), { type: "join", batch: true, room: "doc:3", state: {}, token: "given-3" });
  // Joined while open without one: getToken is asked; false means the room takes none.
  c.getToken = async (room) => (room === "open:1" ? false : "never");
  c.join("open:1");
  await until(() => sentOf(ws).length === 5);
  assert.deepEqual(sentOf(ws).at(-1), { type: "join", batch: true, room: "open:1", state: {} });
  // A join again (a new state) sends the token it has, without asking.
  c.getToken = () => { throw new Error("not asked for a join again"); };
  doc.update({ page: 2 });
  c.join("doc:1", { state: { page: 3 } });
  assert.deepEqual(sentOf(ws).at(-1), { type: "join", batch: true, room: "doc:1", state: { page: 3 }, token: "tok-1" });
  assert.equal(events.errors.length, 0, JSON.stringify(events.errors));
  assert.equal(given.error, null);
  assert.equal(lobby.joined, false);
  assert.throws(() => c.join("doc:9", { token: 42 }), TypeError);
  c.close();
});

test("room tokens: room_token_expiring asks getToken and sends room_token; a failure there leaves the room in", async () => {
  let n = 0;
  let fail = false;
  const asked = [];
  const { c, events } = client({
    getToken: async (room) => {
      asked.push(room);
      if (fail) throw new Error("backend down");
      return `t${++n}`;
    },
  });
  const doc = c.join("doc:1");
  const roomErrors = [];
  doc.onError = (e) => roomErrors.push(e);
  const ws = connected(c);
  await until(() => sentOf(ws).length === 1);
  assert.equal(sentOf(ws)[0].token, "t1");
  ws.frame(roomFrame("doc:1"));
  ws.frame({ type: "room_token_expiring", room: "doc:1", expires_at: Date.now() + 30000 });
  ws.frame({ type: "room_token_expiring", room: "doc:unknown", expires_at: Date.now() + 30000 });
  await until(() => sentOf(ws, "room_token").length === 1);
  assert.deepEqual(sentOf(ws, "room_token"), [{ type: "room_token", room: "doc:1", token: "t2" }]);
  assert.deepEqual(asked, ["doc:1", "doc:1"], "not asked for a room the client is not in");
  // getToken fails: the client says so, naming the room; the room is still in
  // until the token expires.
  fail = true;
  ws.frame({ type: "room_token_expiring", room: "doc:1", expires_at: Date.now() + 30000 });
  await until(() => events.errors.length === 1);
  assert.equal(events.errors[0].code, "client");
  assert.equal(events.errors[0].room, "doc:1");
  assert.match(events.errors[0].message, /getToken failed for room doc:1: backend down/);
  assert.deepEqual(roomErrors, events.errors, "room.onError gets it too");
  assert.equal(doc.joined, true);
  assert.equal(c.rooms.get("doc:1"), doc);
  assert.equal(sentOf(ws, "room_token").length, 1);
  c.close();
});

test("room tokens: every rejoin after a reconnect carries a fresh token", async () => {
  let n = 0;
  const { c } = client({ getToken: (room) => `${room}#${++n}` }); // a plain value, no promise
  c.join("doc:1");
  c.join("doc:2", { token: "given" });
  c.connect();
  for (let i = 0; i < 3; i++) {
    const ws = ScriptedSocket.all[i];
    ws.hello();
    await until(() => sentOf(ws).length === 2);
    assert.deepEqual(sentOf(ws).map((f) => f.token).sort(), [`doc:1#${2 * i + 1}`, `doc:2#${2 * i + 2}`].sort());
    ws.drop();
    await until(() => ScriptedSocket.all.length === i + 2);
  }
  c.close();
});

test("room tokens: a token answered after the connection dropped is not sent; the rejoin asks again", async () => {
  const svc = tokenService();
  const { c } = client({ getToken: svc.getToken });
  c.join("doc:1");
  const first = connected(c);
  await until(() => svc.calls.length === 1);
  first.drop();
  svc.calls[0].resolve("late");
  await until(() => ScriptedSocket.all.length === 2);
  const second = ScriptedSocket.all[1];
  second.hello();
  await until(() => svc.calls.length === 2);
  svc.calls[1].resolve("fresh");
  await until(() => sentOf(second).length === 1);
  assert.deepEqual(sentOf(first), []);
  assert.deepEqual(sentOf(second), [{ type: "join", batch: true, room: "doc:1", state: {}, token: "fresh" }]);
  // Left while getToken is out: nothing sent when it answers.
  const r = c.join("doc:2");
  await until(() => svc.calls.length === 3);
  r.leave();
  svc.calls[2].resolve("too-late");
  await new Promise((res) => setTimeout(res, 20));
  assert.equal(sentOf(second).length, 1);
  assert.deepEqual(sentOf(second, "leave"), [], "nothing to leave: the join was never sent");
  c.close();
});

for (const [what, answer, why] of [
  ["throws", () => { throw new Error("HTTP 403 from /room-token"); }, /HTTP 403 from \/room-token/],
  ["rejects", () => Promise.reject(new Error("HTTP 403 from /room-token")), /HTTP 403 from \/room-token/],
  ["returns nothing", () => undefined, /it returned undefined, not a token/],
  ["returns an empty string", async () => "", /it returned an empty string, not a token/],
]) {
  test(`room tokens: a getToken that ${what}: no join, a client error naming the room, the room is over`, async () => {
    const { c, events } = client({ getToken: answer });
    const doc = c.join("doc:1");
    const roomErrors = [];
    doc.onError = (e) => roomErrors.push(e);
    const ws = connected(c);
    await until(() => events.errors.length === 1);
    const e = events.errors[0];
    assert.deepEqual([e.code, e.room, e.willRetry], ["client", "doc:1", false]);
    assert.match(e.message, /getToken failed for room doc:1: /);
    assert.match(e.message, why);
    assert.deepEqual(roomErrors, [e]);
    assert.deepEqual(sentOf(ws), [], "no join sent");
    assert.equal(doc.joined, false);
    assert.equal(doc.error, e);
    assert.equal(c.rooms.has("doc:1"), false);
    // Not tried again on reconnect.
    ws.drop();
    await until(() => ScriptedSocket.all.length === 2);
    ScriptedSocket.all[1].hello();
    await new Promise((res) => setTimeout(res, 20));
    assert.deepEqual(sentOf(ScriptedSocket.all[1]), []);
    assert.equal(events.errors.length, 1);
    c.close();
  });
}

test("room tokens: token_expired gets a fresh token and joins again, once", async () => {
  let n = 0;
  const { c, events } = client({ getToken: async () => `t${++n}` });
  const doc = c.join("doc:1");
  const syncs = [];
  doc.onSync = () => syncs.push(doc.joined);
  const ws = connected(c);
  await until(() => sentOf(ws).length === 1);
  ws.frame(roomFrame("doc:1"));
  ws.frame({ type: "signal", room: "doc:1", user: "bob", device: "b", data: { typing: true } });
  assert.deepEqual(doc.typingUsers, ["bob"]);
  // Expired: out (typers cleared), a fresh token, in again.
  ws.frame({ type: "error", code: "token_expired", message: "the room token expired", room: "doc:1" });
  assert.equal(doc.joined, false);
  assert.deepEqual(doc.typingUsers, []);
  assert.deepEqual([events.errors[0].code, events.errors[0].willRetry], ["token_expired", true]);
  await until(() => sentOf(ws).length === 2);
  assert.deepEqual(sentOf(ws)[1], { type: "join", batch: true, room: "doc:1", state: {}, token: "t2" });
  ws.frame(roomFrame("doc:1"));
  assert.equal(doc.joined, true);
  assert.equal(doc.error, null);
  // A later expiry is a new one: joined again once more.
  ws.frame({ type: "error", code: "token_expired", message: "the room token expired", room: "doc:1" });
  await until(() => sentOf(ws).length === 3);
  assert.equal(sentOf(ws)[2].token, "t3");
  // That rejoin refused (the backend's new token is no good): the room is over.
  ws.frame({ type: "error", code: "forbidden", message: "invalid room token", room: "doc:1" });
  assert.deepEqual(events.errors.map((e) => [e.code, e.willRetry]), [["token_expired", true], ["token_expired", true], ["forbidden", false]]);
  assert.equal(c.rooms.has("doc:1"), false);
  assert.deepEqual(syncs, [true, true]);
  c.close();
});

test("room tokens: token_expired again before the rejoin's room frame, or without getToken, ends the room", async () => {
  {
    const { c, events } = client({ getToken: async () => "t" });
    c.join("doc:1");
    const ws = connected(c);
    await until(() => sentOf(ws).length === 1);
    ws.frame(roomFrame("doc:1"));
    ws.frame({ type: "error", code: "token_expired", message: "expired", room: "doc:1" });
    await until(() => sentOf(ws).length === 2);
    ws.frame({ type: "error", code: "token_expired", message: "expired", room: "doc:1" });
    assert.deepEqual(events.errors.map((e) => e.willRetry), [true, false]);
    assert.equal(c.rooms.has("doc:1"), false);
    await new Promise((res) => setTimeout(res, 20));
    assert.equal(sentOf(ws).length, 2, "joined again once only");
    c.close();
  }
  {
    // A token given to join(), no getToken: nothing to join again with.
    const { c, events } = client();
    const doc = c.join("doc:1", { token: "given" });
    const ws = connected(c);
    assert.deepEqual(sentOf(ws), [{ type: "join", batch: true, room: "doc:1", state: {}, token: "given" }]);
    ws.frame(roomFrame("doc:1"));
    ws.frame({ type: "room_token_expiring", room: "doc:1", expires_at: Date.now() + 1000 }); // nothing to ask
    ws.frame({ type: "error", code: "token_expired", message: "expired", room: "doc:1" });
    assert.deepEqual(events.errors.map((e) => [e.code, e.willRetry]), [["token_expired", false]]);
    assert.equal(doc.joined, false);
    assert.equal(c.rooms.has("doc:1"), false);
    assert.equal(sentOf(ws).length, 1);
    assert.equal(sentOf(ws, "room_token").length, 0);
    // The app may join again with a fresh token: a new Room.
    const again = c.join("doc:1", { token: "fresh" });
    assert.notEqual(again, doc);
    assert.deepEqual(sentOf(ws).at(-1), { type: "join", batch: true, room: "doc:1", state: {}, token: "fresh" });
    c.close();
  }
});

test("rooms: removed and forbidden end the room for good, joined or not; others' removal reaches onLeave", async () => {
  const { c, events } = client();
  const joinedThenRemoved = c.join("chat:1");
  const refused = c.join("chat:2");
  const refusedAgain = c.join("chat:3");
  const roomErrors = [];
  for (const r of [joinedThenRemoved, refused, refusedAgain]) r.onError = (e) => roomErrors.push([r.id, e.code]);
  const leaves = [];
  joinedThenRemoved.onLeave = (e) => leaves.push(e);
  let ws = connected(c);
  ws.frame(roomFrame("chat:1"));
  ws.frame({ type: "room_join", room: "chat:1", user: "bob", device: "b", state: {}, first: true });
  ws.frame({ type: "room_leave", room: "chat:1", user: "bob", device: "b", last: true, removed: true });
  assert.deepEqual(leaves, [{ user: "bob", device: "b", last: true, removed: true }]);
  ws.frame({ type: "error", code: "forbidden", message: "\"alice\" is not on the room's member list", room: "chat:2" });
  ws.frame({ type: "error", code: "removed", message: "removed from \"chat:1\" by the app", room: "chat:1" });
  // A rejoin refused because the user was just removed is a removal too.
  ws.frame({ type: "error", code: "removed", message: "removed from \"chat:3\" by the app", room: "chat:3" });
  assert.deepEqual(roomErrors, [["chat:2", "forbidden"], ["chat:1", "removed"], ["chat:3", "removed"]]);
  assert.deepEqual(events.errors.map((e) => [e.room, e.code, e.willRetry]), [
    ["chat:2", "forbidden", false], ["chat:1", "removed", false], ["chat:3", "removed", false],
  ]);
  for (const r of [joinedThenRemoved, refused, refusedAgain]) assert.equal(r.joined, false, r.id);
  assert.equal(joinedThenRemoved.error.code, "removed");
  assert.equal(c.rooms.size, 0);
  // Nothing about them is sent any more, and a reconnect joins none of them.
  joinedThenRemoved.update({ x: 1 });
  joinedThenRemoved.signal({ x: 1 });
  joinedThenRemoved.leave();
  assert.equal(ws.sent.filter((f) => f.type !== "join").length, 0, JSON.stringify(ws.sent));
  ws.drop();
  await until(() => ScriptedSocket.all.length === 2);
  ws = ScriptedSocket.all[1];
  ws.hello();
  assert.deepEqual(sentOf(ws), []);
  c.close();
});

test("rooms: unavailable is tried again with backoff, maxJoinRetries times in a row, then the room is given up", async () => {
  const { c, events } = client({ maxJoinRetries: 2 });
  const r = c.join("chat:1");
  const ws = connected(c);
  const unavailable = () => ws.frame({ type: "error", code: "unavailable", message: "the app's backend did not answer", room: "chat:1" });
  // Answered in between: the count starts again.
  unavailable();
  await until(() => sentOf(ws).length === 2);
  ws.frame(roomFrame("chat:1"));
  ws.drop();
  await until(() => ScriptedSocket.all.length === 2);
  const ws2 = ScriptedSocket.all[1];
  ws2.hello();
  const unavailable2 = () => ws2.frame({ type: "error", code: "unavailable", message: "the app's backend did not answer", room: "chat:1" });
  for (let i = 1; i <= 2; i++) {
    unavailable2();
    assert.equal(r.joined, false);
    await until(() => sentOf(ws2).length === 1 + i);
  }
  unavailable2();
  assert.deepEqual(events.errors.map((e) => e.willRetry), [true, true, true, false]);
  assert.equal(r.error.code, "unavailable");
  assert.equal(c.rooms.has("chat:1"), false, "given up: dropped from client.rooms");
  await new Promise((res) => setTimeout(res, 60)); // well past the largest backoff (20 ms)
  assert.equal(sentOf(ws2).length, 3, "3 joins: the first and 2 retries");
  assert.equal(c.maxJoinRetries, 2);
  assert.equal(new PresenceClient({ url: "ws://a/ws", user: "u", device: "d", WebSocket: ScriptedSocket }).maxJoinRetries, 6);
  c.close();
});

// ---------------------------------------------------------------------------
// Rooms against a real node: a real redis-server (the repo's redis.conf,
// random port) and real presence-server nodes (target/debug/presence-server,
// built by `cargo build` first; PRESENCE_SERVER_BIN overrides it), with
// Node's own WebSocket (Node 20 needs --experimental-websocket: npm test
// passes it).

const { describe, before, after } = require("node:test");
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");

const ROOT = path.resolve(__dirname, "..", "..", "..");
const BIN = process.env.PRESENCE_SERVER_BIN || path.join(ROOT, "target", "debug", "presence-server");
const DEADLINE_MS = 20_000;

/** Resolves once `cond()` holds; rejects naming `what` after `ms`. */
async function waitFor(what, cond, ms = DEADLINE_MS) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function pings(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, "127.0.0.1");
    let buf = "";
    sock.setTimeout(500, () => { sock.destroy(); resolve(false); });
    sock.on("connect", () => sock.write("PING\r\n"));
    sock.on("data", (d) => { buf += d; if (buf.includes("\r\n")) { sock.destroy(); resolve(buf.startsWith("+PONG")); } });
    sock.on("error", () => resolve(false));
  });
}

describe("rooms against a real node", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "presence-client-"));
  let redis = null;
  const nodes = [];
  const clients = [];

  before(async () => {
    if (!fs.existsSync(BIN)) throw new Error(`${BIN} is missing: run \`cargo build\` first (or set PRESENCE_SERVER_BIN)`);
    for (let i = 0; i < 5 && !redis; i++) {
      const port = await freePort();
      const child = spawn("redis-server", [
        path.join(ROOT, "redis.conf"), "--port", String(port), "--bind", "127.0.0.1",
        "--dir", tmp, "--logfile", path.join(tmp, "redis.log"), "--appendonly", "no",
      ], { stdio: "ignore" });
      let dead = false;
      child.once("exit", () => { dead = true; });
      child.once("error", () => { dead = true; });
      const deadline = Date.now() + DEADLINE_MS;
      while (!dead && Date.now() < deadline && !(await pings(port))) await new Promise((r) => setTimeout(r, 50));
      if (!dead) redis = { child, port };
    }
    if (!redis) throw new Error("redis-server did not start (apt-get install -y redis-server)");
  });

  after(() => {
    for (const c of clients) c.close();
    for (const p of [...nodes, redis]) if (p && p.child.exitCode === null) p.child.kill("SIGKILL");
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  /** Starts a node on the test's Redis; resolves with {child, ws, logs} once it listens. */
  async function startNode(id, extra = []) {
    const child = spawn(BIN, [
      "--listen", "127.0.0.1:0", "--redis-url", `redis://127.0.0.1:${redis.port}/0`, "--node-id", id,
      ...(extra.includes("--heartbeat-ms") ? [] : ["--heartbeat-ms", "1000"]), ...extra,
    ], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, RUST_LOG: "info" } });
    const n = { id, child, logs: [], ws: null };
    nodes.push(n);
    let pending = "";
    let exit = null;
    child.once("exit", (code, sig) => { exit = code ?? sig; });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d) => {
      pending += d;
      const lines = pending.split("\n");
      pending = lines.pop();
      for (const line of lines) {
        n.logs.push(line);
        const m = line.match(/listening on http:\/\/(\S+)/);
        if (m) n.ws = `ws://${m[1]}/ws`;
      }
    });
    await waitFor(`node ${id} to listen`, () => {
      if (exit !== null) throw new Error(`node ${id} exited (${exit}):\n${n.logs.join("\n")}`);
      return n.ws !== null;
    });
    return n;
  }

  /** A connected client on `urls`, recording its errors. */
  async function connect(user, device, urls) {
    const errors = [];
    const c = new PresenceClient({ url: urls, user, device, WebSocket: globalThis.WebSocket, minBackoffMs: 100, maxBackoffMs: 400, onError: (e) => errors.push(e) });
    c.errors = errors;
    clients.push(c);
    c.connect();
    await waitFor(`${user}/${device} to connect`, () => c.connected);
    return c;
  }

  /** Joins and waits for the room frame; records the room's events in `room.log`. */
  async function joinRoom(c, id, state) {
    const r = c.join(id, { state });
    r.log = { syncs: 0, joins: [], leaves: [], updates: [], signals: [], typing: [] };
    r.onSync = () => { r.log.syncs += 1; };
    r.onJoin = (e) => r.log.joins.push(e);
    r.onLeave = (e) => r.log.leaves.push(e);
    r.onUpdate = (e) => r.log.updates.push(e);
    r.onSignal = (e) => r.log.signals.push(e);
    r.onTyping = (users) => r.log.typing.push(users);
    await waitFor(`${c.user}/${c.device} to be in ${id}`, () => r.joined);
    return r;
  }

  /** A room's members as plain data: {user: {device: state}}. */
  const view = (r) => Object.fromEntries([...r.members].map(([u, ds]) => [u, Object.fromEntries(ds.map((d) => [d.device, d.state]))]));

  test("pause and resume: within the grace the others see bob idle and back, no offline; past it one offline and one leave", { timeout: 60_000 }, async () => {
    const n = await startNode("pause-1", ["--pause-grace-ms", "1500"]);
    const alice = await connect("pauser-watcher", "web", n.ws);
    const seen = [];
    alice.onChange = (r) => seen.push(r.idle ? "idle" : r.status);
    // bob connects once alice's watch is answered: his online is then a change.
    let answered = false;
    alice.onSnapshot = () => { answered = true; };
    alice.watch(["pauser"]);
    await waitFor("alice's watch to be answered", () => answered);
    const bob = await connect("pauser", "phone", n.ws);
    await waitFor("alice to see bob online", () => seen.includes("online"));
    const aliceRoom = await joinRoom(alice, "pause-room", {});
    const bobRoom = await joinRoom(bob, "pause-room", {});
    await waitFor("alice to see bob in the room", () => aliceRoom.members.has("pauser"));
    const states = [];
    bob.onState = (s, info) => states.push([s, info]);

    // A pause asked longer than the bound gets the bound; resumed within it.
    const granted = await bob.pause({ graceMs: 60_000 });
    assert.equal(granted, 1500);
    assert.deepEqual(states.at(-1), ["paused", { graceMs: 1500 }]);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(bob.state, "paused", "a paused client reconnected by itself");
    bob.resume();
    await waitFor("bob to be back", () => bob.connected && bobRoom.joined);
    await new Promise((r) => setTimeout(r, 2000)); // past the grace: nothing may follow
    assert.deepEqual(seen, ["online", "idle", "online"], "what alice saw of bob's pause");
    assert.deepEqual(aliceRoom.log.leaves, [], "alice saw bob leave the room");

    // Paused and not back: bob leaves once, after the grace.
    assert.equal(await bob.pause(), 1500);
    await waitFor("alice to see bob offline", () => seen.includes("offline"), 10_000);
    await waitFor("alice to see bob leave the room", () => aliceRoom.log.leaves.length === 1);
    assert.deepEqual(seen, ["online", "idle", "online", "idle", "offline"]);
  });

  test("autoPause: a hidden page pauses after its delay, a visible one resumes, and the others see it idle, then back", { timeout: 60_000 }, async () => {
    const n = await startNode("pause-auto", ["--pause-grace-ms", "5000"]);
    const alice = await connect("autopause-watcher", "web", n.ws);
    const seen = [];
    alice.onChange = (r) => seen.push(r.idle ? "idle" : r.status);
    let answered = false;
    alice.onSnapshot = () => { answered = true; };
    alice.watch(["autopauser"]);
    await waitFor("alice's watch to be answered", () => answered);
    const doc = new EventTarget();
    doc.hidden = false;
    const carol = new PresenceClient({ url: n.ws, user: "autopauser", device: "tab", WebSocket: globalThis.WebSocket, minBackoffMs: 100, maxBackoffMs: 400, autoPause: { delayMs: 200, document: doc } });
    clients.push(carol);
    carol.connect();
    await waitFor("alice to see carol online", () => seen.includes("online"));
    doc.hidden = true;
    doc.dispatchEvent(new Event("visibilitychange"));
    await waitFor("carol to pause", () => carol.state === "paused");
    doc.hidden = false;
    doc.dispatchEvent(new Event("visibilitychange"));
    await waitFor("carol to be back", () => carol.connected);
    await waitFor("alice to see carol back from idle", () => seen.length === 3);
    // Hidden briefly (under the delay): no pause at all.
    doc.hidden = true;
    doc.dispatchEvent(new Event("visibilitychange"));
    doc.hidden = false;
    doc.dispatchEvent(new Event("visibilitychange"));
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(carol.state, "open");
    // Idle while paused, back on the resume: never offline, nothing for the short hide.
    assert.deepEqual(seen, ["online", "idle", "online"], "what alice saw of carol's pause");
    // A pause of the app's own is not undone by the page coming back.
    await carol.pause();
    doc.dispatchEvent(new Event("visibilitychange"));
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(carol.state, "paused");
  });

  test("live cursors: update() on every move; the others get the latest, batched", { timeout: 60_000 }, async () => {
    const n = await startNode("cursors-1");
    const alice = await connect("cursor-alice", "web", n.ws);
    const bob = await connect("cursor-bob", "web", n.ws);
    const a = await joinRoom(alice, "doc:cursors", { x: 0 });
    const b = await joinRoom(bob, "doc:cursors", { x: 0 });
    const batches = [];
    b.onUpdates = (u) => batches.push(u);
    for (let x = 1; x <= 200; x++) {
      a.update({ x });
      await new Promise((r) => setTimeout(r, 2));
    }
    await waitFor("bob to see alice's last move", () => view(b)["cursor-alice"].web.x === 200);
    const xs = b.log.updates.map((e) => e.state.x);
    assert.deepEqual(xs, [...xs].sort((p, q) => p - q), "never an older state after a newer");
    assert.ok(batches.length < 100, `${batches.length} batches for 200 moves`);
    assert.deepEqual(alice.errors, [], "never refused");
    for (const c of [alice, bob]) c.close();
  });

  test("members stay current through joins, updates and leaves", { timeout: 60_000 }, async () => {
    const n = await startNode("rooms-1");
    const alice = await connect("alice", "web", n.ws);
    const bobPhone = await connect("bob", "phone", n.ws);
    const bobWeb = await connect("bob", "web", n.ws);
    const a = await joinRoom(alice, "doc:1", { page: 1 });
    assert.deepEqual(view(a), { alice: { web: { page: 1 } } });
    assert.equal(a.users, 1);
    assert.equal(alice.rooms.get("doc:1"), a);

    const bp = await joinRoom(bobPhone, "doc:1", { page: 2 });
    await waitFor("alice to see bob's phone", () => a.log.joins.length === 1);
    assert.deepEqual(a.log.joins[0], { user: "bob", device: "phone", state: { page: 2 }, first: true });
    assert.deepEqual(view(bp), { alice: { web: { page: 1 } }, bob: { phone: { page: 2 } } });
    await joinRoom(bobWeb, "doc:1", {});
    await waitFor("alice to see bob's web", () => a.log.joins.length === 2);
    assert.equal(a.log.joins[1].first, false);
    assert.deepEqual(view(a), { alice: { web: { page: 1 } }, bob: { phone: { page: 2 }, web: {} } });

    bp.update({ page: 3 });
    a.update({ page: 5 });
    await waitFor("alice to see bob's update", () => a.log.updates.length === 1);
    await waitFor("bob to see alice's update", () => bp.log.updates.length === 1);
    assert.deepEqual(view(a), { alice: { web: { page: 5 } }, bob: { phone: { page: 3 }, web: {} } });
    assert.deepEqual(view(bp), view(a), "both see the same room, each its own state included");

    bp.leave();
    assert.equal(bobPhone.rooms.has("doc:1"), false);
    await waitFor("alice to see bob's phone leave", () => a.log.leaves.length === 1);
    assert.deepEqual(a.log.leaves[0], { user: "bob", device: "phone", last: false });
    bobWeb.close(); // a clean close leaves at once
    await waitFor("alice to see bob leave", () => a.log.leaves.length === 2);
    assert.equal(a.log.leaves[1].last, true);
    assert.deepEqual(view(a), { alice: { web: { page: 5 } } });
    for (const c of [alice, bobPhone]) c.close();
  });

  test("after its node is killed the client is back in its rooms with its last state, quietly", { timeout: 60_000 }, async () => {
    const doomed = await startNode("rooms-doomed");
    const other = await startNode("rooms-other");
    const alice = await connect("alice", "laptop", [doomed.ws, other.ws]);
    const bob = await connect("bob", "tablet", other.ws);
    const a = await joinRoom(alice, "doc:2", { page: 1 });
    const b = await joinRoom(bob, "doc:2", {});
    a.update({ page: 7 });
    await waitFor("bob to see alice's page", () => view(b).alice?.laptop?.page === 7);

    doomed.child.kill("SIGKILL");
    await waitFor("alice to rejoin on the other node", () => a.log.syncs === 2 && a.joined && alice.url === other.ws);
    assert.deepEqual(view(a), { alice: { laptop: { page: 7 } }, bob: { tablet: {} } });
    // Past the old membership's deadline (TTL 3 s + 1 s): still no leave for bob.
    await new Promise((r) => setTimeout(r, 4500));
    assert.deepEqual(b.log.leaves, [], "bob saw alice leave");
    assert.deepEqual(b.log.joins, [], "bob saw alice join again");
    assert.equal(b.log.updates.length, 1, "the rejoin with an unchanged state is no update either");
    assert.deepEqual(view(b), { alice: { laptop: { page: 7 } }, bob: { tablet: {} } });
    for (const c of [alice, bob]) c.close();
  });

  test("typing: one entry for two devices, never yourself, cleared when the typer's device vanishes", { timeout: 60_000 }, async () => {
    const stays = await startNode("typing-stays", ["--heartbeat-ms", "300"]);
    const dies = await startNode("typing-dies", ["--heartbeat-ms", "300"]);
    const alice = await connect("alice", "web", stays.ws);
    const alicePhone = await connect("alice", "phone", stays.ws);
    const bobWeb = await connect("bob", "web", stays.ws);
    const bobPhone = await connect("bob", "phone", dies.ws);
    const a = await joinRoom(alice, "chat:1", {});
    const ap = await joinRoom(alicePhone, "chat:1", {});
    const bw = await joinRoom(bobWeb, "chat:1", {});
    const bp = await joinRoom(bobPhone, "chat:1", {});

    ap.typing(); // alice's other device: never listed for alice
    bw.typing();
    bw.typing(); // at most every 2 s: not sent again
    bp.typing();
    await waitFor("alice to see bob's two devices' signals", () => a.log.signals.filter((s) => s.user === "bob").length === 2);
    assert.deepEqual(a.log.typing, [["bob"]], "bob typing on two devices is one entry");
    assert.deepEqual(a.typingUsers, ["bob"]);
    assert.ok(ap.log.typing.every((users) => !users.includes("alice")), "alice listed herself");
    await waitFor("bob's web to see alice typing", () => bw.log.typing.length === 1);
    assert.deepEqual(bw.log.typing, [["alice"]]);

    bw.stopTyping();
    await waitFor("bob's web to say it stopped", () => a.log.typing.length === 2);
    assert.deepEqual(a.log.typing.at(-1), []);
    bw.typing(); // sent at once: stopTyping reset the 2 s clock
    await waitFor("bob typing again", () => a.log.typing.length === 3);
    const typedAt = Date.now();

    bobWeb.close();
    await waitFor("alice to see bob's web leave", () => a.log.leaves.length === 1);
    assert.deepEqual(a.typingUsers, ["bob"], "bob is still there, on his phone");
    // bob's phone vanishes: its node dies, its lease (TTL 900 ms) lapses.
    // (Killed first: closing the client first would be a clean close, a leave at once.)
    const died = new Promise((r) => dies.child.once("exit", r));
    dies.child.kill("SIGKILL");
    await died;
    const killedAt = Date.now();
    bobPhone.close();
    await waitFor("alice to see bob's phone lapse", () => a.log.leaves.length === 2, 10_000);
    assert.equal(a.log.leaves[1].last, true);
    // A lapse, not a clean close (that would be a leave at once).
    assert.ok(Date.now() - killedAt >= 200, `left ${Date.now() - killedAt} ms after the kill: too soon for a lapse`);
    assert.deepEqual(a.log.typing.at(-1), [], "bob's typing cleared with his leave");
    assert.ok(Date.now() - typedAt < 5000, `cleared by the leave, not by the 5 s timeout (after ${Date.now() - typedAt} ms)`);
    for (const c of [alice, alicePhone]) c.close();
  });

  const ADMIN_KEY = "admin-key-of-the-client-tests-0123456789";

  /** The admin API of node `n`: `method` on `p`, with a JSON body; the parsed answer. */
  async function admin(n, method, p, body) {
    const res = await fetch(n.ws.replace(/^ws/, "http").replace(/\/ws$/, "") + p, {
      method,
      headers: { authorization: `Bearer ${ADMIN_KEY}`, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.text();
    assert.equal(res.status, 200, `${method} ${p}: ${res.status} ${text}`);
    return JSON.parse(text);
  }

  /** Waits for `room`'s onError (it records into `room.errors`). */
  function recordErrors(r) {
    r.errors = [];
    r.onError = (e) => r.errors.push(e);
    return r;
  }

  test("members: a user off the list is refused for good; a removal ends every device's room at once", { timeout: 60_000 }, async () => {
    const n = await startNode("rooms-members", ["--admin-key", ADMIN_KEY, "--room-policy", "private:*=members"]);
    await admin(n, "PUT", "/api/rooms/private:1/members", { users: ["alice"] });
    const alice = await connect("alice", "web", n.ws);
    const bobWeb = await connect("bob", "web", n.ws);
    const bobPhone = await connect("bob", "phone", n.ws);
    const a = await joinRoom(alice, "private:1", {});

    // bob is not on the list: forbidden, the room over on the client.
    const refused = recordErrors(bobWeb.join("private:1"));
    await waitFor("bob's refusal", () => refused.errors.length === 1);
    assert.deepEqual([refused.errors[0].code, refused.errors[0].room, refused.errors[0].willRetry], ["forbidden", "private:1", false]);
    assert.match(refused.errors[0].message, /member list/);
    assert.deepEqual(bobWeb.errors, refused.errors, "client.onError gets it too");
    assert.equal(refused.joined, false);
    assert.equal(bobWeb.rooms.has("private:1"), false);

    // On the list, bob is in on both devices.
    await admin(n, "POST", "/api/rooms/private:1/members/bob");
    const bw = recordErrors(await joinRoom(bobWeb, "private:1", {}));
    const bp = recordErrors(await joinRoom(bobPhone, "private:1", {}));
    assert.notEqual(bw, refused, "a refused Room is not brought back: join() makes a new one");
    await waitFor("alice to see bob's two devices", () => a.log.joins.length === 2);

    // Removed: both devices out at once, told why; alice sees them leave, removed.
    const removedAt = Date.now();
    const answer = await admin(n, "DELETE", "/api/rooms/private:1/members/bob");
    assert.deepEqual([...answer.devices].sort(), ["phone", "web"]);
    await waitFor("both of bob's devices to be told", () => bw.errors.length === 1 && bp.errors.length === 1);
    await waitFor("alice to see bob leave", () => a.log.leaves.length === 2);
    assert.ok(Date.now() - removedAt < 1000, `removal took ${Date.now() - removedAt} ms`);
    for (const [c, r] of [[bobWeb, bw], [bobPhone, bp]]) {
      assert.deepEqual([r.errors[0].code, r.errors[0].room, r.errors[0].willRetry], ["removed", "private:1", false]);
      assert.equal(r.joined, false);
      assert.equal(c.rooms.has("private:1"), false);
    }
    assert.deepEqual(a.log.leaves.map((e) => [e.user, e.removed, e.last]).sort(), [["bob", true, false], ["bob", true, true]]);
    assert.deepEqual(view(a), { alice: { web: {} } });

    // Off the list now: a join of the app's own is refused.
    const again = recordErrors(bobWeb.join("private:1"));
    await waitFor("bob's refusal after the removal", () => again.errors.length === 1);
    assert.equal(again.errors[0].code, "forbidden");
    assert.equal(a.log.joins.length, 2, "alice saw bob join again");
    for (const c of [alice, bobWeb, bobPhone]) c.close();
  });

  test("a removal under another policy ends the room too; a join of the app's own follows the policy", { timeout: 60_000 }, async () => {
    const n = await startNode("rooms-removal-open", ["--admin-key", ADMIN_KEY]);
    const alice = await connect("alice", "web", n.ws);
    const bob = await connect("bob", "web", n.ws);
    const a = await joinRoom(alice, "general", {});
    const b = recordErrors(await joinRoom(bob, "general", { page: 1 }));
    await admin(n, "DELETE", "/api/rooms/general/members/bob");
    await waitFor("bob to be told", () => b.errors.length === 1);
    assert.deepEqual([b.errors[0].code, b.errors[0].willRetry], ["removed", false]);
    await waitFor("alice to see bob removed", () => a.log.leaves.length === 1);
    assert.deepEqual(a.log.leaves[0], { user: "bob", device: "web", last: true, removed: true });
    // Not on its own, not even after a reconnect (the open policy would let
    // it in: alice would see it).
    assert.equal(bob.rooms.size, 0);
    const before = bob.hello;
    bob._ws.close();
    await waitFor("bob to reconnect", () => bob.connected && bob.hello !== before);
    await joinRoom(alice, "sync:1", {});
    await joinRoom(bob, "sync:1", {}); // after any rejoin of general the hello would have sent
    await waitFor("alice to see bob in sync:1", () => alice.rooms.get("sync:1").log.joins.length === 1);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(a.log.joins.length, 1, "bob's client joined general again by itself");
    // The app may.
    await joinRoom(bob, "general", { page: 2 });
    await waitFor("alice to see bob back", () => a.log.joins.length === 2);
    assert.deepEqual(view(a), { alice: { web: {} }, bob: { web: { page: 2 } } });
    for (const c of [alice, bob]) c.close();
  });

  test("a refused join reaches onError with the room id and is not joined again", { timeout: 60_000 }, async () => {
    const n = await startNode("rooms-small", ["--max-room-devices", "1"]);
    const alice = await connect("alice", "web", n.ws);
    const bob = await connect("bob", "web", n.ws);
    await joinRoom(alice, "small:1", {});
    const r = bob.join("small:1", { state: { x: 1 } });
    await waitFor("bob's refusal", () => bob.errors.length === 1);
    assert.equal(bob.errors[0].code, "room_full");
    assert.equal(bob.errors[0].room, "small:1");
    assert.equal(r.joined, false);
    assert.equal(r.error.code, "room_full");
    assert.equal(bob.rooms.has("small:1"), false, "a refused room is not one of the client's rooms");
    for (const c of [alice, bob]) c.close();
  });
});

test("the user's own record goes to onSelf, never to onChange", () => {
  const { c, events } = client();
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello();
  c.setStatus("busy", "train");
  const mine = { user: "alice", status: "busy", devices: 1, last_seen: null, text: "train" };
  ws.frame({ type: "presence", ...mine });
  ws.frame({ type: "presence", user: "bob", status: "away", devices: 1, last_seen: null, text: null });
  assert.deepEqual(events.selves, [mine]);
  assert.deepEqual(events.changes.map((r) => r.user), ["bob"]);
  c.close();
});

test("hello's own record fills status and reaches onSelf, and is not sent back after a reconnect", async () => {
  const { c, events } = client();
  c.connect();
  let ws = ScriptedSocket.all[0];
  const mine = { user: "alice", status: "away", devices: 2, last_seen: null, text: "in a meeting", until: 1900000000000, kinds: ["web"] };
  ws.hello(mine);
  assert.deepEqual(c.status, { status: "away", text: "in a meeting", until: 1900000000000 });
  assert.deepEqual(events.selves, [mine]);
  assert.deepEqual(events.changes, []);
  assert.deepEqual(ws.sent, []); // the server's status, not a choice to send
  // Changed on another device (this one watches itself): status follows.
  const busy = { ...mine, status: "busy", text: null, until: null };
  ws.frame({ type: "presence", ...busy });
  assert.deepEqual(c.status, { status: "busy", text: null });
  ws.drop();
  await until(() => ScriptedSocket.all.length === 2);
  ws = ScriptedSocket.all[1];
  assert.equal(ws.url, "ws://b/ws?device=d1&user=alice"); // no ?status=: the server keeps its own
  ws.hello({ ...mine, status: "online", text: null, until: null });
  assert.deepEqual(ws.sent, []);
  assert.deepEqual(c.status, { status: "online", text: null });
  assert.equal(events.selves.length, 3);
  c.close();
});

test("a choice of the client's own wins over hello's record: re-sent, its answer reaches onSelf", async () => {
  const { c, events } = client();
  c.connect();
  let ws = ScriptedSocket.all[0];
  ws.hello({ user: "alice", status: "away", devices: 1, last_seen: null, text: "lunch", until: null, kinds: [] });
  c.setStatus("busy", "train");
  assert.deepEqual(ws.sent, [{ type: "status", status: "busy", text: "train" }]);
  // Another device says online meanwhile: this client's choice stays, to be re-sent.
  ws.frame({ type: "presence", user: "alice", status: "online", devices: 2, last_seen: null, text: null, until: null, kinds: [] });
  assert.deepEqual(c.status, { status: "busy", text: "train" });
  ws.drop();
  await until(() => ScriptedSocket.all.length === 2);
  ws = ScriptedSocket.all[1];
  ws.hello({ user: "alice", status: "online", devices: 1, last_seen: null, text: null, until: null, kinds: [] });
  assert.deepEqual(ws.sent[0], { type: "status", status: "busy", text: "train" });
  assert.deepEqual(c.status, { status: "busy", text: "train" });
  assert.equal(events.selves.length, 2, "the hello whose status is about to be replaced is not shown");
  // A refused choice falls back to the server's status, which is again not re-sent.
  c.setStatus("invisible");
  ws.frame({ type: "error", code: "invalid_status", message: "no" });
  assert.deepEqual(c.status, { status: "busy", text: "train" });
  const third = { user: "alice", status: "away", devices: 1, last_seen: null, text: null, until: null, kinds: [] };
  c.close();
  const fresh = client();
  fresh.c.connect();
  ScriptedSocket.all[0].hello(third);
  fresh.c.setStatus("invisible");
  ScriptedSocket.all[0].frame({ type: "error", code: "invalid_status", message: "no" });
  assert.deepEqual(fresh.c.status, { status: "away", text: null });
  ScriptedSocket.all[0].drop();
  await until(() => ScriptedSocket.all.length === 2);
  ScriptedSocket.all[1].hello(third);
  assert.deepEqual(ScriptedSocket.all[1].sent, []);
  fresh.c.close();
});

test("a choice made before hello goes before anything onState or onHello sends", () => {
  const { c } = client({ onHello: () => c.watch(["alice"]), onState: (s) => { if (s === "open") c.watch(["bob"]); } });
  c.setStatus("away");
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello({ user: "alice", status: "online", devices: 1, last_seen: null, text: null, until: null, kinds: [] });
  assert.deepEqual(ws.sent.map((f) => f.type), ["status", "watch", "watch", "watch"]); // the last: the list sent again
  c.close();
});

test("with a token, the user named by hello is the one whose records go to onSelf", () => {
  const { c, events } = client({ user: undefined, token: "eyJ.tok.en" });
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello(); // names alice
  ws.frame({ type: "presence", user: "alice", status: "away", devices: 2, last_seen: null, text: null });
  assert.equal(events.selves.length, 1);
  assert.equal(events.changes.length, 0);
  c.close();
});

for (const [code, reason] of [
  [1008, "invalid token: InvalidSignature"],
  [1008, "too many devices"],
  [4001, "replaced by a newer connection"],
  [4401, "token expired"],
]) {
  test(`close ${code} (${reason}) without refreshToken stops the reconnects, with willRetry false and the reason`, async () => {
    const { c, events } = client({ user: undefined, token: "eyJ.tok.en" });
    c.connect();
    ScriptedSocket.all[0].hello();
    ScriptedSocket.all[0].drop(code, reason);
    assert.equal(c.state, "closed");
    const [state, info] = events.states.at(-1);
    assert.equal(state, "closed");
    assert.deepEqual([info.code, info.reason, info.willRetry], [code, reason, false]);
    // Nothing comes back later either.
    await new Promise((r) => setTimeout(r, 60));
    assert.equal(ScriptedSocket.all.length, 1);
    assert.ok(!events.states.some(([s]) => s === "reconnecting"), JSON.stringify(events.states));
  });
}

test("a token refused before hello (1008) is not sent again and again", async () => {
  const { c, events } = client({ user: undefined, token: "bad" });
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.open();
  await until(() => ws.sent.length === 1);
  assert.deepEqual(ws.sent, [{ type: "auth", token: "bad" }]);
  ws.drop(1008, "invalid token: InvalidSignature");
  await new Promise((r) => setTimeout(r, 60));
  assert.equal(ScriptedSocket.all.length, 1);
  assert.equal(c.state, "closed");
  assert.equal(events.states.at(-1)[1].willRetry, false);
});

test("4401 with refreshToken reconnects with the fresh token", async () => {
  const { c, events } = client({ user: undefined, token: "old", refreshToken: () => "fresh" });
  c.connect();
  ScriptedSocket.all[0].hello();
  ScriptedSocket.all[0].drop(4401, "token expired");
  assert.equal(events.states.at(-1)[0], "reconnecting");
  assert.equal(events.states.at(-1)[1].willRetry, true);
  await until(() => ScriptedSocket.all.length === 2);
  const ws = ScriptedSocket.all[1];
  ws.open();
  await until(() => ws.sent.length === 1);
  assert.deepEqual(ws.sent, [{ type: "auth", token: "fresh" }]);
  c.close();
});

test("a dropped connection (1006) and a deploy (1001) are retried", async () => {
  for (const code of [1006, 1001, 1011, 1013]) {
    const { c, events } = client();
    c.connect();
    ScriptedSocket.all[0].hello();
    ScriptedSocket.all[0].drop(code);
    assert.equal(events.states.at(-1)[0], "reconnecting", `code ${code}`);
    await until(() => ScriptedSocket.all.length === 2);
    c.close();
  }
});

test("without a global WebSocket (Node 20), the ws package is used when installed", () => {
  // ws is a devDependency, so it is installed beside the library here; the
  // error without it is checked on the packed package (package.test.js).
  const saved = globalThis.WebSocket;
  delete globalThis.WebSocket;
  try {
    const c = new PresenceClient({ url: "ws://a/ws", user: "u", device: "d" });
    assert.equal(c.WebSocket, require("ws"));
  } finally {
    if (saved) globalThis.WebSocket = saved;
  }
});

test("watches: sent again after a backoff when the server answers unavailable", async () => {
  const { c, events } = client();
  c.watch(["bob"]);
  c.connect();
  const ws = ScriptedSocket.all[0];
  ws.hello();
  const watches = () => ws.sent.filter((f) => f.type === "watch");
  assert.deepEqual(watches(), [{ type: "watch", users: ["bob"] }]);
  ws.frame({ type: "error", code: "unavailable", message: "presence store unavailable, try again" });
  ws.frame({ type: "error", code: "unavailable", message: "presence store unavailable, try again" });
  assert.equal(events.errors.length, 2);
  await until(() => watches().length === 2);
  assert.deepEqual(watches()[1], { type: "watch", users: ["bob"] });
  ws.frame({ type: "snapshot", presence: [{ user: "bob", status: "online" }] });
  assert.equal(events.snapshots.length, 1);
  // A room's unavailable is the room's to retry, not the watches'.
  ws.frame({ type: "error", code: "unavailable", message: "redis", room: "r:1" });
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(watches().length, 2, "one retry per unavailable burst, none for a room");
  c.close();
});
