// Type-checked (never run) by `npm test` with tsc --noEmit: a small app's use
// of presence-client.js through static/presence-client.d.ts. types.test.js
// checks that the declarations name exactly what the library has.
import PresenceClient = require("../../static/presence-client");

const client = new PresenceClient({
  url: ["wss://a.example/ws", "wss://b.example/ws"],
  device: "tab-1",
  user: "alice",
  minBackoffMs: 250,
  onChange: (record) => {
    const status: PresenceClient.Status = record.status;
    const devices: number = record.devices;
    const text: string | null = record.text;
    const lastSeen: number | null = record.last_seen;
    console.log(status, devices, text, lastSeen);
  },
});
client.onSnapshot = (records: PresenceClient.PresenceRecord[]) => console.log(records.length);
client.onState = (state: PresenceClient.ConnectionState, info: PresenceClient.StateInfo) => {
  if (state === "reconnecting" && info.willRetry) console.log(info.delayMs, info.code);
  if (state === "open" && info.hello) console.log(info.hello.heartbeat_ms);
};
client.onError = (e: PresenceClient.PresenceError) => console.log(e.code, e.message, e.status);
client.connect();
client.watch(["bob", "carol"]);
client.watch("dave");
client.unwatch("bob");
client.setStatus("busy", "in a meeting");
client.setStatus("online");
client.refresh();
client.heartbeat();
const open: boolean = client.connected;
const watched: Set<string> = client.watched;
const hello: PresenceClient.Hello | null = client.hello;
const statuses: readonly PresenceClient.ChosenStatus[] = PresenceClient.STATUSES;
console.log(open, watched, hello, statuses);
client.close();

// With JWT auth: a token and a way to get a fresh one.
const withToken = new PresenceClient({
  url: "wss://a.example/ws",
  device: "phone",
  token: "eyJ...",
  refreshToken: async () => "eyJ...fresh",
  onAuthExpiring: ({ in_ms }) => console.log(in_ms),
});
withToken.connect();

// @ts-expect-error: not a status a client may choose
client.setStatus("sleeping");
// @ts-expect-error: `device` is required
new PresenceClient({ url: "wss://a.example/ws", user: "alice" });
