// The package as a user gets it: `npm pack`, installed from the tarball into
// an empty app, then required (CommonJS) and imported (ESM) by plain Node
// against real presence-server nodes (target/debug, as tests/browser uses),
// each with its own private redis-server. Node runs without a global
// WebSocket, as Node 20 does: first without ws (the error must say what to
// do), then with it.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn, execFileSync } = require("node:child_process");
const crypto = require("node:crypto");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

const PKG = path.resolve(__dirname, "..");
const ROOT = path.resolve(PKG, "..", "..");
const BIN = process.env.PRESENCE_SERVER_BIN || path.join(ROOT, "target", "debug", "presence-server");
/** How long anything may take on a busy CI machine. */
const DEADLINE_MS = 20_000;
const SECRET = crypto.randomBytes(32).toString("hex");

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "presence-client-pkg-"));
const app = path.join(tmp, "app");
const nodes = [];
let dev = null;
let jwt = null;

async function until(what, ms, check) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Starts a node with its own private Redis; resolves with its ws:// base once it listens. */
async function startNode(id, extra) {
  if (!fs.existsSync(BIN)) throw new Error(`${BIN} is missing: run \`cargo build\` first (or set PRESENCE_SERVER_BIN)`);
  const dir = path.join(tmp, id);
  fs.mkdirSync(dir);
  const child = spawn(BIN, ["--listen", "127.0.0.1:0", "--node-id", id, "--local-redis-dir", dir, ...extra], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const n = { id, child, logs: [], ws: null };
  nodes.push(n);
  child.stderr.setEncoding("utf8");
  let pending = "";
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
  let exit = null;
  child.once("exit", (code, sig) => { exit = `exited with ${code ?? sig}`; });
  await until(`${id} to listen`, DEADLINE_MS, () => {
    if (exit) throw new Error(`${id} ${exit}:\n${n.logs.join("\n")}`);
    return n.ws !== null;
  });
  return n;
}

function hs256(sub) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const head = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ sub, exp: Math.floor(Date.now() / 1000) + 3600 })}`;
  return `${head}.${crypto.createHmac("sha256", SECRET).update(head).digest("base64url")}`;
}

/** Runs `source` with plain Node in the app (and `flags`); its stdout parsed as JSON. */
function run(name, source, flags = []) {
  const file = path.join(app, name);
  fs.writeFileSync(file, source);
  const out = execFileSync(process.execPath, [...flags, file], {
    cwd: app,
    encoding: "utf8",
    timeout: DEADLINE_MS * 2,
    env: { ...process.env, NODE_OPTIONS: "" },
  });
  return JSON.parse(out.trim().split("\n").pop());
}

/** Node 22+ has a global WebSocket: take it away, as Node 20 has none. */
const NO_GLOBAL = "delete globalThis.WebSocket;\n";

before(async () => {
  const tarball = execFileSync("npm", ["pack", "--silent", "--pack-destination", tmp], { cwd: PKG, encoding: "utf8" }).trim().split("\n").pop();
  fs.mkdirSync(app);
  fs.writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "app", private: true }));
  // The package has no dependencies (ws is an optional peer): installs offline.
  execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", path.join(tmp, tarball)], { cwd: app, stdio: "pipe" });
  dev = await startNode("pkg-dev", ["--heartbeat-ms", "1000"]);
  jwt = await startNode("pkg-jwt", ["--auth", "jwt", "--jwt-secret", SECRET, "--local-redis"]);
});

after(() => {
  for (const n of nodes) n.child.kill("SIGTERM");
});

test("the tarball holds the library, its ESM entry, the React hooks and their types, and nothing else", () => {
  const installed = path.join(app, "node_modules", "presence-client");
  const files = fs.readdirSync(installed).sort();
  assert.deepEqual(files, [
    "README.md", "package.json", "presence-client.d.ts", "presence-client.js", "presence-client.mjs", "react.d.ts", "react.js", "react.mjs",
  ]);
  // The very file every node serves at /presence-client.js.
  assert.equal(fs.readFileSync(path.join(installed, "presence-client.js"), "utf8"), fs.readFileSync(path.join(PKG, "presence-client.js"), "utf8"));
});

test("presence-client/react: the same hooks from require and import, with the app's React", () => {
  // React is the app's (an optional peer): the one the client's tests use.
  fs.symlinkSync(path.join(PKG, "node_modules", "react"), path.join(app, "node_modules", "react"), "dir");
  const r = run("react.mjs", `
