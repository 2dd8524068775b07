// docs/rooms-guide.md, run: the code it shows is the files in docs/examples/,
// byte for byte; a real redis-server, a real presence-server node
// (target/debug/presence-server, built by `cargo build` first;
// PRESENCE_SERVER_BIN overrides it) started with the guide's command line,
// and the guide's backend (docs/examples/chat-backend.js) as its own
// process; then two users, with the JS client and the guide's browser code
// (docs/examples/chat-client.js), through every policy's example.
"use strict";

const { describe, test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const crypto = require("node:crypto");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const WebSocket = require("ws");

const PresenceClient = require("../presence-client.js");
const ROOT = path.resolve(__dirname, "..", "..", "..");
const GUIDE = path.join(ROOT, "docs", "rooms-guide.md");
const BACKEND = path.join(ROOT, "docs", "examples", "chat-backend.js");
const { signJwt } = require(BACKEND); // the test is the app's sign-in: it mints connection tokens
const { connectChat, roomErrorText } = require(path.join(ROOT, "docs", "examples", "chat-client.js"));
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

// ---- The guide's markdown --------------------------------------------------------------

const guide = fs.readFileSync(GUIDE, "utf8");

/** The fenced blocks that follow `<!-- example: NAME -->`, as [name, body]. */
function examples() {
  const found = [];
  const re = /<!-- example: (.+?) -->\n```[a-z]*\n([\s\S]*?)```\n/g;
  for (let m; (m = re.exec(guide));) found.push([m[1], m[2]]);
  return found;
}

/** A shell command's words: `\`-newlines joined, single quotes removed, `$(...)` kept whole. */
function shellWords(text) {
  const words = [];
  const re = /'([^']*)'|((?:\$\([^)]*\)|[^\s'])+)/g;
  for (let m; (m = re.exec(text.replace(/\\\n/g, " ")));) words.push(m[1] ?? m[2]);
  return words;
}

/** `NAME=value` words before the program, and the program's words. */
function command(name) {
  const block = examples().find(([n]) => n === name);
  assert.ok(block, `the guide has no <!-- example: ${name} --> block`);
  const words = shellWords(block[1]);
  const env = {};
  while (/^[A-Z_]+=/.test(words[0])) {
    const [k, v] = words.shift().split(/=(.*)/s);
    env[k] = v;
  }
  return { env, argv: words };
}

test("every code block marked as an example file is that file, byte for byte", () => {
  const files = examples().filter(([name]) => name.startsWith("docs/examples/"));
  assert.deepEqual(files.map(([n]) => n).sort(), ["docs/examples/chat-backend.js", "docs/examples/chat-client.js"]);
  for (const [name, body] of files) {
    assert.equal(body, fs.readFileSync(path.join(ROOT, name), "utf8"), `${name}: the guide's block differs from the file`);
  }
});

// ---- The deployment ------------------------------------------------------------------------

