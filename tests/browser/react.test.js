// Browser test of presence-client/react: docs/examples/react-chat.jsx, as the
// docs show it, bundled with esbuild (through the package's exports, as an
// app gets it) and run in real headless Chromium against a real redis-server
// and two real presence-server nodes. Alice and bob share a room: members,
// typing and its clearing, a status change, alice's node SIGKILLed and her
// hooks back on the other node with the same members, and unmounting the
// room leaving it. Then components that count their renders show that frames
// about another room or user re-render nothing, and a JWT node's token rooms
// take useRoom's getToken for their room and the client's for the others.
//
//   cargo build && (cd tests/browser && npm ci && npm test)
//
// Environment: PRESENCE_SERVER_BIN, CHROMIUM_PATH (see harness.js).
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const crypto = require("node:crypto");
const fs = require("node:fs");
const http = require("node:http");
const os = require("node:os");
const path = require("node:path");
const esbuild = require("esbuild");
const { chromium } = require("playwright-core");
const { ROOT, CHROMIUM, CHROMIUM_ARGS, DEADLINE_MS, until, Harness } = require("./harness");

const EXAMPLE = path.join(ROOT, "docs", "examples", "react-chat.jsx");

const PAGE = `<!doctype html><meta charset="utf-8"><title>react</title><div id="root"></div><script src="/app.js"></script>`;

const h = new Harness(fs.mkdtempSync(path.join(os.tmpdir(), "presence-react-")));
let browser = null;
let bundle = null;
/** The test's own web server, serving the page and its bundle from loopback (as a dev server would). */
let web = null;
let ORIGIN = null;
const nodes = [];
const pageLogs = [];

/** Runs one step; a failure names the step and carries the logs. */
async function step(name, fn) {
  try {
    return await fn();
  } catch (e) {
    const tail = (lines, n) => lines.slice(-n).join("\n");
    throw new Error(`step "${name}" failed: ${e.message}\n${h.nodeLogs(60)}\n--- browser console ---\n${tail(pageLogs, 60)}`, { cause: e });
  }
}