import { createRequire } from "node:module";
import * as esm from "presence-client/react";
const cjs = createRequire(import.meta.url)("presence-client/react");
const names = Object.keys(esm).sort();
console.log(JSON.stringify({ names, same: names.every((n) => esm[n] === cjs[n]) }));
`);
  assert.deepEqual(r, { names: ["PresenceProvider", "useOccupancy", "usePresence", "usePresenceClient", "useRoom", "useSelf"], same: true });
});

test("without a WebSocket class, the error says what to install or pass", () => {
  const r = run("no-ws.js", NO_GLOBAL + `
const PresenceClient = require("presence-client");
try {
  new PresenceClient({ url: "ws://127.0.0.1:1/ws", user: "alice", device: "d" });
  console.log(JSON.stringify({ error: null }));
} catch (e) {
  console.log(JSON.stringify({ error: e.message }));
}
`);
  assert.ok(r.error, "no error without a WebSocket class");
  assert.match(r.error, /npm install ws/);
  assert.match(r.error, /WebSocket: require\("ws"\)/);
  assert.doesNotMatch(r.error, /is not a constructor/);
});

test("CommonJS with ws: watch, a contact's change in onChange, my own record in onSelf", () => {
  fs.symlinkSync(path.join(PKG, "node_modules", "ws"), path.join(app, "node_modules", "ws"), "dir");
  const r = run("cjs.js", NO_GLOBAL + `
const PresenceClient = require("presence-client");
const url = ${JSON.stringify(dev.ws)};
const seen = { alice: { changes: [], selves: [] }, bob: { changes: [], selves: [] } };
const alice = new PresenceClient({ url, user: "alice", device: "a1" });
const bob = new PresenceClient({ url, user: "bob", device: "b1" });
for (const [name, c] of [["alice", alice], ["bob", bob]]) {
  c.onChange = (rec) => seen[name].changes.push(rec);
  c.onSelf = (rec) => seen[name].selves.push(rec);
}
const done = (result) => { alice.close(); bob.close(); console.log(JSON.stringify(result)); };
const timer = setTimeout(() => done({ timeout: true, seen }), ${DEADLINE_MS});
alice.onSnapshot = (records) => {
  if (!records.some((rec) => rec.user === "bob" && rec.status === "online")) return;
  alice.setStatus("online", "here");
  bob.setStatus("busy", "on the train");
};
bob.onHello = () => { alice.watch(["bob"]); alice.connect(); };
alice.onChange = (rec) => {
  seen.alice.changes.push(rec);
  if (rec.user === "bob" && rec.status === "busy") {
    const wait = setInterval(() => {
      if (seen.bob.selves.length && seen.alice.selves.length) { clearInterval(wait); clearTimeout(timer); done({ seen, ws: alice.WebSocket === require("ws") }); }
    }, 20);
  }
};
bob.connect();
`);
  assert.ok(!r.timeout, JSON.stringify(r));
  assert.equal(r.ws, true, "the ws package is the WebSocket class");
  assert.deepEqual(r.seen.alice.changes.map((c) => [c.user, c.status, c.text]), [["bob", "busy", "on the train"]]);
  assert.ok(r.seen.alice.selves.every((c) => c.user === "alice"), JSON.stringify(r.seen.alice.selves));
  // His own record from hello first, then the answer to his setStatus.
  assert.deepEqual(r.seen.bob.selves.map((c) => [c.user, c.status, c.text]), [["bob", "online", null], ["bob", "busy", "on the train"]]);
  assert.deepEqual(r.seen.bob.changes, []);
});

/** The fenced block after `<!-- example: NAME -->` in docs/client.md. */
function clientDocBlock(name) {
  const doc = fs.readFileSync(path.join(ROOT, "docs", "client.md"), "utf8");
  const m = new RegExp(`<!-- example: ${name} -->\\n\`\`\`[a-z]*\\n([\\s\\S]*?)\`\`\`\\n`).exec(doc);
  assert.ok(m, `docs/client.md has no <!-- example: ${name} --> block`);
  return m[1];
}