describe("the guide's deployment, with two users", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "presence-guide-"));
  const secret = (n) => crypto.randomBytes(n).toString("hex");
  const keys = { admin: secret(16), jwt: secret(32), join: secret(16) };
  const procs = [];
  const clients = [];
  let redisPort;
  let node; // {ws, internal, logs}
  let backend; // base URL

  /** Spawns a child whose stderr and stdout lines go to `logs`; resolves once `ready` matches one. */
  async function start(what, cmd, args, env, ready) {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    const p = { child, logs: [], found: null, exit: null };
    procs.push(p);
    child.once("exit", (code, sig) => { p.exit = code ?? sig; });
    for (const stream of [child.stdout, child.stderr]) {
      let pending = "";
      stream.setEncoding("utf8");
      stream.on("data", (d) => {
        const lines = (pending + d).split("\n");
        pending = lines.pop();
        for (const line of lines) {
          p.logs.push(line);
          for (const [key, re] of Object.entries(ready)) {
            const m = line.match(re);
            if (m) p.found = { ...p.found, [key]: m[1] };
          }
        }
      });
    }
    await waitFor(`${what} to start`, () => {
      if (p.exit !== null) throw new Error(`${what} exited (${p.exit}):\n${p.logs.join("\n")}`);
      return p.found && Object.keys(ready).every((k) => p.found[k]);
    });
    return p;
  }

  before(async () => {
    if (!fs.existsSync(BIN)) throw new Error(`${BIN} is missing: run \`cargo build\` first (or set PRESENCE_SERVER_BIN)`);
    for (let i = 0; i < 5 && !redisPort; i++) {
      const port = await freePort();
      const child = spawn("redis-server", [
        path.join(ROOT, "redis.conf"), "--port", String(port), "--bind", "127.0.0.1",
        "--dir", tmp, "--logfile", path.join(tmp, "redis.log"), "--appendonly", "no",
      ], { stdio: "ignore" });
      const p = { child, exit: null };
      procs.push(p);
      child.once("exit", () => { p.exit = "exited"; });
      child.once("error", () => { p.exit = "error"; });
      const deadline = Date.now() + DEADLINE_MS;
      while (p.exit === null && Date.now() < deadline && !(await pings(port))) await new Promise((r) => setTimeout(r, 50));
      if (p.exit === null) redisPort = port;
    }
    if (!redisPort) throw new Error("redis-server did not start (apt-get install -y redis-server)");

    // The guide's command line, with this machine's addresses and secrets.
    fs.writeFileSync(path.join(tmp, "jwt-secret"), keys.jwt + "\n");
    fs.writeFileSync(path.join(tmp, "room-join-secret"), keys.join + "\n");
    const backendPort = await freePort();
    const ours = {
      "--listen": "127.0.0.1:0",
      "--internal-listen": "127.0.0.1:0",
      "--redis-url": `redis://127.0.0.1:${redisPort}/0`,
      "--jwt-secret-file": path.join(tmp, "jwt-secret"),
      "--room-join-url": `http://127.0.0.1:${backendPort}/presence/room-join`,
      "--room-join-secret-file": path.join(tmp, "room-join-secret"),
    };
    const server = command("server command");
    assert.deepEqual(Object.keys(server.env), ["PRESENCE_ADMIN_KEY"]);
    assert.equal(server.argv.shift(), "presence-server");
    const args = server.argv.map((w, i) => (server.argv[i - 1] in ours ? ours[server.argv[i - 1]] : w));
    for (const flag of Object.keys(ours)) assert.ok(server.argv.includes(flag), `the guide's command has no ${flag}`);
    assert.ok(args.includes("--room-policy"), "the guide's command sets room policies");
    node = (await start("presence-server", BIN, args, { PRESENCE_ADMIN_KEY: keys.admin, RUST_LOG: "info" }, {
      ws: /listening on http:\/\/(\S+)/,
      internal: /admin API on http:\/\/(\S+) only/,
    })).found;

    // The guide's backend command, with the same.
    const backendCmd = command("backend command");
    assert.deepEqual(backendCmd.argv, ["node", "docs/examples/chat-backend.js"]);
    const env = {
      PRESENCE_ADMIN_URL: `http://${node.internal}`,
      PRESENCE_ADMIN_KEY: keys.admin,
      PRESENCE_JWT_SECRET: keys.jwt,
      PRESENCE_ROOM_JOIN_SECRET: keys.join,
      HOST: "127.0.0.1",
      PORT: String(backendPort),
    };
    assert.deepEqual(Object.keys(backendCmd.env).sort(), Object.keys(env).sort());
    backend = `http://${(await start("chat-backend.js", process.execPath, [BACKEND], env, { url: /listening on http:\/\/(\S+)/ })).found.url}`;
  });

  after(() => {
    for (const c of clients) c.close();
    for (const p of procs) if (p.exit === null) p.child.kill("SIGKILL");
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  /** A connection token from "the app's sign-in": rooms claim org:acme:*, an hour. */
  const tokenOf = (user) => signJwt({ sub: user, exp: Math.floor(Date.now() / 1000) + 3600, rooms: ["org:acme:*"] }, keys.jwt);

  /** The app calling its backend as `user`. */
  async function app(user, method, p, body) {
    const r = await fetch(backend + p, {
      method,
      headers: { authorization: `Bearer ${tokenOf(user)}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: r.status, body: await r.text() };
  }

  /** A user's browser (a device of its own): the guide's connectChat, with ws for Node. */
  let devices = 0;
  async function browser(user) {
    const errors = [];
    const c = connectChat({
      PresenceClient, url: `ws://${node.ws}/ws`, backend, device: `web-${++devices}`, token: tokenOf(user),
      WebSocket, minBackoffMs: 100, maxBackoffMs: 400, onError: (e) => errors.push(e),
    });
    c.errors = errors;
    clients.push(c);
    await waitFor(`${user} to connect`, () => c.connected);
    return c;
  }

  /** Joins; resolves with the room once it is in, or once it is over (a refusal). */
  async function join(c, id, opts) {
    const r = c.join(id, opts);
    r.errors = [];
    r.leaves = [];
    r.onError = (e) => r.errors.push(e);
    r.onLeave = (e) => r.leaves.push(e);
    await waitFor(`${c.user} to be in ${id}, or refused`, () => r.joined || r.errors.some((e) => e.willRetry === false));
    return r;
  }

  const refusedWith = (r, code) => {
    assert.equal(r.joined, false, `${r.id}: refused`);
    const last = r.errors[r.errors.length - 1];
    assert.equal(last.code, code, `${r.id}: ${JSON.stringify(r.errors)}`);
    assert.equal(last.willRetry, false);
    return last;
  };

  test("claim and open: the connection token's rooms, and the lobby", { timeout: 60_000 }, async () => {
    const alice = await browser("alice");
    assert.ok((await join(alice, "org:acme:general")).joined);
    const other = refusedWith(await join(alice, "org:globex:general"), "forbidden");
    assert.equal(roomErrorText(other), "You don't have access to this room.");
    assert.ok((await join(alice, "lobby:main")).joined);
  });

  test("members: in after the backend's PUT, out at once after its DELETE", { timeout: 60_000 }, async () => {
    const alice = await browser("alice");
    const bob = await browser("bob");
    // Before the conversation exists: nobody is on its list.
    refusedWith(await join(bob, "chat:7"), "forbidden");
    // Only a member (or its creator) changes a room.
    assert.equal((await app("carol", "PUT", "/rooms/chat:7", { members: ["alice", "bob"] })).status, 403);
    assert.deepEqual(await app("alice", "PUT", "/rooms/chat:7", { members: ["alice", "bob"] }), { status: 200, body: '{"room":"chat:7","members":["alice","bob"]}' });
    const a = await join(alice, "chat:7");
    const b = await join(bob, "chat:7");
    assert.ok(a.joined && b.joined);
    await waitFor("alice to see bob in chat:7", () => a.members.has("bob"));

    // alice takes bob out: his device is told at once, alice sees him leave, removed.
    assert.equal((await app("alice", "DELETE", "/rooms/chat:7/members/bob")).status, 200);
    await waitFor("bob's removed error", () => b.errors.length > 0);
    const removed = refusedWith(b, "removed");
    assert.equal(roomErrorText(removed), "You were removed from this room.");
    await waitFor("alice to see bob removed", () => a.leaves.some((e) => e.user === "bob" && e.removed === true));
    assert.equal(a.members.has("bob"), false);
    // And he is off the server's list: a rejoin is refused.
    refusedWith(await join(bob, "chat:7"), "forbidden");
    // A PUT without alice's consent changes nothing: bob is no member any more.
    assert.equal((await app("bob", "PUT", "/rooms/chat:7", { members: ["bob"] })).status, 403);
  });

  test("proxy: the backend decides, and refuses unsigned or forged questions with 401", { timeout: 60_000 }, async () => {
    // The node's question, as the guide shows it, signed or not.
    const ask = async (body, header) => {
      const r = await fetch(`${backend}/presence/room-join`, {
        method: "POST", headers: { "content-type": "application/json", ...(header ? { "presence-signature": header } : {}) }, body,
      });
      return { status: r.status, body: await r.text() };
    };
    const sign = (body, key = keys.join, t = Math.floor(Date.now() / 1000)) =>
      `t=${t},v1=${crypto.createHmac("sha256", key).update(`${t}.${body}`).digest("hex")}`;
    assert.equal((await app("alice", "PUT", "/rooms/team:1", { members: ["alice"] })).status, 200);
    const q = JSON.stringify({ user: "alice", device: "web", room: "team:1", state: {} });
    assert.deepEqual(await ask(q, sign(q)), { status: 200, body: '{"allow":true}' });
    assert.equal((await ask(q)).status, 401, "unsigned");
    assert.equal((await ask(q, sign(q, "not-the-room-join-secret"))).status, 401, "another key");
    assert.equal((await ask(q, sign(q, keys.join, Math.floor(Date.now() / 1000) - 600))).status, 401, "10 minutes old");
    const forged = q.replace('"alice"', '"bob"');
    assert.equal((await ask(forged, sign(q))).status, 401, "a body the signature is not for");
    const good = sign(q);
    const changed = good.slice(0, -1) + (good.endsWith("0") ? "1" : "0");
    assert.equal((await ask(q, changed)).status, 401, "a changed signature");
    assert.equal((await ask(q, `t=${Math.floor(Date.now() / 1000)},v1=${"g".repeat(64)}`)).status, 401, "not hex");
    assert.equal((await ask(q, "garbage")).status, 401, "not a signature");

    const alice = await browser("alice");
    const bob = await browser("bob");
    const a = await join(alice, "team:1");
    assert.ok(a.joined);
    refusedWith(await join(bob, "team:1"), "forbidden");
    // Added to the team, bob gets in on the next try: the refusal was not kept.
    assert.equal((await app("alice", "PUT", "/rooms/team:1", { members: ["alice", "bob"] })).status, 200);
    const b = await join(bob, "team:1");
    assert.ok(b.joined);
    // Taken out: out at once, and the grant the node kept for him is void.
    assert.equal((await app("alice", "DELETE", "/rooms/team:1/members/bob")).status, 200);
    await waitFor("bob's removed error", () => b.errors.length > 0);
    refusedWith(b, "removed");
    refusedWith(await join(bob, "team:1"), "forbidden");
  });

  test("token: getToken from the backend; a token for another room is refused", { timeout: 60_000 }, async () => {
    assert.equal((await app("alice", "PUT", "/rooms/doc:1", { members: ["alice", "bob"] })).status, 200);
    assert.equal((await app("alice", "PUT", "/rooms/doc:2", { members: ["alice"] })).status, 200);
    // The endpoint getToken calls: a token for a reader, 403 for anyone else, 401 without sign-in.
    const roomToken = (user, room) => app(user, "GET", `/presence/room-token?room=${encodeURIComponent(room)}`);
    const t1 = await roomToken("bob", "doc:1");
    assert.equal(t1.status, 200);
    const claims = JSON.parse(Buffer.from(t1.body.split(".")[1], "base64url"));
    assert.deepEqual(Object.keys(claims).sort(), ["exp", "room", "sub"]);
    assert.equal(claims.sub, "bob");
    assert.equal(claims.room, "doc:1");
    assert.ok(claims.exp * 1000 > Date.now() && claims.exp * 1000 <= Date.now() + 300_000);
    assert.equal((await roomToken("bob", "doc:2")).status, 403);
    assert.equal((await fetch(`${backend}/presence/room-token?room=doc:1`)).status, 401);
    // A room token is no sign-in at the backend.
    const asSignIn = await fetch(`${backend}/presence/room-token?room=doc:1`, { headers: { authorization: `Bearer ${t1.body}` } });
    assert.equal(asSignIn.status, 401);

    const alice = await browser("alice");
    const bob = await browser("bob");
    const a = await join(alice, "doc:1", { state: { page: 1 } });
    const b = await join(bob, "doc:1", { state: { page: 3 } }); // getToken asks the backend
    assert.ok(a.joined && b.joined, JSON.stringify([a.errors, b.errors]));
    await waitFor("alice to see bob on page 3", () => a.members.get("bob")?.[0].state.page === 3);
    // bob's token for doc:1 does not open doc:2.
    refusedWith(await join(bob, "doc:2", { token: t1.body }), "forbidden");
    // Nor does getToken get him one: the backend says 403, the client gives the room up.
    const viaGetToken = refusedWith(await join(bob, "doc:2"), "client");
    assert.match(viaGetToken.message, /HTTP 403/);
    assert.ok(roomErrorText(viaGetToken));
    // Taken off the document: out at once, not at the token's expiry.
    assert.equal((await app("alice", "PUT", "/rooms/doc:1", { members: ["alice"] })).status, 200);
    await waitFor("bob's removed error", () => b.errors.length > 0);
    refusedWith(b, "removed");
    await waitFor("alice to see bob removed", () => a.leaves.some((e) => e.user === "bob" && e.removed === true));
  });
});
