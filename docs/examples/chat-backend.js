// chat-backend.js: the app's side of presence-server's rooms, for the deployment in
// docs/rooms-guide.md. Node 20+, no dependencies: node:http, node:crypto and fetch.
//
//   POST   /presence/room-join            the node asks: may this user join this team:* room?
//   GET    /presence/room-token?room=...  a room token for a doc:* room (the client's getToken)
//   PUT    /rooms/{room}                  {"members":[...]}: create or change a room's members
//   DELETE /rooms/{room}/members/{user}   take a user out of a room, at once
//
// A Map stands in for the app's database, and the caller's connection token for its
// sign-in (userOf). Run: PRESENCE_ADMIN_URL=... PRESENCE_ADMIN_KEY=... PRESENCE_JWT_SECRET=...
// PRESENCE_ROOM_JOIN_SECRET=... PORT=3000 node chat-backend.js
"use strict";
const http = require("node:http");
const crypto = require("node:crypto");

const env = (name) => (process.env[name] || "").trim();
const config = {
  port: Number(env("PORT") || 3000),
  presence: env("PRESENCE_ADMIN_URL") || "http://127.0.0.1:9090", // the node's --internal-listen
  adminKey: env("PRESENCE_ADMIN_KEY"), // the node's --admin-key
  jwtSecret: env("PRESENCE_JWT_SECRET"), // the node's --jwt-secret (file)
  joinSecret: env("PRESENCE_ROOM_JOIN_SECRET"), // the node's --room-join-secret (file)
};

// The app's database: who may be in which room (chat:*, doc:* and team:* alike).
const rooms = new Map(); // room id -> Set of user ids

// ---- HS256 JWTs: room tokens out, connection tokens in ------------------------------------