test("docs/client.md's Node install and app, run as printed in a new directory", () => {
  // A clone as a newcomer has it: clients/js with its files and no node_modules (where the
  // client's own devDependency ws would hide an app's ws that the client cannot find).
  const clone = path.join(tmp, "clone");
  const pkgDir = path.join(clone, "clients", "js");
  fs.mkdirSync(pkgDir, { recursive: true });
  const { files } = JSON.parse(fs.readFileSync(path.join(PKG, "package.json"), "utf8"));
  for (const f of ["package.json", ...files]) fs.copyFileSync(path.join(PKG, f), path.join(pkgDir, f));
  const home = path.join(tmp, "newcomer");
  fs.mkdirSync(home);
  const install = clientDocBlock("node-install");
  assert.match(install, /\/path\/to\/presence-server/);
  execFileSync("bash", ["-e", "-c", install.replaceAll("/path/to/presence-server", clone)], {
    cwd: home,
    stdio: "pipe",
    timeout: DEADLINE_MS * 3,
    // The registry's packages from npm's cache where it has them (CI's npm ci put ws there).
    env: { ...process.env, npm_config_prefer_offline: "true", npm_config_audit: "false", npm_config_fund: "false" },
  });
  const myApp = path.join(home, "my-app");
  // npm links a folder: the client's file resolves from the clone, not from the app.
  assert.ok(fs.lstatSync(path.join(myApp, "node_modules", "presence-client")).isSymbolicLink(), "npm no longer links a folder");
  const source = clientDocBlock("node-app");
  assert.match(source, /ws:\/\/127\.0\.0\.1:8080\/ws/);
  fs.writeFileSync(path.join(myApp, "app.js"), source.replace("ws://127.0.0.1:8080/ws", dev.ws));
  // As in Node 20, whatever this Node is: no global WebSocket.
  const noGlobal = path.join(tmp, "no-global.js");
  fs.writeFileSync(noGlobal, NO_GLOBAL);
  const out = execFileSync(process.execPath, ["app.js"], {
    cwd: myApp,
    encoding: "utf8",
    timeout: DEADLINE_MS,
    env: { ...process.env, NODE_OPTIONS: `--require ${noGlobal}` },
  });
  assert.equal(out.trim(), "connected as alice");
});

test("ESM import: the same class, default and named; a token's user comes from hello", () => {
  const r = run("esm.mjs", NO_GLOBAL + `
import PresenceClient, { PresenceClient as Named } from "presence-client";
const c = new PresenceClient({ url: ${JSON.stringify(jwt.ws)}, token: ${JSON.stringify(hs256("carol"))}, device: "e1" });
const timer = setTimeout(() => { c.close(); console.log(JSON.stringify({ timeout: true })); }, ${DEADLINE_MS});
c.onHello = (h) => { clearTimeout(timer); c.close(); console.log(JSON.stringify({ same: PresenceClient === Named, user: h.user })); };
c.connect();
`);
  assert.deepEqual(r, { same: true, user: "carol" });
});

test("where there is a global WebSocket (Node 22+, or Node 20 with the flag), it is the one used", () => {
  const major = Number(process.versions.node.split(".")[0]);
  const flags = major < 22 ? ["--experimental-websocket"] : [];
  const r = run("global.js", `
const PresenceClient = require("presence-client");
const c = new PresenceClient({ url: ${JSON.stringify(dev.ws)}, user: "dave", device: "g1" });
const timer = setTimeout(() => { c.close(); console.log(JSON.stringify({ timeout: true })); }, ${DEADLINE_MS});
c.onHello = (h) => { clearTimeout(timer); c.close(); console.log(JSON.stringify({ global: c.WebSocket === globalThis.WebSocket, user: h.user })); };
c.connect();
`, flags);
  assert.deepEqual(r, { global: true, user: "dave" });
});

