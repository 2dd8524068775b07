// lastseen-consumer.js: keeps a PostgreSQL table UserLastSeen(user_id, last_seen, status) equal
// to presence-server's last seen, and misses nothing. The webhook brings each transition at once;
// the event feed (GET /api/events) brings what happened while this process was down, from the
// cursor it stores in the same transaction as the rows it wrote. Node 20+, one dependency: pg.
//
//   npm install pg@8
//   DATABASE_URL=postgres://app@db/app PRESENCE_URL=http://presence:8080 \
//   PRESENCE_SERVICE_KEY=... PRESENCE_WEBHOOK_SECRET=... PORT=3001 node lastseen-consumer.js
//
// with the nodes started with --service-key (the same key), --webhook-secret-file (the same
// secret) and --webhook-url http://<this host>:3001/hooks/presence.
"use strict";
const http = require("node:http");
const crypto = require("node:crypto");
const { Pool } = require("pg");

const env = (name, fallback = "") => (process.env[name] || fallback).trim();
const config = {
  host: env("HOST", "0.0.0.0"),
  port: Number(env("PORT", "3001")),
  presence: env("PRESENCE_URL", "http://127.0.0.1:8080"), // any node
  serviceKey: env("PRESENCE_SERVICE_KEY"), // the nodes' --service-key
  webhookSecret: env("PRESENCE_WEBHOOK_SECRET"), // the nodes' --webhook-secret(-file)
  pollMs: Number(env("FEED_POLL_MS", "10000")), // how often the feed is read besides
};
const db = new Pool({ connectionString: env("DATABASE_URL") || undefined }); // or PGHOST, PGUSER...

// An empty cursor: none stored yet, so the first start reads the feed from its oldest event.
const SCHEMA = `
CREATE TABLE IF NOT EXISTS UserLastSeen (
  user_id   text PRIMARY KEY,
  last_seen bigint,         -- epoch ms the user last went offline (kept while online); null: never
  status    text NOT NULL,  -- online, away, busy, invisible or offline
  seq       bigint NOT NULL -- the user's presence seq of the transition this row shows
);
CREATE TABLE IF NOT EXISTS presence_feed_cursor (
  id     boolean PRIMARY KEY DEFAULT true CHECK (id),
  cursor text NOT NULL
);
INSERT INTO presence_feed_cursor (cursor) VALUES ('') ON CONFLICT (id) DO NOTHING;`;