function signJwt(claims, secret = config.jwtSecret) {
  const part = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}`;
  return `${unsigned}.${crypto.createHmac("sha256", secret).update(unsigned).digest("base64url")}`;
}

/** The claims of a valid, unexpired HS256 token signed with `secret`; null otherwise. */
function verifyJwt(token, secret = config.jwtSecret) {
  const [head, body, sig = ""] = String(token).split(".");
  const want = crypto.createHmac("sha256", secret).update(`${head}.${body}`).digest();
  const got = Buffer.from(sig, "base64url");
  if (got.length !== want.length || !crypto.timingSafeEqual(got, want)) return null;
  try {
    const header = JSON.parse(Buffer.from(head, "base64url"));
    const claims = JSON.parse(Buffer.from(body, "base64url"));
    if (header.alg !== "HS256" || !(claims.exp * 1000 > Date.now())) return null;
    return claims;
  } catch {
    return null;
  }
}

/** The signed-in user. Your app has its own sign-in; here: the user's connection token. */
function userOf(req) {
  const bearer = /^Bearer (\S+)$/.exec(req.headers.authorization || "");
  const claims = bearer && verifyJwt(bearer[1]);
  // A room token names a user too: it is not a sign-in.
  return claims && typeof claims.sub === "string" && !("room" in claims) ? claims.sub : null;
}

// ---- 1. The proxy question (team:* rooms) -------------------------------------------------

/** Presence-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">, 5 minutes' tolerance. */
function signedByPresence(header, rawBody, toleranceSec = 300) {
  const p = Object.fromEntries(String(header || "").split(",").map((kv) => kv.split("=", 2)));
  if (!/^\d+$/.test(p.t || "") || Math.abs(Date.now() / 1000 - Number(p.t)) > toleranceSec) return false;
  const want = Buffer.from(crypto.createHmac("sha256", config.joinSecret).update(`${p.t}.`).update(rawBody).digest("hex"));
  const got = Buffer.from(String(p.v1 || ""));
  return got.length === want.length && crypto.timingSafeEqual(got, want);
}

async function roomJoin(req, res) {
  const raw = await readBody(req);
  // The signature before anything else: nobody but the nodes may ask.
  if (!signedByPresence(req.headers["presence-signature"], raw)) return send(res, 401, { error: "bad signature" });
  const { user, room } = JSON.parse(raw); // also "device" and "state"
  const allow = rooms.get(room)?.has(user) === true;
  // {"allow":true,"state":{...}} would also set the device's first state (the device may change it).
  // A refusal goes without Cache-Control: the node keeps none, so a user added later gets in.
  send(res, 200, { allow });
}

// ---- 2. Room tokens (doc:* rooms) ---------------------------------------------------------

function roomToken(req, res, url) {
  const user = userOf(req);
  const room = url.searchParams.get("room") || "";
  if (!user) return send(res, 401, { error: "sign in first" });
  if (!room.startsWith("doc:") || !rooms.get(room)?.has(user)) return send(res, 403, { error: `no access to ${room}` });
  // One user, one room, five minutes: the client asks again before it expires.
  const token = signJwt({ sub: user, room, exp: Math.floor(Date.now() / 1000) + 300 });
  res.writeHead(200, { "content-type": "text/plain", "cache-control": "no-store" }).end(token);
}

// ---- 3. Members: the app changes a room, the server follows -------------------------------

async function putRoom(req, res, room) {
  const user = userOf(req);
  const { members } = JSON.parse(await readBody(req));
  if (!Array.isArray(members) || !members.every((m) => typeof m === "string")) return send(res, 400, { error: "members: a list of user ids" });
  const before = rooms.get(room);
  // Only a member changes a room; whoever creates one must be in it.
  if (!user || !(before ? before.has(user) : members.includes(user))) return send(res, 403, { error: `not a member of ${room}` });
  rooms.set(room, new Set(members));
  if (room.startsWith("chat:")) {
    // --room-policy members: the server keeps the list; whoever is taken off it leaves at once.
    await inOrder(room, () => presence("PUT", `/api/rooms/${enc(room)}/members`, { users: [...rooms.get(room)] }));
  } else {
    for (const gone of [...(before || [])].filter((m) => !members.includes(m))) await revoke(room, gone);
  }
  send(res, 200, { room, members });
}

async function removeMember(req, res, room, gone) {
  const user = userOf(req);
  if (!user || !rooms.get(room)?.has(user)) return send(res, 403, { error: `not a member of ${room}` });
  rooms.get(room).delete(gone); // first: no proxy answer and no room token lets it back
  await revoke(room, gone);
  send(res, 200, { room, removed: gone });
}

/** Every device of `user` leaves `room` now, on every node; under members it is off the list. */
const revoke = (room, user) => inOrder(room, () => presence("DELETE", `/api/rooms/${enc(room)}/members/${enc(user)}`));

/** The admin API (admin key). Throws unless 2xx: the caller answers 502 and the app retries. */
async function presence(method, path, body) {
  const r = await fetch(config.presence + path, {
    method,
    headers: { authorization: `Bearer ${config.adminKey}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`presence-server: ${method} ${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

// Calls about one room go one at a time, in the order of the changes, so that the server
// ends with the last list even when two changes overlap.
const queues = new Map();
function inOrder(room, call) {
  const next = (queues.get(room) || Promise.resolve()).catch(() => {}).then(call);
  queues.set(room, next);
  next.catch(() => {}).finally(() => queues.get(room) === next && queues.delete(room));
  return next;
}

// ---- HTTP ---------------------------------------------------------------------------------

const enc = encodeURIComponent;
const send = (res, status, body) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));

function readBody(req, limit = 64 * 1024) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => ((size += c.length) > limit ? req.destroy(new Error("body too large")) : chunks.push(c)));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

async function handle(req, res) {
  const url = new URL(req.url, "http://backend");
  const p = url.pathname.split("/").map(decodeURIComponent); // "/rooms/chat:7" -> ["", "rooms", "chat:7"]
  if (req.method === "POST" && url.pathname === "/presence/room-join") return roomJoin(req, res);
  if (req.method === "GET" && url.pathname === "/presence/room-token") return roomToken(req, res, url);
  if (req.method === "PUT" && p.length === 3 && p[1] === "rooms") return putRoom(req, res, p[2]);
  if (req.method === "DELETE" && p.length === 5 && p[1] === "rooms" && p[3] === "members") return removeMember(req, res, p[2], p[4]);
  send(res, 404, { error: "no such route" });
}

function createBackend() {
  return http.createServer((req, res) =>
    Promise.resolve()
      .then(() => handle(req, res))
      .catch((e) => {
        if (res.headersSent) return;
        const bad = e instanceof SyntaxError || e instanceof URIError;
        send(res, bad ? 400 : 502, { error: String(e.message || e) });
      }));
}

module.exports = { createBackend, signJwt, verifyJwt, signedByPresence, rooms, config };

if (require.main === module) {
  for (const k of ["adminKey", "jwtSecret", "joinSecret"]) if (!config[k]) throw new Error(`${k} is not set: see the top of this file`);
  const server = createBackend().listen(config.port, env("HOST") || "127.0.0.1", () =>
    console.log(`chat backend listening on http://${server.address().address}:${server.address().port}`));
}
