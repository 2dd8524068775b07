// autoAway against a real node: a real redis-server and real presence-server
// nodes (tests/browser/harness.js starts them; PRESENCE_SERVER_BIN names the
// binary), a real WebSocket, and stand-ins for the page's window and document
// on which the test plays the user's activity. Idle times are short (200 ms);
// every wait has a deadline.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const PresenceClient = require(path.join(__dirname, "..", "presence-client.js"));
const { Harness, until, DEADLINE_MS } = require(path.join(__dirname, "..", "..", "..", "tests", "browser", "harness.js"));

const IDLE_MS = 200;
const h = new Harness(fs.mkdtempSync(path.join(os.tmpdir(), "presence-autoaway-")));
const clients = [];
let node = null;

/** Node 22+ has a global WebSocket; Node 20 uses the ws package (a dev dependency). */
const BaseSocket = globalThis.WebSocket || require("ws");

before(async () => {
  await h.startRedis();
  node = await startNode("autoaway-1");
});

after(() => {
  for (const c of clients) c.close();
  h.stop();
});

async function startNode(id) {
  const n = await h.startNode(id);
  n.ws = n.base.replace(/^http/, "ws") + "/ws";
  return n;
}

const waitFor = (what, cond, ms = DEADLINE_MS) => until(what, ms, cond);

/** A page's window and document: EventTargets that count their listeners. */
function page() {
  const listeners = new Map();
  const count = (t) => {
    const add = t.addEventListener.bind(t);
    const remove = t.removeEventListener.bind(t);
    t.addEventListener = (type, fn, o) => { listeners.set(t, (listeners.get(t) || 0) + 1); add(type, fn, o); };
    t.removeEventListener = (type, fn, o) => { listeners.set(t, (listeners.get(t) || 0) - 1); remove(type, fn, o); };
    return t;
  };
  const window = count(new EventTarget());
  const document = count(new EventTarget());
  document.hidden = false;
  return {
    window,
    document,
    listeners: () => (listeners.get(window) || 0) + (listeners.get(document) || 0),
    move: () => window.dispatchEvent(new Event("pointermove")),
  };
}

/**
 * A client that records the frames it sends (`c.sent`), its own records
 * (`c.selves`), its watched users' records (`c.changes`) and its idleness
 * (`c.idles`).
 */
function make(user, device, url, extra = {}) {
  const sent = [];
  class Recording extends BaseSocket {
    send(data) {
      sent.push(JSON.parse(data));
      super.send(data);
    }
  }
  const c = new PresenceClient({ url, user, device, WebSocket: Recording, minBackoffMs: 50, maxBackoffMs: 200, ...extra });
  Object.assign(c, { sent, selves: [], changes: [], idles: [], snapshots: 0 });
  c.onSelf = (r) => c.selves.push(r);
  c.onChange = (r) => c.changes.push(r);
  c.onIdle = (idle) => c.idles.push(idle);
  c.onSnapshot = () => { c.snapshots += 1; };
  clients.push(c);
  return c;
}

/** A watcher of `user`, its watch answered. */
async function watcher(user, url = node.ws, device = "web") {
  const w = make(`${user}-watcher`, device, url);
  w.connect();
  w.watch([user]);
  await waitFor("the watcher's snapshot", () => w.snapshots === 1);
  return w;
}

/** Status frames the client sent (from `from` on): "status text". */
const statuses = (c, from = 0) => c.sent.slice(from).filter((f) => f.type === "status").map((f) => `${f.status} ${f.text}`);

/** The statuses a watcher saw, a repeat (a text change) collapsed. */
const seq = (w) => w.changes.map((r) => r.status).filter((s, i, all) => i === 0 || all[i - 1] !== s);

/** A round trip on the client's own connection: everything sent before has been answered. */
async function roundTrip(c) {
  const n = c.snapshots;
  c.watch([`nobody-${n}`]);
  await waitFor("a snapshot", () => c.snapshots > n);
}

test("idle: away with the chosen text, seen by a watcher; activity: the choice again; status keeps the choice", { timeout: 60_000 }, async () => {
  const w = await watcher("aa-idler");
  const p = page();
  const c = make("aa-idler", "tab", node.ws, { autoAway: { idleMs: IDLE_MS, window: p.window, document: p.document } });
  c.setStatus("online", "at my desk");
  c.connect();
  await waitFor("the watcher to see away", () => seq(w).join() === "online,away");
  assert.equal(c.idle, true);
  assert.deepEqual(c.idles, [true]);
  assert.equal(w.changes.at(-1).text, "at my desk", "the away keeps the chosen text");
  assert.deepEqual(c.status, { status: "online", text: "at my desk" }, "the idle away is no choice");
  p.move();
  assert.equal(c.idle, false);
  await waitFor("the watcher to see online again", () => seq(w).join() === "online,away,online");
  assert.equal(w.changes.at(-1).text, "at my desk");
  assert.deepEqual(c.idles, [true, false]);
  // Idle again: away again; a page becoming visible is activity too.
  await waitFor("the second away", () => seq(w).length === 4);
  p.document.dispatchEvent(new Event("visibilitychange"));
  await waitFor("online after the page came back", () => seq(w).length === 5);
  assert.deepEqual(seq(w), ["online", "away", "online", "away", "online"]);
  assert.deepEqual(statuses(c), ["online at my desk", "away at my desk", "online at my desk", "away at my desk", "online at my desk"]);
  // Turned off while away: the choice at once, and no idleness any more.
  await waitFor("away once more", () => seq(w).length === 6);
  c.setAutoAway(false);
  await waitFor("online once off", () => seq(w).length === 7 && seq(w)[6] === "online");
  assert.equal(c.idle, false);
  assert.equal(p.listeners(), 0, "autoAway off still listens");
});

