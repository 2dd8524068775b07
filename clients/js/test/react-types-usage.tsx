// Type-checked (never run) by `npm test` with tsc --noEmit: a small React
// app's use of presence-client/react through react.d.ts. types.test.js checks
// that the declarations name exactly what react.js exports.
import PresenceClient = require("../presence-client");
import { PresenceProvider, usePresenceClient, usePresence, useSelf, useRoom, useOccupancy } from "../react";

function Contacts({ users }: { users: string[] }) {
  const records = usePresence(users);
  const first: PresenceClient.PresenceRecord | null = records[0];
  const one = usePresence("bob");
  // @ts-expect-error: the records are read-only
  records.push(null);
  return <ul>{records.map((r, i) => <li key={users[i]}>{r ? `${r.user} ${r.status} ${r.devices}` : "…"} {first?.text} {one.length}</li>)}</ul>;
}

function Me() {
  const { user, record, idle, setStatus } = useSelf();
  const name: string | null = user;
  const away: boolean = idle;
  const status: PresenceClient.Status | undefined = record?.status;
  setStatus("busy", { text: "in a call", until: Date.now() + 60_000 });
  setStatus("away", "lunch");
  // @ts-expect-error: not a status one may choose
  setStatus("offline");
  return <p data-idle={String(away)}>{name} {status}</p>;
}

function Chat({ id }: { id: string }) {
  const client: PresenceClient = usePresenceClient();
  const chat = useRoom(id, {
    state: { page: 1 },
    getToken: async (room) => (room.startsWith("doc:") ? "token" : false),
    onSignal: (e) => console.log(e.user, e.device, e.data),
  });
  const other = useRoom("doc:1", { token: "eyJ..." });
  const plain = useRoom("lobby");
  const members: ReadonlyMap<string, readonly Readonly<PresenceClient.RoomDevice>[]> | null = chat.members;
  const typing: readonly string[] = chat.typingUsers;
  const joined: boolean = chat.joined && other.joined && plain.joined;
  const error: PresenceClient.PresenceError | null = chat.error;
  const counts: number = chat.users + chat.devices;
  chat.update({ page: 2 });
  chat.signal({ cursor: [1, 2] });
  chat.typing();
  chat.stopTyping();
  // @ts-expect-error: a room token is a string or false
  useRoom("doc:2", { token: 42 });
  const { users, devices } = useOccupancy(id);
  return <p>{client.user} {members?.size} {typing.join()} {String(joined)} {error?.code} {counts} {users} {devices}</p>;
}

export function App({ client }: { client: PresenceClient }) {
  return (
    <PresenceProvider client={client}>
      <Me />
      <Contacts users={["bob", "carol"]} />
      <Chat id="chat:1" />
    </PresenceProvider>
  );
}

// @ts-expect-error: the provider needs a client
export const missing = <PresenceProvider><Me /></PresenceProvider>;