/** Runs `fn(client)` in one transaction on one connection of the pool. */
async function transaction(fn) {
  const client = await db.connect();
  try {
    await client.query("BEGIN");
    const result = await fn(client);
    await client.query("COMMIT");
    return result;
  } catch (err) {
    await client.query("ROLLBACK").catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

/**
 * Writes the events that set last seen; returns how many rows changed. Any order, any repeat:
 * a row only moves to a larger seq, so a late or repeated event changes nothing.
 */
async function upsert(client, events) {
  const latest = new Map(); // user -> its event of the largest seq
  for (const e of events) {
    if (e.type !== "online" && e.type !== "offline" && e.type !== "status") continue; // rooms
    if (!(latest.get(e.user)?.seq >= e.seq)) latest.set(e.user, e);
  }
  // Sorted by user: concurrent transactions lock their rows in the same order (no deadlock).
  const rows = [...latest.values()].sort((a, b) => (a.user < b.user ? -1 : a.user > b.user ? 1 : 0));
  if (rows.length === 0) return 0;
  const { rowCount } = await client.query(
    `INSERT INTO UserLastSeen (user_id, last_seen, status, seq)
     SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[])
     ON CONFLICT (user_id) DO UPDATE
       SET last_seen = EXCLUDED.last_seen, status = EXCLUDED.status, seq = EXCLUDED.seq
       WHERE UserLastSeen.seq < EXCLUDED.seq`,
    [rows.map((e) => e.user), rows.map((e) => e.last_seen), rows.map((e) => e.status), rows.map((e) => e.seq)],
  );
  return rowCount;
}

// ---- Pull: the feed, from the stored cursor ----------------------------------------------

/** Reads the feed page by page until it is caught up; each page and its cursor in one transaction. */
async function catchUp() {
  const seen = { events: 0, changed: 0 };
  for (;;) {
    const page = await transaction(async (client) => {
      // FOR UPDATE: two consumers never apply the same page at once nor move the cursor back.
      const { rows } = await client.query("SELECT cursor FROM presence_feed_cursor WHERE id FOR UPDATE");
      const url = new URL("/api/events", config.presence);
      url.searchParams.set("limit", "1000");
      if (rows[0].cursor) url.searchParams.set("cursor", rows[0].cursor);
      const res = await fetch(url, {
        headers: { authorization: `Bearer ${config.serviceKey}` },
        signal: AbortSignal.timeout(10_000),
      });
      if (!res.ok) throw new Error(`GET /api/events: ${res.status} ${(await res.text()).slice(0, 200)}`);
      const body = await res.json();
      if (body.lost > 0) console.warn(`feed: ${body.lost} events were lost before this read`);
      seen.changed += await upsert(client, body.events);
      await client.query("UPDATE presence_feed_cursor SET cursor = $1 WHERE id", [body.next_cursor]);
      return body;
    });
    seen.events += page.events.length;
    if (page.events.length === 0) return seen; // caught up
  }
}

let reading = null; // the catch-up under way: one at a time
function poll() {
  reading ??= catchUp()
    .then(({ events, changed }) => {
      // Rows the feed changed: what no webhook had brought (yet).
      if (changed > 0) console.log(`feed: caught up, ${events} events read, ${changed} rows changed`);
    })
    .catch((err) => console.error(`feed: ${err.message}; again within ${config.pollMs} ms`))
    .finally(() => {
      reading = null;
    });
  return reading;
}

// ---- Push: the webhook ---------------------------------------------------------------------

/** Presence-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">, 5 minutes' tolerance. */
function signedByPresence(header, rawBody, toleranceSec = 300) {
  const p = Object.fromEntries(String(header || "").split(",").map((kv) => kv.split("=", 2)));
  if (!/^\d+$/.test(p.t || "") || Math.abs(Date.now() / 1000 - Number(p.t)) > toleranceSec) return false;
  const want = Buffer.from(crypto.createHmac("sha256", config.webhookSecret).update(`${p.t}.`).update(rawBody).digest("hex"));
  const got = Buffer.from(String(p.v1 || ""));
  return got.length === want.length && crypto.timingSafeEqual(got, want);
}

function readBody(req, limit = 8 << 20) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => {
      size += c.length;
      if (size > limit) req.destroy(new Error("body too large"));
      else chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

async function hook(req, res) {
  const raw = await readBody(req);
  // The signature over the raw bytes, before anything else.
  if (!signedByPresence(req.headers["presence-signature"], raw)) return res.writeHead(401).end();
  const batch = JSON.parse(raw);
  // Events the server had to drop (beyond its retention): read what the feed still has.
  if (batch.lost > 0) {
    console.warn(`webhook: ${batch.lost} events were lost before delivery`);
    poll();
  }
  const changed = await transaction((client) => upsert(client, batch.events));
  // Only now, committed: a 2xx takes the batch. A failure above answers 500 and it comes again.
  res.writeHead(204).end();
  return changed;
}

const server = http.createServer((req, res) => {
  const { pathname } = new URL(req.url, "http://x");
  if (req.method !== "POST" || pathname !== "/hooks/presence") return res.writeHead(404).end();
  hook(req, res).catch((err) => {
    console.error(`webhook: ${err.message}`);
    if (!res.headersSent) res.writeHead(err instanceof SyntaxError ? 400 : 500).end();
  });
});

async function main() {
  if (!config.serviceKey || !config.webhookSecret) throw new Error("set PRESENCE_SERVICE_KEY and PRESENCE_WEBHOOK_SECRET");
  await db.query(SCHEMA);
  await poll(); // what happened while we were down, before taking new webhooks
  server.listen(config.port, config.host, () => {
    const { address, port } = server.address();
    console.log(`lastseen-consumer listening on http://${address}:${port}/hooks/presence`);
  });
  setInterval(poll, config.pollMs); // and the feed now and then: nothing a webhook missed stays missed
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