test("a status chosen by hand (busy, invisible, away) is never overridden", { timeout: 60_000 }, async () => {
  const w = await watcher("aa-chooser");
  const p = page();
  const c = make("aa-chooser", "tab", node.ws, { autoAway: { idleMs: IDLE_MS, window: p.window, document: p.document } });
  c.setStatus("busy", "by hand"); // never online, even before the first activity
  c.connect();
  await waitFor("connected", () => c.connected);
  for (const choice of ["busy", "invisible", "away"]) {
    p.move();
    c.setStatus(choice, "by hand");
    await waitFor(`${choice} to be answered`, () => c.selves.at(-1)?.status === choice);
    const from = c.sent.length;
    await waitFor(`idle while ${choice}`, () => c.idle);
    p.move();
    await roundTrip(c);
    assert.deepEqual(statuses(c, from), [], `autoAway sent a status over ${choice}`);
  }
  assert.deepEqual(seq(w), ["busy", "offline", "away"]);
  // Idle while away by hand, then online by hand: no away until the next idleness.
  await waitFor("idle", () => c.idle);
  c.setStatus("online");
  await roundTrip(c);
  assert.deepEqual(statuses(c).slice(-1), ["online null"]);
  p.move();
  await waitFor("idle again", () => c.idle);
  await waitFor("away for the new idleness", () => w.changes.at(-1).status === "away" && w.changes.at(-1).text === null);
});

test("another device coming back online while this one is idle is not fought", { timeout: 60_000 }, async () => {
  const w = await watcher("aa-two");
  const p = page();
  const idler = make("aa-two", "laptop", node.ws, { autoAway: { idleMs: IDLE_MS, window: p.window, document: p.document } });
  idler.connect();
  idler.watch(["aa-two"]); // sees the status set on the phone
  await waitFor("the laptop away", () => w.changes.some((r) => r.status === "away"));
  const phone = make("aa-two", "phone", node.ws);
  phone.connect();
  await waitFor("the phone connected", () => phone.connected);
  phone.setStatus("online");
  await waitFor("the laptop to see the phone's online", () => idler.selves.at(-1)?.status === "online");
  await roundTrip(idler);
  assert.equal(idler.idle, true);
  assert.deepEqual(statuses(idler), ["away null"], "the laptop sent its away again");
  // Nor after a reconnect while still idle.
  const hellos = [];
  idler.onHello = (hello) => hellos.push(hello);
  idler._ws.close();
  await waitFor("the laptop back", () => hellos.length === 1 && idler.connected);
  await roundTrip(idler);
  assert.equal(idler.idle, true);
  assert.deepEqual(statuses(idler), ["away null"], "the laptop sent its away again after a reconnect");
  // The laptop's user is back: nothing to restore, the phone did.
  p.move();
  await roundTrip(idler);
  assert.deepEqual(statuses(idler), ["away null"]);
  // The phone goes idle (another device's away, over online): activity on the laptop ends it.
  phone.setStatus("away");
  await waitFor("the laptop to see the phone's away", () => idler.selves.at(-1)?.status === "away");
  p.move();
  await waitFor("online again", () => w.changes.at(-1).status === "online");
  assert.deepEqual(statuses(idler), ["away null", "online null"]);
});

test("close() clears the idle timer and the listeners; in Node without stand-ins it does nothing", { timeout: 60_000 }, async () => {
  const p = page();
  const c = make("aa-closer", "tab", node.ws, { autoAway: { idleMs: IDLE_MS, window: p.window, document: p.document } });
  assert.equal(p.listeners(), 0, "listening before connect()");
  c.connect();
  await waitFor("connected", () => c.connected);
  assert.ok(p.listeners() > 0);
  c.close();
  assert.equal(c._aaTimer, null, "a timer left after close()");
  assert.equal(p.listeners(), 0, "listeners left after close()");
  p.move();
  assert.equal(c._aaTimer, null, "activity after close() armed a timer");
  const plain = make("aa-plain", "node", node.ws, { autoAway: { idleMs: 50 } });
  plain.connect();
  await waitFor("connected", () => plain.connected);
  assert.equal(plain._aaTimer, null, "autoAway without a window or document armed a timer");
  // Bounded: three idle times without a timer to fire.
  await new Promise((r) => setTimeout(r, 3 * IDLE_MS));
  assert.deepEqual([c.idles, plain.idles, statuses(plain)], [[], [], []]);
});

