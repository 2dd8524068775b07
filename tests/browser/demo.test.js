// Browser test of the demo page: a real redis-server (the repo's redis.conf,
// random port), a real presence-server node (target/debug/presence-server,
// built by `cargo build` first) and real headless Chromium driven by
// playwright-core. Alice watches her contacts while bob, carol and dave sign
// in from their own browser contexts; alice's dot for bob must turn green,
// yellow (auto-away), green again, red (busy), grey (invisible), red again
// and grey (tab closed).
//
//   cargo build && (cd tests/browser && npm ci && npm test)
//
// Environment: PRESENCE_SERVER_BIN (default target/debug/presence-server),
// CHROMIUM_PATH (default /usr/bin/chromium), ARTIFACTS_DIR (default artifacts/).
// Every wait has a deadline; nothing sleeps and hopes.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { chromium } = require("playwright-core");
const { ROOT, CHROMIUM, CHROMIUM_ARGS, DEADLINE_MS, freePort, until, Harness } = require("./harness");

const ARTIFACTS = process.env.ARTIFACTS_DIR || path.join(ROOT, "artifacts");
/** Colours of the dots, as the page's CSS defines them (light scheme). */
const COLOURS = {
  online: "rgb(31, 157, 85)",
  away: "rgb(217, 154, 6)",
  busy: "rgb(217, 48, 37)",
  offline: "rgb(139, 147, 161)",
};

const h = new Harness(fs.mkdtempSync(path.join(os.tmpdir(), "presence-browser-")));
let node = null; // the first node: serves the pages
let browser = null;
const pageLogs = []; // console and page errors of every page, for failure messages

/** Everything that helps explain a failure. */
function diagnostics() {
  const tail = (s, n) => s.split("\n").slice(-n).join("\n");
  return [
    h.nodeLogs(80),
    "--- redis log (last 20 lines) ---", tail(h.redisLog(), 20),
    "--- browser console ---", tail(pageLogs.join("\n"), 60),
  ].join("\n");
}

