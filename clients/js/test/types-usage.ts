// Type-checked (never run) by `npm test` with tsc --noEmit: a small app's use
// of presence-client.js through presence-client.d.ts. types.test.js
// checks that the declarations name exactly what the library has.
import PresenceClient = require("../presence-client");

const client = new PresenceClient({
  url: ["wss://a.example/ws", "wss://b.example/ws"],
  device: "tab-1",
  user: "alice",
  minBackoffMs: 250,
  kind: "mobile",
  onChange: (record) => {
    const kinds: PresenceClient.DeviceKind[] | undefined = record.kinds;
    const until: number | null | undefined = record.until;
    console.log(kinds, until);
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
client.onSelf = (me: PresenceClient.PresenceRecord) => console.log(me.status, me.text);
client.onState = (state: PresenceClient.ConnectionState, info: PresenceClient.StateInfo) => {
  if (state === "closed" && info.willRetry === false) console.log("stopped:", info.code, info.reason);
};
const finalCodes: readonly number[] = PresenceClient.FINAL_CLOSE_CODES;
console.log(finalCodes.includes(1008));
client.connect();
client.watch(["bob", "carol"]);
client.watch("dave");
client.watch(["erin"], { devices: true });
const counted: Set<string> = client.watchedDevices;
console.log(counted.size);
client.unwatch("bob");
client.setStatus("busy", "in a meeting");
client.setStatus("online");
client.setStatus("busy", { text: "in a call", until: Date.now() + 3_600_000 });
client.setStatus("away", { until: new Date() });
const kind: PresenceClient.DeviceKind | null = client.kind;
const ends: number | null | undefined = client.status?.until;
console.log(kind, ends);
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

// Automatic away after 5 minutes without activity (the defaults), or after 2 with stand-ins.
const away = new PresenceClient({ url: "wss://a.example/ws", user: "alice", device: "tab", autoAway: true, onIdle: (idle: boolean) => console.log(idle) });
away.setAutoAway({ idleMs: 120_000, window: new EventTarget(), document: Object.assign(new EventTarget(), { hidden: false }) });
away.setAutoAway(false);
const idle: boolean = away.idle;
console.log(idle);
// @ts-expect-error: idle is read-only
away.idle = true;

// @ts-expect-error: not a status a client may choose
client.setStatus("sleeping");
// @ts-expect-error: `device` is required
new PresenceClient({ url: "wss://a.example/ws", user: "alice" });

// Rooms: who is here, and who is typing.
const room: PresenceClient.Room = client.join("chat:1", { state: { page: 1 } });
client.join("doc:42");
const roomId: string = room.id;
const counts: number = room.users + room.devices;
const members: Map<string, PresenceClient.RoomDevice[]> | null = room.members;
members?.forEach((devices, user) => devices.forEach((d) => console.log(user, d.device, d.state, d.joined_at)));
const isIn: boolean = room.joined;
console.log(roomId, counts, isIn, room.error?.room, room.typingUsers.length);
room.onSync = (r: PresenceClient.Room) => console.log(r.users);
room.onJoin = (e) => { const first: boolean = e.first; console.log(e.user, e.device, e.state, first); };
room.onLeave = (e) => { const last: boolean = e.last; console.log(e.user, e.device, last); };
room.onUpdate = (e: PresenceClient.RoomUpdateEvent) => console.log(e.user, e.device, e.state);
room.onSignal = (e) => console.log(e.user, e.device, e.data);
room.onOccupancy = ({ users, devices }) => console.log(users, devices);
room.onTyping = (users: string[]) => console.log(users.join(", "));
room.update({ page: 2 });
room.signal({ cursor: [1, 2] });
room.typing();
room.stopTyping();
room.leave();
const rooms: Map<string, PresenceClient.Room> = client.rooms;
console.log(rooms.get("chat:1")?.id);
// @ts-expect-error: a room state is an object
room.update("page 2");

// Rooms the app's backend controls: room tokens, and what ends a room.
const withRooms = new PresenceClient({
  url: "wss://a.example/ws",
  device: "tab-2",
  user: "alice",
  getToken: async (roomId: string) => (roomId.startsWith("doc:") ? `token-for-${roomId}` : false),
  maxJoinRetries: 3,
});
const getToken: PresenceClient.GetToken | null = withRooms.getToken;
const retries: number = withRooms.maxJoinRetries;
console.log(getToken, retries);
withRooms.getToken = (roomId) => (roomId === "lobby" ? false : "eyJ...");
const doc: PresenceClient.Room = withRooms.join("doc:7", { state: { page: 1 }, token: "eyJ...room" });
withRooms.join("lobby", { token: false });
const joinOptions: PresenceClient.JoinOptions = { state: {} };
withRooms.join("chat:9", joinOptions);
doc.onError = (e: PresenceClient.PresenceError) => {
  const over: boolean = e.willRetry === false;
  if (e.code === "removed" || e.code === "forbidden") console.log(e.room, e.message, over);
};
doc.onLeave = (e: PresenceClient.RoomLeaveEvent) => console.log(e.user, e.removed === true);
// @ts-expect-error: a room token is a string (or false)
withRooms.join("doc:8", { token: 42 });
