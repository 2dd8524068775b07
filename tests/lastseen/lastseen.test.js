// docs/events.md's consumer (docs/examples/lastseen-consumer.js), run for real: a real
// PostgreSQL (Debian's postgresql package, its own cluster in a temp dir on a random port), a
// real redis-server and two presence-server nodes (target/debug/presence-server, built by
// `cargo build` first; PRESENCE_SERVER_BIN overrides it) posting their webhooks to the consumer.
// Users come and go on both nodes and change status; the consumer starts late, is SIGKILLed in
// the middle of it all and started again while the churn goes on; at the end UserLastSeen must
// equal the server's own record of every user: status, and last seen of everyone offline.
"use strict";

const { describe, test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn, execFileSync } = require("node:child_process");
const crypto = require("node:crypto");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const { Client } = require("pg");
const WebSocket = require("ws");

const ROOT = path.resolve(__dirname, "..", "..");
const CONSUMER = path.join(ROOT, "docs", "examples", "lastseen-consumer.js");
const DOC = path.join(ROOT, "docs", "events.md");
const BIN = process.env.PRESENCE_SERVER_BIN || path.join(ROOT, "target", "debug", "presence-server");
const DEADLINE_MS = 30_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Resolves once `await cond()` holds; rejects naming `what` (and `detail()`) after `ms`. */
async function waitFor(what, cond, ms = DEADLINE_MS, detail = () => "") {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}${detail()}`);
    await sleep(50);
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

/** Debian keeps initdb and postgres in /usr/lib/postgresql/<version>/bin, off the PATH. */
function pgBin(name) {
  const base = "/usr/lib/postgresql";
  const versions = fs.existsSync(base) ? fs.readdirSync(base).filter((v) => /^\d+$/.test(v)).sort((a, b) => b - a) : [];
  for (const v of versions) {
    const p = path.join(base, v, "bin", name);
    if (fs.existsSync(p)) return p;
  }
  try {
    return execFileSync("sh", ["-c", `command -v ${name}`], { encoding: "utf8" }).trim();
  } catch {
    throw new Error(`${name} not found: apt-get install -y postgresql`);
  }
}

test("docs/events.md shows lastseen-consumer.js byte for byte", () => {
  const re = /<!-- example: docs\/examples\/lastseen-consumer\.js -->\n```js\n([\s\S]*?)```\n/;
  const m = re.exec(fs.readFileSync(DOC, "utf8"));
  assert.ok(m, "docs/events.md has no <!-- example: docs/examples/lastseen-consumer.js --> block");
  assert.equal(m[1], fs.readFileSync(CONSUMER, "utf8"), "the doc's block differs from the file");
});

describe("last seen into PostgreSQL, through a consumer's SIGKILL", () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "presence-lastseen-"));
  const procs = [];
  const keys = { service: crypto.randomBytes(16).toString("hex"), webhook: crypto.randomBytes(16).toString("hex") };
  let pg; // {port, client}
  let redisPort;
  const nodes = []; // {ws, http}
  let consumerPort;
  let consumerEnv;

  /** Spawns a child whose stdout and stderr lines go to `p.logs`; resolves once `ready` matches one. */
  async function start(what, cmd, args, opts, ready) {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], ...opts });
    const p = { what, child, logs: [], found: null, exit: null };
    procs.push(p);
    child.once("exit", (code, sig) => { p.exit = code ?? sig; });
    child.once("error", (err) => { p.exit = err.message; });
    for (const stream of [child.stdout, child.stderr]) {
      let pending = "";
      stream.setEncoding("utf8");
      stream.on("data", (d) => {
        const lines = (pending + d).split("\n");
        pending = lines.pop();
        for (const line of lines) {
          p.logs.push(line);
          if (process.env.LASTSEEN_VERBOSE) console.error(`[${what}] ${line}`);
          const m = ready && line.match(ready);
          if (m && !p.found) p.found = m[1];
        }
      });
    }
    if (ready) {
      await waitFor(`${what} to start`, () => {
        if (p.exit !== null) throw new Error(`${what} exited (${p.exit}):\n${p.logs.join("\n")}`);
        return p.found !== null;
      });
    }
    return p;
  }

  before(async () => {
    if (!fs.existsSync(BIN)) throw new Error(`${BIN} is missing: run \`cargo build\` first (or set PRESENCE_SERVER_BIN)`);

    // PostgreSQL refuses to run as root: as root, its cluster belongs to the postgres user.
    const pgDir = fs.mkdtempSync(path.join(os.tmpdir(), "presence-lastseen-pg-"));
    const as = {};
    if (process.getuid() === 0) {
      as.uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }));
      as.gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }));
      fs.chownSync(pgDir, as.uid, as.gid);
    }
    const data = path.join(pgDir, "data");
    execFileSync(pgBin("initdb"), ["-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"], { ...as, cwd: pgDir, stdio: "pipe" });
    for (let i = 0; i < 5 && !pg; i++) {
      const port = await freePort();
      const p = await start("postgres", pgBin("postgres"), [
        "-D", data, "-p", String(port), "-k", pgDir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
      ], { ...as, cwd: pgDir }, null);
      const deadline = Date.now() + DEADLINE_MS;
      while (p.exit === null && !pg) {
        const client = new Client({ host: "127.0.0.1", port, user: "postgres", database: "postgres" });
        client.on("error", () => {});
        if (await client.connect().then(() => true, () => false)) pg = { port, client };
        else if (Date.now() > deadline) throw new Error(`postgres did not accept connections:\n${p.logs.join("\n")}`);
        else await sleep(100);
      }
    }
    if (!pg) throw new Error(`postgres did not start:\n${procs.filter((p) => p.what === "postgres").map((p) => p.logs.join("\n")).join("\n")}`);
    procs.pgDir = pgDir;

    for (let i = 0; i < 5 && !redisPort; i++) {
      const port = await freePort();
      const p = await start("redis-server", "redis-server", [
        path.join(ROOT, "redis.conf"), "--port", String(port), "--bind", "127.0.0.1",
        "--dir", tmp, "--logfile", path.join(tmp, "redis.log"), "--appendonly", "no",
      ], {}, null);
      const deadline = Date.now() + DEADLINE_MS;
      while (p.exit === null && Date.now() < deadline && !(await pings(port))) await sleep(50);
      if (p.exit === null) redisPort = port;
    }
    if (!redisPort) throw new Error("redis-server did not start (apt-get install -y redis-server)");

    consumerPort = await freePort();
    fs.writeFileSync(path.join(tmp, "webhook-secret"), keys.webhook + "\n");
    for (const id of ["lastseen-1", "lastseen-2"]) {
      const p = await start(`node ${id}`, BIN, [
        "--listen", "127.0.0.1:0", "--redis-url", `redis://127.0.0.1:${redisPort}/0`, "--node-id", id,
        "--heartbeat-ms", "1000", "--service-key", keys.service,
        "--webhook-url", `http://127.0.0.1:${consumerPort}/hooks/presence`,
        "--webhook-secret-file", path.join(tmp, "webhook-secret"), "--webhook-batch-ms", "50",
      ], { env: { ...process.env, RUST_LOG: "info" } }, /listening on http:\/\/(\S+)/);
      nodes.push({ id, proc: p, ws: `ws://${p.found}/ws`, http: `http://${p.found}` });
    }
    consumerEnv = {
      ...process.env,
      // The consumer's one dependency, pg, from this directory's node_modules.
      NODE_PATH: path.join(__dirname, "node_modules"),
      DATABASE_URL: `postgres://postgres@127.0.0.1:${pg.port}/postgres`,
      PRESENCE_URL: nodes[0].http, // node 2 dies below
      PRESENCE_SERVICE_KEY: keys.service,
      PRESENCE_WEBHOOK_SECRET: keys.webhook,
      HOST: "127.0.0.1",
      PORT: String(consumerPort),
      FEED_POLL_MS: "500",
    };
  });

  after(async () => {
    for (const d of devices.values()) d.ws?.terminate();
    if (pg) await pg.client.end().catch(() => {});
    // PostgreSQL's immediate shutdown (SIGQUIT) removes its shared memory; a SIGKILL would leave it.
    for (const p of procs) if (p.exit === null) p.child.kill(p.what === "postgres" ? "SIGQUIT" : "SIGKILL");
    await waitFor("every process to exit", () => procs.every((p) => p.exit !== null), 10_000).catch(() => {});
    fs.rmSync(tmp, { recursive: true, force: true });
    if (procs.pgDir) fs.rmSync(procs.pgDir, { recursive: true, force: true });
  });

  const consumers = [];
  async function startConsumer() {
    const p = await start(`consumer ${consumers.length + 1}`, process.execPath, [CONSUMER], { env: consumerEnv }, /listening on (http:\/\/\S+)/);
    consumers.push(p);
    return p;
  }

  // ---- Users: 12 churning, two devices each, on either node; 2 quiet ones on node 2 ----------

  const CHURNING = Array.from({ length: 12 }, (_, i) => `user${i}`);
  const QUIET = ["quiet0", "quiet1"];
  const USERS = [...CHURNING, ...QUIET];
  const devices = new Map(); // "user/device" -> {ws, open}
  const STATUSES = ["online", "away", "busy", "invisible"];
  const pick = (a) => a[Math.floor(Math.random() * a.length)];

  /** Connects `user`'s `device` to a random node; resolves once the server said hello. */
  function connect(user, device, status, node = pick(nodes.filter((n) => n.proc.exit === null))) {
    const key = `${user}/${device}`;
    const q = new URLSearchParams({ user, device, ...(status ? { status } : {}) });
    const ws = new WebSocket(`${node.ws}?${q}`);
    const d = { ws, ready: null };
    devices.set(key, d);
    d.ready = new Promise((resolve) => {
      ws.on("message", (m) => { if (JSON.parse(m).type === "hello") resolve(true); });
      ws.on("close", () => { if (devices.get(key) === d) devices.delete(key); resolve(false); });
      ws.on("error", () => {});
    });
    return d.ready;
  }

  /** One random step: a device connects, leaves (cleanly or dropped), or its user changes status. */
  async function step() {
    const user = pick(CHURNING);
    const key = `${user}/${pick(["phone", "web"])}`;
    const d = devices.get(key);
    if (!d) return connect(user, key.split("/")[1], Math.random() < 0.3 ? pick(STATUSES) : undefined);
    if (!(await d.ready)) return;
    const r = Math.random();
    if (r < 0.45) d.ws.send(JSON.stringify({ type: "status", status: pick(STATUSES), text: Math.random() < 0.5 ? "" : `t${Date.now() % 100}` }));
    else if (r < 0.85) d.ws.close();
    else d.ws.terminate(); // a dropped connection: no close frame
  }

  /** Steps for `ms` (8 steps in flight at a time). */
  async function churn(ms) {
    const until = Date.now() + ms;
    await Promise.all(Array.from({ length: 8 }, async () => {
      while (Date.now() < until) {
        await step();
        await sleep(10 + Math.random() * 30);
      }
    }));
  }

  async function serverRecords() {
    const res = await fetch(`${nodes[0].http}/api/presence/query`, {
      method: "POST",
      headers: { authorization: `Bearer ${keys.service}`, "content-type": "application/json" },
      body: JSON.stringify({ users: USERS }),
    });
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.view, "service");
    return new Map(body.presence.map((r) => [r.user, r]));
  }

  async function rows() {
    const { rows } = await pg.client.query("SELECT user_id, last_seen, status, seq FROM UserLastSeen");
    return new Map(rows.map((r) => [r.user_id, { status: r.status, last_seen: r.last_seen === null ? null : Number(r.last_seen) }]));
  }

  /**
   * Every user's row against the server's record: the same status, and for a user offline the
   * same last seen (the server shows none while a user is online; the row keeps the last one).
   */
  let lastDiff = "";
  async function equal() {
    const [server, db] = [await serverRecords(), await rows()];
    const diff = [];
    for (const user of USERS) {
      const s = server.get(user);
      const r = db.get(user);
      const want = { status: s.status, last_seen: s.status === "offline" ? s.last_seen : r?.last_seen ?? null };
      if (!r || r.status !== want.status || r.last_seen !== want.last_seen) {
        diff.push(`${user}: server ${JSON.stringify({ status: s.status, last_seen: s.last_seen })}, postgres ${JSON.stringify(r ?? null)}`);
      }
    }
    lastDiff = diff.join("\n");
    return diff.length === 0;
  }

  const feedLines = (p) => p.logs.filter((l) => /^feed: caught up/.test(l));

  test("Postgres ends equal to the server's last seen of every user", { timeout: 120_000 }, async () => {
    // Users come and go before the consumer ever ran: its first start reads the feed from the start.
    await Promise.all(CHURNING.map((u) => connect(u, "phone")));
    await Promise.all(QUIET.map((u) => connect(u, "phone", undefined, nodes[1])));
    await churn(2_000);
    const first = await startConsumer();
    assert.ok(feedLines(first).length > 0,
      `the first start wrote what happened before it from GET /api/events:\n${first.logs.join("\n")}`);
    await churn(3_000);

    // Killed in the middle of webhook deliveries; the users go on.
    first.child.kill("SIGKILL");
    await waitFor("the consumer to die", () => first.exit !== null);
    // The quiet users' last transitions, made by node 2 while the consumer is down: a status and
    // a departure each, and nothing after.
    const quiet = QUIET.map((u) => devices.get(`${u}/phone`).ws);
    quiet[0].send(JSON.stringify({ type: "status", status: "busy", text: "in a call" }));
    quiet[1].send(JSON.stringify({ type: "status", status: "invisible" }));
    await sleep(100);
    for (const ws of quiet) ws.close();
    await Promise.all([churn(2_000), waitFor("the quiet users to be offline", async () => {
      const s = await serverRecords();
      return QUIET.every((u) => s.get(u).status === "offline");
    })]);
    // And node 2 dies too, with the transitions it made while nobody took its webhooks: they are
    // recorded in Redis, not only in its memory. Its users' leases lapse; node 1 goes on.
    nodes[1].proc.child.kill("SIGKILL");
    await waitFor("node 2 to die", () => nodes[1].proc.exit !== null);
    await churn(3_000);

    const second = await startConsumer();
    // Before it took any webhook, it caught up from the cursor it had stored.
    assert.ok(feedLines(second).length > 0,
      `the restart wrote what it missed from GET /api/events:\n${second.logs.join("\n")}`);
    await churn(2_000);

    // Some users online (any status), some offline: statuses and last seen agree.
    await waitFor("every device to be open or gone", () => [...devices.values()].every((d) => d.ws.readyState === WebSocket.OPEN));
    await waitFor("Postgres to equal the server (users online and offline)", equal, DEADLINE_MS, () => `:\n${lastDiff}`);
    const mixed = await serverRecords();
    assert.ok([...mixed.values()].some((r) => r.status !== "offline"), "some users are online at the end");

    // Everyone leaves: every row is offline, at the server's last seen.
    for (const d of devices.values()) d.ws.close();
    await waitFor("every user to be offline", async () => [...(await serverRecords()).values()].every((r) => r.status === "offline"));
    await waitFor("Postgres to equal the server (everyone offline)", equal, DEADLINE_MS, () => `:\n${lastDiff}`);
    const db = await rows();
    for (const [user, r] of await serverRecords()) assert.deepEqual(db.get(user), { status: "offline", last_seen: r.last_seen }, user);
    const { rows: [cursor] } = await pg.client.query("SELECT cursor FROM presence_feed_cursor");
    assert.notEqual(cursor.cursor, "", "the consumer stored a feed cursor");
  });

  test("a webhook: the signature first, then only a larger seq changes a row", async () => {
    const running = consumers.find((p) => p.exit === null) ?? (await startConsumer());
    assert.ok(running);
    const url = `http://127.0.0.1:${consumerPort}/hooks/presence`;
    const event = (seq, type, status, lastSeen) => ({ id: `mallory:${seq}`, type, at: seq, user: "mallory", status, devices: status === "offline" ? 0 : 1, last_seen: lastSeen, seq });
    const post = (events, sig) => {
      const body = JSON.stringify({ node: "test", events });
      const t = Math.floor(Date.now() / 1000);
      const signed = `t=${t},v1=${crypto.createHmac("sha256", keys.webhook).update(`${t}.${body}`).digest("hex")}`;
      return fetch(url, { method: "POST", body, headers: { "presence-signature": sig ? sig(body, signed) : signed } }).then((r) => r.status);
    };
    const mallory = async () => (await rows()).get("mallory") ?? null;
    const now = Math.floor(Date.now() / 1000);
    const stale = (body) => `t=${now - 301},v1=${crypto.createHmac("sha256", keys.webhook).update(`${now - 301}.${body}`).digest("hex")}`;
    const flipped = (_, signed) => signed.replace(/.$/, (c) => (c === "0" ? "1" : "0"));
    for (const sig of [() => "", flipped, stale, () => `t=${now},v1=00`]) {
      assert.equal(await post([event(9, "online", "busy", 5)], sig), 401);
    }
    assert.equal(await mallory(), null, "nothing written from a refused batch");

    assert.equal(await post([event(9, "online", "busy", 5)]), 204);
    assert.deepEqual(await mallory(), { status: "busy", last_seen: 5 });
    // A repeat, an older event, a room event: nothing changes.
    assert.equal(await post([event(9, "online", "busy", 5), event(8, "offline", "offline", 4)]), 204);
    assert.equal(await post([{ id: "r:1", type: "room_joined", at: 1, room: "r", user: "mallory", users: 1, devices: 1, seq: 99 }]), 204);
    assert.deepEqual(await mallory(), { status: "busy", last_seen: 5 });
    // Out of order within a batch: the larger seq wins.
    assert.equal(await post([event(11, "offline", "offline", 1234), event(10, "status", "away", 5)]), 204);
    assert.deepEqual(await mallory(), { status: "offline", last_seen: 1234 });
  });
});