/** Opens the demo page in a fresh browser context (its own storage: a separate person). */
async function openAs(user, query, base = node.base) {
  const context = await browser.newContext({ viewport: { width: 1120, height: 780 }, colorScheme: "light", locale: "en-US" });
  const page = await context.newPage();
  page.on("console", (m) => pageLogs.push(`[${user}] ${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => pageLogs.push(`[${user}] page error: ${e.message}`));
  await page.goto(`${base}/?user=${user}&${query}`);
  await page.locator('#state[data-state="open"]').waitFor({ timeout: DEADLINE_MS });
  return { context, page };
}

/** Waits until `page` shows `user` with `status`, and checks the dot's colour. */
async function expectStatus(page, user, status) {
  const row = page.locator(`#contacts li[data-user="${user}"][data-status="${status}"]`);
  await row.waitFor({ timeout: DEADLINE_MS });
  const colour = await row.locator(".dot").evaluate((el) => getComputedStyle(el).backgroundColor);
  assert.equal(colour, COLOURS[status], `${user}'s dot should be the ${status} colour`);
  return row;
}

/** Runs one step; a failure names the step and carries the logs. */
async function step(name, fn) {
  try {
    return await fn();
  } catch (e) {
    throw new Error(`step "${name}" failed: ${e.message}\n${diagnostics()}`, { cause: e });
  }
}

before(async () => {
  await h.startRedis();
  node = await h.startNode("browser-1");
  if (!fs.existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (or set CHROMIUM_PATH)`);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    // playwright-core gives each launch a fresh temporary user-data-dir.
    // presence.test: a host name the dev-auth node does not answer to (its 403 test).
    args: [...CHROMIUM_ARGS, "--host-resolver-rules=MAP presence.test 127.0.0.1"],
    timeout: 60_000,
  });
});

after(async () => {
  if (browser) await browser.close().catch(() => {});
  h.stop();
});

test("dots follow other users through online, away, busy and offline", { timeout: 180_000 }, async () => {
  const alice = await step("alice signs in", () => openAs("alice", "device=laptop&watch=bob,carol,dave,erin"));
  const a = alice.page;

  await step("bob starts grey (never seen)", async () => {
    const row = await expectStatus(a, "bob", "offline");
    assert.match(await row.textContent(), /never seen/);
  });

  const bob = await step("bob signs in", () => openAs("bob", "device=phone&watch=alice&idle=300"));
  const b = bob.page;
  await step("bob's dot turns green for alice", () => expectStatus(a, "bob", "online"));
  await step("alice sees bob's device count", async () => {
    await a.locator('#contacts li[data-user="bob"][data-devices="1"]').waitFor({ timeout: DEADLINE_MS });
  });

  await step("bob goes away by himself when idle: away (idle) on his card, his choice untouched", async () => {
    await b.fill("#idle", "1");
    await b.dispatchEvent("#idle", "change");
    await expectStatus(a, "bob", "away");
    await b.locator("#my-status", { hasText: "Away (idle)" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await b.inputValue("#status"), "online", "the status picker must keep bob's choice");
    // The client's autoAway did it: idle, and its status still the choice.
    assert.deepEqual(await b.evaluate(() => [client.idle, client.status && client.status.status]), [true, "online"]);
    // Opened without a click: any pointer activity would end the idleness.
    await b.evaluate(() => { document.getElementById("log-details").open = true; });
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await b.screenshot({ path: path.join(ARTIFACTS, "demo-idle.png") });
  });
  await step("bob's activity brings him back online", async () => {
    await b.mouse.move(200, 200);
    await b.mouse.move(240, 260);
    await expectStatus(a, "bob", "online");
    assert.equal(await b.evaluate(() => client.idle), false);
  });
  await step("bob turns off auto-away and picks busy with a text", async () => {
    await b.uncheck("#autoAway");
    await b.selectOption("#status", "busy");
    await b.fill("#text", "in a meeting");
    await b.click("#setStatus");
    const row = await expectStatus(a, "bob", "busy");
    await row.locator(".text", { hasText: "in a meeting" }).waitFor({ timeout: DEADLINE_MS });
    // His own card shows what others see: status and text.
    await b.locator('#me[data-status="busy"] #my-status', { hasText: "Busy" }).waitFor({ timeout: DEADLINE_MS });
    await b.locator("#my-text", { hasText: "in a meeting" }).waitFor({ timeout: DEADLINE_MS });
  });
  await step("a second tab of bob's shares his status both ways", async () => {
    const tab = await openAs("bob", "device=tablet&idle=300");
    // The new tab shows the status and text set on the first.
    await tab.page.locator('#me[data-status="busy"]').waitFor({ timeout: DEADLINE_MS });
    await tab.page.locator("#my-text", { hasText: "in a meeting" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await tab.page.inputValue("#status"), "busy");
    await tab.page.locator("#my-meta", { hasText: "2 devices" }).waitFor({ timeout: DEADLINE_MS });
    // A change there shows here, picker included.
    await tab.page.selectOption("#status", "away");
    await tab.page.fill("#text", "on the train");
    await tab.page.click("#setStatus");
    await b.locator('#me[data-status="away"]').waitFor({ timeout: DEADLINE_MS });
    await b.locator("#my-text", { hasText: "on the train" }).waitFor({ timeout: DEADLINE_MS });
    await until("bob's first tab's picker to follow", DEADLINE_MS, async () => (await b.inputValue("#status")) === "away");
    await expectStatus(a, "bob", "away");
    await tab.context.close();
  });
  await step("bob goes invisible: grey to alice, invisible to himself", async () => {
    await b.selectOption("#status", "invisible");
    await b.click("#setStatus");
    await expectStatus(a, "bob", "offline");
    await b.locator("#my-status", { hasText: "Invisible" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await b.locator("#status-error").textContent(), "", "no error shown");
  });
  await step("bob is busy again: picking it is enough, no button to press", async () => {
    await b.selectOption("#status", "busy");
    await expectStatus(a, "bob", "busy");
    await b.locator('#me[data-status="busy"]').waitFor({ timeout: DEADLINE_MS });
  });

  const carol = await step("carol picks away before her own record arrives, and goes away", async () => {
    // The server's frames are held until carol has made her choice, so her
    // own record (online) comes after it: it must not reset the picker.
    const context = await browser.newContext({ viewport: { width: 1120, height: 780 }, colorScheme: "light", locale: "en-US" });
    const page = await context.newPage();
    page.on("console", (m) => pageLogs.push(`[carol] ${m.type()}: ${m.text()}`));
    let release;
    const released = new Promise((r) => { release = r; });
    await page.routeWebSocket(/\/ws/, (ws) => {
      const server = ws.connectToServer();
      server.onMessage(async (m) => { await released; ws.send(m); });
    });
    await page.goto(`${node.base}/?user=carol&device=desktop&watch=alice&idle=300`);
    await page.locator('#state[data-state="connecting"]').waitFor({ timeout: DEADLINE_MS });
    // Picked while connecting: applied once the connection opens.
    await page.selectOption("#status", "away");
    await page.fill("#text", "lunch");
    release();
    await page.locator('#state[data-state="open"]').waitFor({ timeout: DEADLINE_MS });
    await expectStatus(a, "carol", "away");
    await page.locator('#me[data-status="away"]').waitFor({ timeout: DEADLINE_MS });
    assert.equal(await page.inputValue("#status"), "away", "carol's own record must not reset her choice");
    assert.equal(await page.inputValue("#text"), "lunch", "nor the text she is typing");
    await page.click("#setStatus");
    await page.locator("#my-text", { hasText: "lunch" }).waitFor({ timeout: DEADLINE_MS });
    return { context, page };
  });
  const dave = await step("dave signs in twice", async () => {
    const d1 = await openAs("dave", "device=laptop&watch=alice&idle=300");
    const d2 = await openAs("dave", "device=phone&watch=alice&idle=300");
    await expectStatus(a, "dave", "online");
    // A second device is no transition: the page's periodic refresh (here
    // asked for at once) picks up the count.
    await a.evaluate(() => client.refresh());
    await a.locator('#contacts li[data-user="dave"][data-devices="2"]').waitFor({ timeout: DEADLINE_MS });
    return [d1, d2];
  });

  await step("screenshots", async () => {
    await expectStatus(a, "erin", "offline");
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await a.screenshot({ path: path.join(ARTIFACTS, "demo.png") });
  });

  await step("bob closes his tab and his dot turns grey", async () => {
    await bob.context.close();
    const row = await expectStatus(a, "bob", "offline");
    await row.locator(".meta-line", { hasText: /last seen/ }).waitFor({ timeout: DEADLINE_MS });
  });
  await step("alice's log shows the transitions", async () => {
    const text = await a.locator("#log").textContent();
    for (const s of ["bob is online", "bob is away", "bob is busy", "bob is offline"]) {
      assert.ok(text.includes(s), `log lacks "${s}":\n${text}`);
    }
  });
  await a.screenshot({ path: path.join(ARTIFACTS, "demo-after-close.png") });

  for (const c of [carol, ...dave, alice]) await c.context.close();
});

test("statuses that end: clear after, busy until 15:00 in the browser's locale, the reset; the phone mark", { timeout: 120_000 }, async () => {
  const hal = await step("hal watches ivy and jon", () => openAs("hal", "device=laptop&watch=ivy,jon"));
  const h = hal.page;
  const ivy = await step("ivy signs in on a phone", () => openAs("ivy", "device=phone&kind=mobile&idle=300"));
  const jon = await step("jon signs in on a web tab", () => openAs("jon", "device=tab&idle=300"));
  const i = ivy.page;
  await step("only ivy, who is only on mobile, has the phone mark", async () => {
    await expectStatus(h, "ivy", "online");
    await expectStatus(h, "jon", "online");
    await h.locator('#contacts li[data-user="ivy"][data-mobile="true"] .mobile').waitFor({ state: "visible", timeout: DEADLINE_MS });
    await h.locator('#contacts li[data-user="jon"][data-mobile="false"]').waitFor({ timeout: DEADLINE_MS });
    assert.ok(await h.locator('#contacts li[data-user="jon"] .mobile').isHidden(), "no phone mark for a web tab");
  });
  await step("the picker offers 30 min, 1 h, 4 h and today", async () => {
    const values = await i.locator("#clearAfter option").evaluateAll((os) => os.map((o) => o.value));
    assert.deepEqual(values, ["", "1800000", "3600000", "14400000", "today"]);
  });
  await step("ivy is busy for an hour: hal's card says until when, in the browser's locale", async () => {
    await i.uncheck("#autoAway");
    await i.selectOption("#status", "busy");
    await i.fill("#text", "in a call");
    await i.selectOption("#clearAfter", "3600000");
    const asked = Date.now();
    await i.click("#setStatus");
    const row = await expectStatus(h, "ivy", "busy");
    const until = Number(await row.getAttribute("data-until"));
    assert.ok(Math.abs(until - (asked + 3_600_000)) < 10_000, `until ${until} is an hour after ${asked}`);
    // The time in the browser's locale, with the date when an hour from now
    // is another day (the run may start just before midnight).
    const shown = await h.evaluate((u) => {
      const d = new Date(u);
      const time = d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });
      return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
    }, until);
    await row.locator(".meta-line", { hasText: `Busy until ${shown}` }).waitFor({ timeout: DEADLINE_MS });
    await i.locator("#my-status", { hasText: `Busy until ${shown}` }).waitFor({ timeout: DEADLINE_MS });
  });
  await step("today ends at the end of ivy's day", async () => {
    const row = h.locator('#contacts li[data-user="ivy"]');
    const before = await row.getAttribute("data-until");
    await i.selectOption("#clearAfter", "today");
    await i.click("#setStatus");
    await until("ivy's until to move to the end of today", DEADLINE_MS, async () => {
      const v = await row.getAttribute("data-until");
      return !!v && v !== before;
    });
    const end = Number(await row.getAttribute("data-until"));
    const [hours, minutes, today] = await i.evaluate((u) => {
      const d = new Date(u);
      return [d.getHours(), d.getMinutes(), d.toDateString() === new Date().toDateString()];
    }, end);
    // Just before midnight "today" is a minute from now instead.
    if (end - Date.now() > 120_000) assert.deepEqual([hours, minutes, today], [23, 59, true]);
  });
  await step("at until ivy is back online everywhere, text cleared", async () => {
    await i.evaluate(() => chooseStatus("busy", "short call", Date.now() + 2000));
    const row = await expectStatus(h, "ivy", "busy");
    await row.locator(".text", { hasText: "short call" }).waitFor({ timeout: DEADLINE_MS });
    const back = await expectStatus(h, "ivy", "online");
    assert.equal(await back.getAttribute("data-until"), "");
    assert.ok(await back.locator(".text").isHidden(), "the text is cleared");
    await i.locator('#me[data-status="online"]').waitFor({ timeout: DEADLINE_MS });
    await until("ivy's picker to follow the reset", DEADLINE_MS, async () => (await i.inputValue("#status")) === "online");
  });
  for (const c of [hal, ivy, jon]) await c.context.close();
});

test("a first visit: no contacts prefilled, the log collapsed, add and remove contacts", { timeout: 120_000 }, async () => {
  const zed = await step("zed signs in with no contacts", () => openAs("zed", "device=first"));
  const z = zed.page;
  await step("nothing prefilled, the log folded away", async () => {
    assert.equal(await z.locator("#contacts li").count(), 0);
    assert.ok(await z.locator("#contacts-empty").isVisible(), "the empty-list hint is shown");
    assert.equal(await z.locator("#log-details").getAttribute("open"), null, "log collapsed by default");
    assert.ok(!(await z.locator("#log").isVisible()), "log hidden until opened");
    assert.ok(await z.locator("#token-row").isHidden(), "no token field under dev auth");
    assert.match(await z.locator("header").textContent(), /Who is online/);
  });
  await step("add a contact, then remove it", async () => {
    await z.fill("#watchUser", "yan");
    await z.click('#watchForm button[type="submit"]');
    await expectStatus(z, "yan", "offline");
    await z.click('#contacts li[data-user="yan"] .remove');
    await until("yan's row to go", DEADLINE_MS, async () => (await z.locator("#contacts li").count()) === 0);
  });
  await step("last seen is relative and ticks", async () => {
    const yan = await openAs("yan", "device=phone");
    await z.fill("#watchUser", "yan");
    await z.click('#watchForm button[type="submit"]');
    await expectStatus(z, "yan", "online");
    await yan.context.close();
    const row = await expectStatus(z, "yan", "offline");
    await row.locator(".meta-line", { hasText: /last seen (now|\d+ seconds? ago)/ }).waitFor({ timeout: DEADLINE_MS });
    const first = await row.locator(".meta-line").textContent();
    await until("the relative time to move on", DEADLINE_MS, async () => (await row.locator(".meta-line").textContent()) !== first);
  });
  await zed.context.close();
});

test("a refused origin and a refused host name are explained, not looped on silently", { timeout: 120_000 }, async () => {
  const strict = await step("a node that allows no other origin", () => h.startNode("browser-strict"));
  const context = await browser.newContext({ viewport: { width: 1120, height: 780 }, colorScheme: "light", locale: "en-US" });
  const page = await context.newPage();
  page.on("console", (m) => pageLogs.push(`[origin] ${m.type()}: ${m.text()}`));
  await step("a page from one node pointed at another: --allowed-origins is named", async () => {
    const server = strict.base.replace(/^http/, "ws") + "/ws";
    await page.goto(`${node.base}/?user=olga&device=tab&server=${encodeURIComponent(server)}`);
    await page.locator("#notice", { hasText: "--allowed-origins " + node.base }).waitFor({ timeout: DEADLINE_MS });
    // Told by a close frame (1008), not guessed from a bare 1006: the page stops trying.
    await page.locator("#state", { hasText: "Signed out" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await page.locator("#state").getAttribute("data-code"), "1008");
    assert.match(await page.locator("#notice").textContent(), /does not allow this page's origin/);
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, "demo-refused-origin.png") });
  });
  await step("a host name dev auth does not answer to: 403 and --allowed-host are named", async () => {
    const port = new URL(node.base).port;
    await page.goto(`http://presence.test:${port}/?user=olga&device=tab`);
    await page.locator("#notice", { hasText: "403" }).waitFor({ timeout: DEADLINE_MS });
    assert.match(await page.locator("#notice").textContent(), /--allowed-host presence\.test/);
  });
  await context.close();
  strict.child.kill("SIGKILL");
});

test("a page given two nodes rides out the death of the one it is on", { timeout: 180_000 }, async () => {
  // The page comes from the first node: the others must let its origin in.
  const allow = ["--allowed-origins", node.base];
  const second = await step("a second node starts", () => h.startNode("browser-2", allow));
  const doomed = await step("a third node starts", () => h.startNode("browser-3", allow));
  // Alice's page comes from the first node but talks to the doomed one,
  // with the second as the fallback.
  const servers = [doomed.base, second.base].map((b) => b.replace(/^http/, "ws") + "/ws").join(",");
  const alice = await step("alice signs in on the doomed node", () =>
    openAs("alice2", `device=laptop&watch=bob2&server=${encodeURIComponent(servers)}`));
  const a = alice.page;
  assert.match(await a.getAttribute("#state", "title"), new RegExp(doomed.base.replace(/^http/, "ws")));
  const bob = await step("bob signs in on the second node", () => openAs("bob2", "device=phone&watch=alice2&idle=300", second.base));
  await step("alice sees bob online", () => expectStatus(a, "bob2", "online"));

  await step("the doomed node is killed; alice's page reconnects to the other", async () => {
    doomed.child.kill("SIGKILL");
    // Open again, on the other node. (The "reconnecting" in between may last
    // a few milliseconds: the client's full jitter may draw a delay near 0.)
    const other = second.base.replace(/^http/, "ws");
    await a.waitForFunction(
      (url) => {
        const pill = document.getElementById("state");
        return pill.dataset.state === "open" && (pill.title || "").includes(url);
      },
      other,
      { timeout: DEADLINE_MS },
    );
  });
  await step("after the reconnect alice's watch is back: bob's change reaches her", async () => {
    await bob.page.selectOption("#status", "away");
    await bob.page.click("#setStatus");
    await expectStatus(a, "bob2", "away");
  });
  await step("bob still sees alice online: her device moved to the other node", async () => {
    await bob.page.locator('#contacts li[data-user="alice2"][data-status="online"]').waitFor({ timeout: DEADLINE_MS });
    const log = await bob.page.locator("#log").textContent();
    assert.ok(!log.includes("alice2 is offline"), `bob's log:\n${log}`);
  });
  await alice.context.close();
  await bob.context.close();
});

test("a room: who is here on which device, who is typing, leaving, and a node restart", { timeout: 180_000 }, async () => {
  // A node of its own on a fixed port: it restarts where the pages expect it.
  const listen = `127.0.0.1:${await freePort()}`;
  let own = await step("a node for the room starts", () => h.startNode("browser-rooms", [], listen));
  const alice = await step("alice opens the page already in general (?room=)", () => openAs("alice", "device=laptop&room=general", own.base));
  const bob = await step("bob signs in", () => openAs("bob", "device=phone", own.base));
  const [a, b] = [alice.page, bob.page];
  /** The row of `user` in `page`'s room panel. */
  const member = (page, user) => page.locator(`#room-members li[data-user="${user}"]`);

  await step("bob joins general (the default); they see each other with their devices", async () => {
    await a.locator('#room-card[data-joined="true"][data-room="general"]').waitFor({ timeout: DEADLINE_MS });
    assert.equal(await b.inputValue("#roomName"), "general");
    await b.click("#join");
    await member(a, "bob").locator(".devices", { hasText: "phone: looking at the page" }).waitFor({ timeout: DEADLINE_MS });
    await member(b, "alice").locator(".devices", { hasText: "laptop: looking at the page" }).waitFor({ timeout: DEADLINE_MS });
    await member(a, "alice").locator(".you").waitFor({ timeout: DEADLINE_MS });
    await a.locator("#room-summary", { hasText: "general · 2 users here" }).waitFor({ timeout: DEADLINE_MS });
    // Room members are watched for their dots: the page's own dot styles.
    const row = b.locator('#room-members li[data-user="alice"][data-status="online"]');
    await row.waitFor({ timeout: DEADLINE_MS });
    assert.equal(await row.locator(".dot").evaluate((el) => getComputedStyle(el).backgroundColor), COLOURS.online);
    assert.ok(await b.locator("#room-card .hint", { hasText: "only drives the typing indicator" }).isVisible());
  });

  await step("alice's pointer over the room panel is a labelled dot on bob's page, and it moves", async () => {
    const box = await a.locator("#room-card").boundingBox();
    await a.mouse.move(box.x + box.width * 0.2, box.y + box.height * 0.3);
    const dot = b.locator('#room-cursors .cursor[data-user="alice"]');
    await dot.waitFor({ timeout: DEADLINE_MS });
    assert.equal(await dot.textContent(), "alice");
    const left = () => dot.evaluate((el) => parseFloat(el.style.left));
    assert.ok(Math.abs((await left()) - 20) < 2, `at ${await left()}%`);
    await a.mouse.move(box.x + box.width * 0.7, box.y + box.height * 0.6, { steps: 20 });
    await until("alice's cursor to reach 70% on bob's page", DEADLINE_MS, async () => Math.abs((await left()) - 70) < 2);
    assert.equal(await a.locator('#room-cursors .cursor[data-user="alice"]').count(), 0, "no dot for your own tab");
  });

  await step("once in the room, Join is no longer the highlighted action; another name enables it", async () => {
    for (const p of [a, b]) {
      await p.locator("#join:disabled").waitFor({ timeout: DEADLINE_MS });
      assert.ok(await p.locator("#join").evaluate((el) => el.classList.contains("secondary")), "Join still styled as the main action");
    }
    await b.fill("#roomName", "elsewhere");
    assert.ok(await b.locator("#join").isEnabled(), "Join disabled for another room");
    await b.fill("#roomName", "general");
    assert.ok(await b.locator("#join").isDisabled());
    await b.locator("#roomName").blur();
  });

  await step("alice types: bob sees it; it clears by itself once she pauses", async () => {
    await a.locator("#say").pressSequentially("hello b");
    await b.locator("#typing", { hasText: "alice is typing…" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await a.locator("#typing").textContent(), "", "no one types to alice");
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await b.locator("#room-card").screenshot({ path: path.join(ARTIFACTS, "demo-rooms.png") });
    // No blur, no Enter: the typing lease (5 s) lapses.
    await until("bob's typing line to clear", DEADLINE_MS, async () => (await b.locator("#typing").textContent()) === "");
    assert.equal(await a.inputValue("#say"), "hello b");
  });

  await step("Enter clears the box and the typing line at once", async () => {
    await a.locator("#say").pressSequentially("ob");
    await b.locator("#typing", { hasText: "alice is typing…" }).waitFor({ timeout: DEADLINE_MS });
    await a.locator("#say").press("Enter");
    assert.equal(await a.inputValue("#say"), "");
    // Well before the 5 s lease: the stop was sent.
    await until("bob's typing line to clear after Enter", 4000, async () => (await b.locator("#typing").textContent()) === "");
  });

  await step("bob leaves and joins again", async () => {
    await b.click("#leave");
    await until("alice's panel to drop bob", DEADLINE_MS, async () => (await member(a, "bob").count()) === 0);
    assert.equal(await b.locator("#room-members li").count(), 0);
    await b.click("#join");
    await member(a, "bob").waitFor({ timeout: DEADLINE_MS });
  });

  await step("the node restarts: both pages reconnect by themselves and are back in the room", async () => {
    own.child.kill("SIGKILL");
    await a.locator('#state[data-state="reconnecting"]').waitFor({ timeout: DEADLINE_MS });
    own = await h.startNode("browser-rooms-2", [], listen);
    for (const p of [a, b]) {
      await p.locator('#state[data-state="open"]').waitFor({ timeout: DEADLINE_MS });
      await p.locator('#room-card[data-joined="true"]').waitFor({ timeout: DEADLINE_MS });
    }
    await a.locator('#room-members li[data-user="bob"][data-devices="1"]').waitFor({ timeout: DEADLINE_MS });
    await b.locator('#room-members li[data-user="alice"][data-devices="1"]').waitFor({ timeout: DEADLINE_MS });
    // Typing still flows after the rejoin.
    await b.locator("#say").pressSequentially("back");
    await a.locator("#typing", { hasText: "bob is typing…" }).waitFor({ timeout: DEADLINE_MS });
    await b.locator("#say").press("Enter");
  });

  await step("bob closes his tab: alice's panel drops him", async () => {
    await bob.context.close();
    await until("alice's panel to drop bob", DEADLINE_MS, async () => (await member(a, "bob").count()) === 0);
    await a.locator("#room-summary", { hasText: "general · 1 user here" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(await a.locator("#typing").textContent(), "");
  });
  await alice.context.close();
  own.child.kill("SIGKILL");
});

test("a room the app's backend controls: a refused join and a removal are said in words", { timeout: 120_000 }, async () => {
  const key = "admin-key-of-the-browser-test-0123456789";
  const own = await step("a node with a member-list room policy starts", () =>
    h.startNode("browser-private", ["--room-policy", "private:*=members", "--admin-key", key]));
  /** The admin API, as the app's backend calls it. */
  const admin = async (method, p, body) => {
    const res = await fetch(own.base + p, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    assert.equal(res.status, 200, `${method} ${p}: ${await res.text()}`);
  };
  await step("the backend lists ann alone", () => admin("PUT", "/api/rooms/private:1/members", { users: ["ann"] }));
  const ann = await step("ann signs in", () => openAs("ann", "device=laptop", own.base));
  const ben = await step("ben signs in", () => openAs("ben", "device=phone", own.base));
  const [a, b] = [ann.page, ben.page];
  const join = async (page) => {
    await page.fill("#roomName", "private:1");
    await page.click("#join");
  };

  await step("ann joins private:1", async () => {
    await join(a);
    await a.locator('#room-card[data-joined="true"][data-room="private:1"]').waitFor({ timeout: DEADLINE_MS });
  });
  await step("ben is not on the list: the refusal is said, and he is not left waiting", async () => {
    await join(b);
    await b.locator("#room-error", { hasText: "You may not join private:1: not on its member list." }).waitFor({ timeout: DEADLINE_MS });
    await b.locator('#room-card[data-ended="forbidden"][data-room=""]').waitFor({ timeout: DEADLINE_MS });
    assert.match(await b.locator("#room-summary").textContent(), /Not in a room/);
    assert.ok(await b.locator("#leave").isHidden(), "no Leave for a room he is not in");
    assert.equal(await a.locator('#room-members li[data-user="ben"]').count(), 0);
  });
  await step("on the list, ben joins; the old refusal goes", async () => {
    await admin("POST", "/api/rooms/private:1/members/ben");
    await b.click("#join");
    await b.locator('#room-card[data-joined="true"][data-room="private:1"]').waitFor({ timeout: DEADLINE_MS });
    assert.equal(await b.locator("#room-error").textContent(), "");
    await a.locator('#room-members li[data-user="ben"]').waitFor({ timeout: DEADLINE_MS });
  });
  await step("the backend removes ben: his page says so, ann's panel drops him and says why", async () => {
    await admin("DELETE", "/api/rooms/private:1/members/ben");
    await b.locator("#room-error", { hasText: "You were removed from private:1 by the app." }).waitFor({ timeout: DEADLINE_MS });
    await b.locator('#room-card[data-ended="removed"][data-room=""]').waitFor({ timeout: DEADLINE_MS });
    assert.equal(await b.locator("#room-members li").count(), 0);
    assert.ok(await b.locator("#sayForm").isHidden(), "no typing box outside the room");
    await until("ann's panel to drop ben", DEADLINE_MS, async () => (await a.locator('#room-members li[data-user="ben"]').count()) === 0);
    await a.locator("#log", { hasText: "ben was removed from private:1 by the app" }).waitFor({ state: "attached", timeout: DEADLINE_MS });
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await b.locator("#room-card").screenshot({ path: path.join(ARTIFACTS, "demo-room-removed.png") });
  });
  await step("joining again is refused in words: ben is off the list", async () => {
    await b.click("#join");
    await b.locator("#room-error", { hasText: "You may not join private:1: not on its member list." }).waitFor({ timeout: DEADLINE_MS });
  });
  await ann.context.close();
  await ben.context.close();
  own.child.kill("SIGKILL");
});

/** An HS256 JWT for `sub`, valid for an hour. */
function hs256(secret, sub) {
  const crypto = require("node:crypto");
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ sub, exp: Math.floor(Date.now() / 1000) + 3600 })}`;
  return `${body}.${crypto.createHmac("sha256", secret).update(body).digest("base64url")}`;
}

test("under JWT auth the page asks for a token and explains a refused one", { timeout: 120_000 }, async () => {
  const secret = "0123456789abcdef0123456789abcdef-browser-secret";
  const jwt = await step("a JWT node starts", () => h.startNode("browser-jwt-page", ["--auth", "jwt", "--jwt-secret", secret]));
  const context = await browser.newContext({ viewport: { width: 1120, height: 780 }, colorScheme: "light", locale: "en-US" });
  const page = await context.newPage();
  page.on("console", (m) => pageLogs.push(`[jwt-page] ${m.type()}: ${m.text()}`));
  await step("the page learns JWT auth from /api/info: a token field, no user field", async () => {
    // ?user= would sign in at once under dev auth; here it must not.
    await page.goto(`${jwt.base}/?user=mallory&device=tab`);
    await page.locator('body[data-auth="jwt"]').waitFor({ timeout: DEADLINE_MS });
    assert.ok(await page.locator("#token").isVisible(), "token field shown");
    assert.ok(await page.locator("#user-row").isHidden(), "no user field: the token names the user");
    assert.match(await page.locator("#server-hint").textContent(), /JWT/);
  });
  await step("signing in without a token says a token is needed", async () => {
    await page.click("#connect");
    assert.match(await page.locator("#signin-error").textContent(), /--auth jwt/);
  });
  await step("a token signed with another key: a clear message, and no reconnect loop", async () => {
    await page.fill("#token", hs256("another-secret-of-at-least-32-bytes!!", "mallory"));
    await page.click("#connect");
    await page.locator("#notice", { hasText: "refused the token" }).waitFor({ timeout: DEADLINE_MS });
    await page.locator('#state[data-state="closed"]').waitFor({ timeout: DEADLINE_MS });
    assert.ok(await page.locator("#signin-card").isVisible(), "back at sign-in");
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, "demo-jwt-refused.png") });
  });
  await step("a good token signs in; the notice goes", async () => {
    await page.fill("#token", hs256(secret, "auth0|mallory"));
    await page.click("#connect");
    await page.locator('#state[data-state="open"]').waitFor({ timeout: DEADLINE_MS });
    assert.equal(await page.locator("#notice").textContent(), "");
    assert.match(await page.locator("#my-name").textContent(), /auth0\|mallory/);
  });
  await context.close();
  jwt.child.kill("SIGKILL");
});

test("with JWT auth the page sends its token as the first frame, never in the URL", { timeout: 120_000 }, async () => {
  const secret = "0123456789abcdef0123456789abcdef-browser-secret";
  const jwt = await step("a JWT node starts", () =>
    h.startNode("browser-jwt", ["--auth", "jwt", "--jwt-secret", secret, "--allowed-origins", node.base]));
  const token = hs256(secret, "auth0|alice3");
  const server = jwt.base.replace(/^http/, "ws") + "/ws";
  const context = await browser.newContext({ viewport: { width: 1120, height: 780 }, colorScheme: "light", locale: "en-US" });
  const page = await context.newPage();
  page.on("console", (m) => pageLogs.push(`[jwt] ${m.type()}: ${m.text()}`));
  const urls = [];
  page.on("websocket", (ws) => urls.push(ws.url()));
  // The server is of another origin than the page: the page asks before it
  // sends the token there, naming that origin.
  const asked = [];
  let accept = false;
  page.on("dialog", (d) => { asked.push(d.message()); (accept ? d.accept() : d.dismiss()).catch(() => {}); });
  await step("declining to send the token elsewhere: not signed in, nothing sent", async () => {
    await page.goto(`${node.base}/?server=${encodeURIComponent(server)}`);
    await page.fill("#token", token);
    await page.fill("#device", "tab");
    await page.click("#connect");
    await page.locator("#signin-error", { hasText: "not sent" }).waitFor({ timeout: DEADLINE_MS });
    assert.equal(asked.length, 1, "asked once");
    assert.ok(asked[0].includes(jwt.base), `the question names ${jwt.base}: ${asked[0]}`);
    assert.equal(urls.length, 0, `a WebSocket opened: ${urls}`);
  });
  await step("the page signs in with a token once allowed", async () => {
    accept = true;
    await page.click("#connect");
    await page.locator('#state[data-state="open"]').waitFor({ timeout: DEADLINE_MS });
    assert.equal(asked.length, 2, "asked again");
  });
  assert.match(await page.locator("#state").textContent(), /auth0\|alice3/);
  assert.ok(urls.length > 0, "no WebSocket opened");
  for (const u of urls) assert.ok(!u.includes(token.split(".")[2]) && !u.includes("token="), `token in the URL: ${u}`);
  await context.close();
});