test("a refused token stops the reconnects: closed, willRetry false, code 1008 and the reason", () => {
  const r = run("refused.js", NO_GLOBAL + `
const PresenceClient = require("presence-client");
const states = [];
const c = new PresenceClient({ url: ${JSON.stringify(jwt.ws)}, token: "not.a.token", device: "r1", minBackoffMs: 10, maxBackoffMs: 20 });
const timer = setTimeout(() => { c.close(); console.log(JSON.stringify({ timeout: true, states })); }, ${DEADLINE_MS});
c.onState = (state, info) => {
  states.push([state, info.code, info.reason, info.willRetry]);
  if (state === "closed") {
    clearTimeout(timer);
    // Had it scheduled a reconnect, it would run within 20 ms: give it 200.
    setTimeout(() => console.log(JSON.stringify({ states, pending: c._timer !== null })), 200);
  }
};
c.connect();
`);
  assert.ok(!r.timeout, JSON.stringify(r));
  const closed = r.states.filter(([s]) => s === "closed");
  assert.equal(closed.length, 1, JSON.stringify(r.states));
  const [, code, reason, willRetry] = closed[0];
  assert.equal(code, 1008);
  assert.equal(willRetry, false);
  assert.match(reason, /token/);
  assert.ok(!r.states.some(([s]) => s === "reconnecting"), JSON.stringify(r.states));
  assert.equal(r.pending, false);
});

test("a page's origin the server refuses stops the reconnects: 1008, the reason names --allowed-origins", () => {
  const ws = path.join(app, "node_modules", "ws");
  if (!fs.existsSync(ws)) fs.symlinkSync(path.join(PKG, "node_modules", "ws"), ws, "dir");
  const r = run("origin.js", NO_GLOBAL + `
const PresenceClient = require("presence-client");
const WS = require("ws");
// What a browser does on a page served from elsewhere: it sends the page's origin.
class FromElsewhere extends WS {
  constructor(url, protocols) { super(url, protocols, { origin: "https://app.example.com" }); }
}
const states = [];
const c = new PresenceClient({ url: ${JSON.stringify(dev.ws)}, user: "erin", device: "o1", WebSocket: FromElsewhere, minBackoffMs: 10, maxBackoffMs: 20 });
const timer = setTimeout(() => { c.close(); console.log(JSON.stringify({ timeout: true, states })); }, ${DEADLINE_MS});
c.onState = (state, info) => {
  states.push([state, info.code, info.reason, info.willRetry]);
  if (state === "closed") {
    clearTimeout(timer);
    // Had it scheduled a reconnect, it would run within 20 ms: give it 200.
    setTimeout(() => console.log(JSON.stringify({ states, pending: c._timer !== null, hello: c.hello })), 200);
  }
};
c.connect();
`);
  assert.ok(!r.timeout, JSON.stringify(r));
  const closed = r.states.filter(([s]) => s === "closed");
  assert.equal(closed.length, 1, JSON.stringify(r.states));
  assert.deepEqual(closed[0], ["closed", 1008, "origin not allowed: start the server with --allowed-origins https://app.example.com", false]);
  assert.ok(!r.states.some(([s]) => s === "reconnecting"), JSON.stringify(r.states));
  assert.equal(r.pending, false);
  assert.equal(r.hello, null);
});

test("a fresh device of a user with a status set earlier starts with it: status, onSelf, nothing sent back", () => {
  const ws = path.join(app, "node_modules", "ws");
  if (!fs.existsSync(ws)) fs.symlinkSync(path.join(PKG, "node_modules", "ws"), ws, "dir");
  const r = run("inherit.js", NO_GLOBAL + `
const PresenceClient = require("presence-client");
const url = ${JSON.stringify(dev.ws)};
const first = new PresenceClient({ url, user: "fay", device: "phone" });
const timer = setTimeout(() => { first.close(); console.log(JSON.stringify({ timeout: true })); }, ${DEADLINE_MS});
first.onHello = () => first.setStatus("away", "in a meeting");
first.onSelf = (own) => {
  if (own.status !== "away") return;
  // A new device of fay, which watches nobody, not even fay.
  const fresh = new PresenceClient({ url, user: "fay", device: "laptop" });
  const selves = [];
  fresh.onSelf = (rec) => selves.push(rec);
  fresh.onHello = (hello) => {
    const status = fresh.status;
    // Anything sent back would be answered with a presence frame: wait a moment for one.
    setTimeout(() => {
      clearTimeout(timer);
      first.close(); fresh.close();
      console.log(JSON.stringify({ self: hello.self, status, selves }));
    }, 300);
  };
  fresh.connect();
};
first.connect();
`);
  assert.ok(!r.timeout, JSON.stringify(r));
  assert.deepEqual(r.status, { status: "away", text: "in a meeting" });
  assert.deepEqual(r.self, { user: "fay", status: "away", devices: 2, last_seen: null, text: "in a meeting", until: null, kinds: ["other"] });
  assert.deepEqual(r.selves, [r.self]);
});