before(async () => {
  // The example's imports resolve from this package's node_modules, where
  // presence-client is a link to clients/js; React is pinned to this
  // package's copy (clients/js has its own, for its types test): one React.
  const modules = path.join(__dirname, "node_modules");
  const built = await esbuild.build({
    entryPoints: [path.join(__dirname, "react-app.jsx")],
    bundle: true,
    write: false,
    format: "iife",
    jsx: "automatic",
    nodePaths: [modules],
    alias: { "react": path.join(modules, "react"), "react-dom": path.join(modules, "react-dom") },
    define: { "process.env.NODE_ENV": '"development"' },
    logLevel: "silent",
  });
  bundle = built.outputFiles[0].text;
  web = http.createServer((req, res) => {
    const js = req.url === "/app.js";
    res.writeHead(200, { "content-type": js ? "text/javascript" : "text/html" });
    res.end(js ? bundle : PAGE);
  });
  await new Promise((resolve) => web.listen(0, "127.0.0.1", resolve));
  ORIGIN = `http://127.0.0.1:${web.address().port}`;
  await h.startRedis();
  for (const id of ["react-1", "react-2"]) nodes.push(await h.startNode(id, ["--allowed-origins", ORIGIN]));
  if (!fs.existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (or set CHROMIUM_PATH)`);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS, timeout: 60_000 });
});

after(async () => {
  if (browser) await browser.close().catch(() => {});
  h.stop();
  if (web) web.close();
});

const wsUrl = (n) => n.base.replace(/^http/, "ws") + "/ws";

/** Opens the bundled page in a fresh browser context with `query`. */
async function open(name, query) {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on("console", (m) => pageLogs.push(`[${name}] ${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => pageLogs.push(`[${name}] page error: ${e.message}`));
  await page.goto(`${ORIGIN}/?${query}`);
  return { context, page };
}

const query = (params) => new URLSearchParams(params.flatMap(([k, vs]) => [].concat(vs).map((v) => [k, v]))).toString();

/** Waits until the chat section of `page` lists exactly `users`, joined. */
async function expectMembers(page, users) {
  await until(`members ${users}`, DEADLINE_MS, async () => {
    const shown = await page.locator('.chat[data-joined="true"] .members li').evaluateAll((els) => els.map((e) => e.dataset.user));
    return shown.join(",") === users.join(",");
  });
}

test("two users in a room through the hooks: members, typing, status, a node killed, unmount", { timeout: 180_000 }, async () => {
  const [n1, n2] = nodes;
  // Each is on its own node first, and tries the other after a drop.
  const alice = await step("alice opens the page on node 1", () => open("alice", query([
    ["user", "alice"], ["device", "tab"], ["url", [wsUrl(n1), wsUrl(n2)]], ["contact", "bob"], ["room", "chat:1"],
  ])));
  await step("alice is in the room; her own callbacks on it keep working beside the hooks'", async () => {
    await expectMembers(alice.page, ["alice"]);
    await alice.page.evaluate(() => {
      const room = window.client.rooms.get("chat:1");
      window.seen = [];
      room.onJoin = (e) => window.seen.push(`join ${e.user}`);
      room.onLeave = (e) => window.seen.push(`leave ${e.user}`);
    });
  });
  const bob = await step("bob opens the page on node 2", () => open("bob", query([
    ["user", "bob"], ["device", "phone"], ["url", [wsUrl(n2), wsUrl(n1)]], ["contact", "alice"], ["room", "chat:1"],
  ])));
  const a = alice.page;
  const b = bob.page;

  await step("both see both in the room, and each other online", async () => {
    await expectMembers(a, ["alice", "bob"]);
    await expectMembers(b, ["alice", "bob"]);
    await a.locator('.contacts li[data-user="bob"][data-status="online"]').waitFor({ timeout: DEADLINE_MS });
    await b.locator('.contacts li[data-user="alice"][data-status="online"]').waitFor({ timeout: DEADLINE_MS });
    await a.locator(".here", { hasText: "2 here" }).waitFor({ timeout: DEADLINE_MS });
    assert.deepEqual(await a.evaluate(() => window.seen), ["join bob"]);
  });
  await step("bob types: alice sees it; bob sends: it clears", async () => {
    await b.locator(".chat input").pressSequentially("hi", { delay: 20 });
    await a.locator(".typing", { hasText: "bob is typing…" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await b.locator(".typing").textContent(), "", "bob is never listed as typing to himself");
    await b.locator(".chat button").click();
    await until("alice's typing line to clear", DEADLINE_MS, async () => (await a.locator(".typing").textContent()) === "");
  });
  await step("bob turns busy: his own record and alice's contact follow", async () => {
    await b.locator(".me select").selectOption("busy");
    await b.locator('.me[data-status="busy"]').waitFor({ timeout: DEADLINE_MS });
    await a.locator('.contacts li[data-user="bob"][data-status="busy"]').waitFor({ timeout: DEADLINE_MS });
  });
  await step("alice's node is killed: her hooks say so, and come back on node 2 with the same members", async () => {
    // Every value the chat's data-joined takes, in order (React may replace the element).
    await a.evaluate(() => {
      window.joinedSeen = [document.querySelector(".chat").dataset.joined];
      new MutationObserver(() => {
        const v = document.querySelector(".chat")?.dataset.joined;
        if (v && v !== window.joinedSeen.at(-1)) window.joinedSeen.push(v);
      }).observe(document.body, { subtree: true, childList: true, attributes: true });
    });
    n1.child.kill("SIGKILL");
    await until("alice's client to be open on node 2", DEADLINE_MS, () =>
      a.evaluate((url) => window.client.state === "open" && window.client.url === url, wsUrl(n2)));
    await expectMembers(a, ["alice", "bob"]);
    assert.deepEqual(await a.evaluate(() => window.joinedSeen), ["true", "false", "true"]);
    await a.locator('.contacts li[data-user="bob"][data-status="busy"]').waitFor({ timeout: DEADLINE_MS });
    await expectMembers(b, ["alice", "bob"]);
  });
  await step("alice leaves by unmounting the room: bob sees her go", async () => {
    await b.evaluate(() => {
      const room = window.client.rooms.get("chat:1");
      window.seen = [];
      room.onJoin = (e) => window.seen.push(`join ${e.user}`);
      room.onLeave = (e) => window.seen.push(`leave ${e.user}`);
    });
    await a.locator("button.toggle", { hasText: "Leave" }).click();
    await expectMembers(b, ["bob"]);
    assert.equal(await a.locator(".chat").count(), 0);
  });
  await step("alice mounts it again: bob sees her back", async () => {
    await a.locator("button.toggle", { hasText: "Join" }).click();
    await expectMembers(b, ["alice", "bob"]);
    await expectMembers(a, ["alice", "bob"]);
    // Her room's two components (and StrictMode's double mount) share one join: one leave, one join.
    assert.deepEqual(await b.evaluate(() => window.seen), ["leave alice", "join alice"]);
  });
  for (const p of [alice, bob]) await p.context.close();
});

test("frames about another room or another user re-render nothing", { timeout: 120_000 }, async () => {
  const n = nodes[1];
  const { context, page } = await step("dave opens the probes", () => open("dave", query([["probe", "1"], ["user", "dave"], ["url", wsUrl(n)]])));
  const probe = (sel) => page.locator(sel).first();
  await step("dave is in both rooms and knows carol's and bob's records", async () => {
    await probe('[data-room="room:a"][data-joined="true"][data-members="dave"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await probe('[data-room="room:b"][data-joined="true"][data-members="dave"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await probe('[data-user="carol"][data-status="offline"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await probe('[data-user="bob"]:not([data-status="unknown"])').waitFor({ state: "attached", timeout: DEADLINE_MS });
  });
  const renders = () => page.evaluate(() => ({ ...window.renders }));
  const before = await renders();
  await step("carol comes online, joins room:b, types and changes her state there", async () => {
    // carol is another client in the same page: only dave's client feeds the probes.
    await page.evaluate((url) => {
      const carol = new window.PresenceClient({ url, user: "carol", device: "laptop" });
      window.carol = carol;
      carol.connect();
      const room = carol.join("room:b", { state: { page: 1 } });
      room.onSync = () => { room.typing(); room.update({ page: 2 }); carol.setStatus("away"); };
    }, wsUrl(n));
    await probe('[data-room="room:b"][data-members="carol,dave"][data-typing="carol"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await probe('[data-user="carol"][data-status="away"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
  });
  await step("the room:a, occupancy and bob components did not render again", async () => {
    const now = await renders();
    assert.ok(now["room room:b"] > before["room room:b"], "room:b's component must have rendered carol");
    assert.ok(now["user carol"] > before["user carol"], "carol's component must have rendered her");
    for (const k of ["room room:a", "occupancy room:a", "user bob"]) assert.equal(now[k], before[k], `${k} rendered for frames not about it`);
  });
  await step("carol joins room:a: its components render; her typing there does not change the counts", async () => {
    await page.evaluate(() => {
      const room = window.carol.join("room:a");
      room.onSync = () => room.typing();
    });
    await probe('[data-room="room:a"][data-members="carol,dave"][data-typing="carol"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await probe('[data-occupancy="room:a"][data-users="2"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    const now = await renders();
    assert.ok(now["room room:a"] > before["room room:a"]);
    assert.equal(now["occupancy room:a"], before["occupancy room:a"] + 1, "one render for one change of the counts");
    assert.equal(now["user bob"], before["user bob"]);
  });
  await step("a user the app watched itself: a component mounted after its snapshot still gets the record", async () => {
    await page.evaluate(() => new Promise((resolve) => {
      window.client.onSnapshot = (records) => { if (records.some((r) => r.user === "erin")) resolve(); };
      window.client.watch(["erin"]);
    }));
    await page.evaluate(() => window.showUser("erin"));
    await probe('[data-user="erin"][data-status="offline"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    assert.equal(await page.evaluate(() => window.client.watched.has("erin")), true, "erin stays the app's");
  });
  await step("StrictMode mounts a room's only component twice: the others see one join and no leave", async () => {
    await page.evaluate(() => new Promise((resolve) => {
      const room = window.carol.join("room:c");
      window.carolSeen = [];
      room.onJoin = (e) => window.carolSeen.push(`join ${e.user}`);
      room.onLeave = (e) => window.carolSeen.push(`leave ${e.user}`);
      room.onSync = () => resolve();
    }));
    await page.evaluate(() => window.showRoom("room:c"));
    await probe('[data-room="room:c"][data-joined="true"][data-members="carol,dave"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await until("carol to hear of dave", DEADLINE_MS, () => page.evaluate(() => window.carolSeen.length > 0));
    // A stray leave and join would come right behind the first join: give them a round trip.
    await page.evaluate(() => new Promise((resolve) => {
      window.carol.rooms.get("room:c").onSignal = resolve;
      window.client.rooms.get("room:c").signal({ ping: true });
    }));
    assert.deepEqual(await page.evaluate(() => window.carolSeen), ["join dave"]);
  });
  await context.close();
});

/** An HS256 JWT with `claims`, signed with `secret`, valid for ten minutes. */
function jwt(claims, secret) {
  const part = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part({ exp: Math.floor(Date.now() / 1000) + 600, ...claims })}`;
  return `${unsigned}.${crypto.createHmac("sha256", secret).update(unsigned).digest("base64url")}`;
}

test("token rooms: useRoom's getToken for its room, the client's for the others; useSelf waits for hello, and follows autoAway", { timeout: 120_000 }, async () => {
  const secret = crypto.randomBytes(32).toString("hex");
  const n = await step("a JWT node with token rooms starts", () =>
    h.startNode("react-jwt", ["--auth", "jwt", "--jwt-secret", secret, "--room-policy", "doc:*=token", "--allowed-origins", ORIGIN]));
  const { context, page } = await step("fay opens the page with a connection token", () =>
    open("fay", query([["jwt", "1"], ["token", jwt({ sub: "fay" }, secret)], ["url", wsUrl(n)]])));
  await step("fay's rooms join with the right tokens; one for another room is refused", async () => {
    await page.evaluate(({ hook, own }) => {
      window.hookTokens = hook;
      window.clientTokens = own;
      window.showRooms(["doc:7", "doc:9"], ["doc:8"]);
    }, {
      // doc:7 through useRoom's getToken, doc:8 through the client's; doc:9's names another room.
      hook: { "doc:7": jwt({ sub: "fay", room: "doc:7" }, secret), "doc:9": jwt({ sub: "fay", room: "doc:7" }, secret) },
      own: { "doc:8": jwt({ sub: "fay", room: "doc:8" }, secret), "doc:7": "not.a.token" },
    });
    for (const id of ["doc:7", "doc:8"]) {
      await page.locator(`[data-room="${id}"][data-joined="true"][data-members="fay"]`).waitFor({ state: "attached", timeout: DEADLINE_MS });
    }
    await page.locator('[data-room="doc:9"][data-error="forbidden"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await page.locator('[data-self="fay"][data-status="online"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
  });
  await step("useSelf's idle follows the client's autoAway: away when idle, online on activity", async () => {
    await page.locator('[data-self="fay"][data-idle="false"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await page.evaluate(() => window.client.setAutoAway({ idleMs: 300 }));
    await page.locator('[data-self="fay"][data-idle="true"][data-status="away"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
    await page.mouse.move(100, 100);
    await page.mouse.move(140, 160);
    await page.locator('[data-self="fay"][data-idle="false"][data-status="online"]').waitFor({ state: "attached", timeout: DEADLINE_MS });
  });
  await context.close();
});

test("docs/client.md shows docs/examples/react-chat.jsx byte for byte", () => {
  const re = /<!-- example: docs\/examples\/react-chat\.jsx -->\n```jsx\n([\s\S]*?)```\n/;
  const m = re.exec(fs.readFileSync(path.join(ROOT, "docs", "client.md"), "utf8"));
  assert.ok(m, "docs/client.md has no <!-- example: docs/examples/react-chat.jsx --> block");
  assert.equal(m[1], fs.readFileSync(EXAMPLE, "utf8"), "the doc's block differs from the file");
});
