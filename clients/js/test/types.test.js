// presence-client.d.ts must name exactly what presence-client.js has:
// tsc checks types-usage.ts against the declarations (npm test runs it
// first), and this test checks the declarations against the library itself,
// so neither can drift from the other silently.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const ts = require("typescript");

const STATIC = path.resolve(__dirname, "..");
const PresenceClient = require(path.join(STATIC, "presence-client.js"));

/** Members of `declare class PresenceClient` in the .d.ts: {instance: Set, statics: Set}. */
function declared() {
  const file = path.join(STATIC, "presence-client.d.ts");
  const src = ts.createSourceFile(file, fs.readFileSync(file, "utf8"), ts.ScriptTarget.ES2020, true);
  const instance = new Set();
  const statics = new Set();
  let found = false;
  src.forEachChild((node) => {
    if (!ts.isClassDeclaration(node) || node.name?.text !== "PresenceClient") return;
    found = true;
    for (const m of node.members) {
      if (!m.name) continue; // the constructor
      const isStatic = (ts.getModifiers(m) || []).some((x) => x.kind === ts.SyntaxKind.StaticKeyword);
      (isStatic ? statics : instance).add(m.name.getText(src));
    }
  });
  assert.ok(found, "presence-client.d.ts declares no class PresenceClient");
  return { instance, statics };
}

/** Public members of the library: prototype methods and getters, and fields a new client has. */
function actual() {
  const client = new PresenceClient({ url: "ws://127.0.0.1:1/ws", device: "d", user: "u", WebSocket: class {} });
  const names = new Set([
    ...Object.getOwnPropertyNames(PresenceClient.prototype),
    ...Object.keys(client),
  ]);
  names.delete("constructor");
  const instance = new Set([...names].filter((n) => !n.startsWith("_")));
  const statics = new Set(Object.keys(PresenceClient));
  return { instance, statics, client };
}

test("presence-client.d.ts declares exactly the library's public members", () => {
  const d = declared();
  const a = actual();
  const missing = [...a.instance].filter((n) => !d.instance.has(n));
  const stale = [...d.instance].filter((n) => !a.instance.has(n));
  assert.deepEqual(missing, [], "public members of presence-client.js missing from the .d.ts");
  assert.deepEqual(stale, [], "members the .d.ts declares that presence-client.js does not have");
  assert.deepEqual([...a.statics].sort(), [...d.statics].sort(), "static members");
  // Methods are functions, and the declared statuses are the library's.
  for (const m of ["connect", "close", "watch", "unwatch", "refresh", "setStatus", "heartbeat"]) {
    assert.equal(typeof a.client[m], "function", m);
  }
  const dts = fs.readFileSync(path.join(STATIC, "presence-client.d.ts"), "utf8");
  const chosen = dts.match(/type ChosenStatus = ([^;]+);/)[1].match(/"(\w+)"/g).map((s) => s.slice(1, -1));
  assert.deepEqual(chosen, PresenceClient.STATUSES);
});

test("presence-client.d.ts's Room interface declares exactly the Room's public members", () => {
  const file = path.join(STATIC, "presence-client.d.ts");
  const src = ts.createSourceFile(file, fs.readFileSync(file, "utf8"), ts.ScriptTarget.ES2020, true);
  const declaredRoom = new Set();
  const visit = (node) => {
    if (ts.isInterfaceDeclaration(node) && node.name.text === "Room") {
      for (const m of node.members) if (m.name) declaredRoom.add(m.name.getText(src));
    }
    ts.forEachChild(node, visit);
  };
  visit(src);
  assert.ok(declaredRoom.size, "presence-client.d.ts declares no interface Room");
  const client = new PresenceClient({ url: "ws://127.0.0.1:1/ws", device: "d", user: "u", WebSocket: class {} });
  const room = client.join("doc:1");
  const names = new Set([...Object.getOwnPropertyNames(PresenceClient.Room.prototype), ...Object.keys(room)]);
  names.delete("constructor");
  const actualRoom = [...names].filter((n) => !n.startsWith("_")).sort();
  assert.deepEqual(actualRoom, [...declaredRoom].sort());
});

test("react.d.ts declares exactly the hooks react.js and react.mjs export", async () => {
  const file = path.join(STATIC, "react.d.ts");
  const src = ts.createSourceFile(file, fs.readFileSync(file, "utf8"), ts.ScriptTarget.ES2020, true);
  const declaredFns = [];
  src.forEachChild((node) => {
    if (ts.isFunctionDeclaration(node) && node.name && (ts.getModifiers(node) || []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword)) {
      declaredFns.push(node.name.text);
    }
  });
  const cjs = require(path.join(STATIC, "react.js"));
  assert.deepEqual(Object.keys(cjs).sort(), declaredFns.sort());
  for (const name of declaredFns) assert.equal(typeof cjs[name], "function", name);
  // The ES module entry hands out the very same functions (one store per client).
  const esm = await import(path.join(STATIC, "react.mjs"));
  assert.deepEqual(Object.keys(esm).sort(), declaredFns.sort());
  for (const name of declaredFns) assert.equal(esm[name], cjs[name], name);
});
