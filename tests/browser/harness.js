// What the browser tests share: a real redis-server (the repo's redis.conf, a
// random port) and real presence-server nodes against it, each with its log
// kept for failure messages, and waits with deadlines.
"use strict";

const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const path = require("node:path");

const ROOT = path.resolve(__dirname, "..", "..");
const BIN = process.env.PRESENCE_SERVER_BIN || path.join(ROOT, "target", "debug", "presence-server");
const CHROMIUM = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
/** How long any expected change may take to show; generous for a busy CI machine. */
const DEADLINE_MS = 20_000;
/** Chromium's flags for the tests: headless, and nothing that talks to the network by itself. */
const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

/** A port free on loopback right now. */
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

/** Resolves when `check()` resolves true, rejects with `what` after `ms`. */
async function until(what, ms, check) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** True when a Redis server answers PING on `port`. */
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

/** Redis and nodes of one test file, under the temporary directory `tmp`. */
class Harness {
  constructor(tmp) {
    this.tmp = tmp;
    /** { child, port } once started. */
    this.redis = null;
    /** { id, child, base, logs } of every node started. */
    this.nodes = [];
  }

  redisLog() {
    try { return fs.readFileSync(path.join(this.tmp, "redis.log"), "utf8"); } catch { return "(no redis log)"; }
  }

  nodeLogs(lines) {
    if (!this.nodes.length) return "(no node started)";
    return this.nodes.map((n) => `--- presence-server ${n.id} log (last ${lines} lines) ---\n` + n.logs.slice(-lines).join("\n")).join("\n");
  }

  async startRedis() {
    const tmp = this.tmp;
    // The free port may be taken by a parallel test before redis binds it: try a few.
    for (let i = 0; i < 5; i++) {
      const port = await freePort();
      const child = spawn("redis-server", [
        path.join(ROOT, "redis.conf"), "--port", String(port), "--bind", "127.0.0.1",
        "--dir", tmp, "--logfile", path.join(tmp, "redis.log"), "--appendonly", "no",
      ], { stdio: "ignore" });
      let dead = false;
      let spawnError = null;
      child.once("exit", () => { dead = true; });
      child.once("error", (e) => { spawnError = e; });
      try {
        await until("redis-server to answer PING", DEADLINE_MS, async () => {
          if (spawnError) throw new Error(`cannot run redis-server (apt-get install -y redis-server): ${spawnError.message}`);
          return dead || (await pings(port));
        });
      } catch (e) {
        child.kill("SIGKILL");
        throw new Error(`${e.message}\n${this.redisLog()}`);
      }
      if (!dead) {
        this.redis = { child, port };
        return this.redis;
      }
    }
    throw new Error(`redis-server did not start on any of 5 ports:\n${this.redisLog()}`);
  }

  /** Starts a node against the harness's Redis and waits for its "listening on" line. */
  async startNode(id, extra = [], listen = "127.0.0.1:0") {
    if (!fs.existsSync(BIN)) throw new Error(`${BIN} is missing: run \`cargo build\` first (or set PRESENCE_SERVER_BIN)`);
    const child = spawn(BIN, [
      "--listen", listen,
      "--redis-url", `redis://127.0.0.1:${this.redis.port}/0`,
      "--node-id", id,
      "--heartbeat-ms", "1000",
      ...extra,
    ], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, RUST_LOG: "presence_server=debug,info" } });
    const logs = [];
    const n = { id, child, logs, base: null };
    this.nodes.push(n);
    let pending = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d) => {
      pending += d;
      const lines = pending.split("\n");
      pending = lines.pop();
      for (const line of lines) {
        logs.push(line);
        const m = line.match(/listening on (http:\/\/\S+)/);
        if (m) n.base = m[1];
      }
    });
    let exit = null;
    child.once("exit", (code, sig) => { exit = `exited with ${code ?? sig}`; });
    await until("presence-server to log \"listening on\"", DEADLINE_MS, () => {
      if (exit) throw new Error(`presence-server ${id} ${exit} before listening:\n${logs.join("\n")}`);
      return n.base !== null;
    });
    return n;
  }

  /** Kills what is still running and removes the temporary directory. */
  stop() {
    for (const p of [...this.nodes, this.redis]) {
      if (p && p.child.exitCode === null) p.child.kill("SIGKILL");
    }
    fs.rmSync(this.tmp, { recursive: true, force: true });
  }
}

module.exports = { ROOT, BIN, CHROMIUM, CHROMIUM_ARGS, DEADLINE_MS, freePort, until, pings, Harness };