test("after a reconnect the idle away stays an idle away: not re-sent as the choice, and activity ends it", { timeout: 90_000 }, async () => {
  const nodes = [await startNode("autoaway-2"), await startNode("autoaway-3"), await startNode("autoaway-4")];
  const w = await watcher("aa-mover", nodes[2].ws);
  const p = page();
  // Its status is the server's (no setStatus): hello's online.
  const c = make("aa-mover", "tab", [nodes[0].ws, nodes[1].ws], { autoAway: { idleMs: IDLE_MS, window: p.window, document: p.document } });
  c.connect();
  await waitFor("away", () => seq(w).join() === "online,away");
  assert.equal(c.url, nodes[0].ws);
  assert.deepEqual(c.status, { status: "online", text: null }, "the idle away became the client's status");
  // Active again while disconnected (before any reconnect can happen): the
  // hello sends the status back, though the client has no choice to re-send.
  let from = c.sent.length;
  c.onState = (s) => { if (s === "reconnecting" && c.idle) p.move(); };
  nodes[0].child.kill("SIGKILL");
  await waitFor("the client back, on the second node", () => c.connected && c.url === nodes[1].ws);
  assert.equal(c.idle, false);
  await waitFor("online again", () => seq(w).join() === "online,away,online");
  assert.deepEqual(statuses(c, from), ["online null"]);
  assert.deepEqual(c.status, { status: "online", text: null }, "the idle away became the client's status");

  // A choice of its own, idle through a reconnect: the away stays, and
  // the choice is not re-sent over it (no flicker), nor replaced by it.
  c.onState = () => {};
  c.setStatus("online", "reachable");
  await waitFor("idle again", () => c.idle && w.changes.at(-1).status === "away");
  assert.equal(w.changes.at(-1).text, "reachable");
  c.urls = [nodes[1].ws, nodes[2].ws];
  from = c.sent.length;
  nodes[1].child.kill("SIGKILL");
  await waitFor("the client back, on the third node", () => c.connected && c.url === nodes[2].ws);
  await roundTrip(c);
  assert.equal(c.idle, true);
  assert.deepEqual(statuses(c, from), [], "a status sent after the reconnect while still idle");
  assert.deepEqual(c.status, { status: "online", text: "reachable" });
  p.move();
  await waitFor("online on activity", () => w.changes.at(-1).status === "online");
  assert.deepEqual(statuses(c, from), ["online reachable"]);
  assert.deepEqual(seq(w), ["online", "away", "online", "away", "online"]);
});

test("docs/client.md's auto-away example, with stand-ins for the page", { timeout: 60_000 }, async () => {
  const doc = fs.readFileSync(path.join(__dirname, "..", "..", "..", "docs", "client.md"), "utf8");
  const m = /<!-- example: auto-away -->\n```js\n([\s\S]*?)```\n/.exec(doc);
  assert.ok(m, "docs/client.md has no auto-away example");
  // The example's endpoint and idle time are the test's.
  const code = m[1].replaceAll("wss://chat.example.com/ws", node.ws).replaceAll("5 * 60e3", String(IDLE_MS)).replaceAll('"alice"', '"aa-docs"');
  const w = await watcher("aa-docs");
  const p = page();
  const element = () => ({ textContent: "", onchange: null, checked: true });
  const elements = { "#me": element(), "#auto-away": element() };
  const classes = new Set();
  p.document.querySelector = (sel) => elements[sel];
  p.document.body = { classList: { toggle: (c, on) => (on ? classes.add(c) : classes.delete(c)) } };
  // The page's globals are the client's defaults in a browser; in Node they are given.
  class Client extends PresenceClient {
    constructor(o) {
      super({ ...o, WebSocket: BaseSocket });
      clients.push(this);
    }
    setAutoAway(a) {
      super.setAutoAway(a && { ...(a === true ? {} : a), window: p.window, document: p.document });
    }
  }
  const sandbox = { PresenceClient: Client, window: p.window, document: p.document };
  require("node:vm").runInNewContext(code, sandbox);
  await waitFor("the card to read Away (idle)", () => elements["#me"].textContent === "Away (idle)");
  assert.ok(classes.has("idle"));
  await waitFor("the watcher to see away", () => seq(w).join() === "online,away");
  p.move();
  await waitFor("the card to read online", () => elements["#me"].textContent === "online");
  assert.ok(!classes.has("idle"));
  // Turned off while idle: online at once, and no away after that.
  await waitFor("away again", () => elements["#me"].textContent === "Away (idle)");
  elements["#auto-away"].checked = false;
  elements["#auto-away"].onchange({ target: elements["#auto-away"] });
  await waitFor("online once off", () => elements["#me"].textContent === "online" && seq(w).join() === "online,away,online,away,online");
});
