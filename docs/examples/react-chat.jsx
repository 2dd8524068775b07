// A chat page with presence-client/react: your status, your contacts' dots,
// and a room with who is here and who is typing.
import { StrictMode, useState } from "react";
import { createRoot } from "react-dom/client";
import PresenceClient from "presence-client";
import { PresenceProvider, usePresence, useSelf, useRoom, useOccupancy } from "presence-client/react";

function MyStatus() {
  const { user, record, setStatus } = useSelf(); // own record: the server's answer to setStatus
  return (
    <p className="me" data-status={record?.status ?? "unknown"}>
      {user}{" "}
      <select value={record?.status ?? "online"} onChange={(e) => setStatus(e.target.value)}>
        {PresenceClient.STATUSES.map((s) => <option key={s} value={s}>{s}</option>)}
      </select>
    </p>
  );
}

function Contacts({ users }) {
  const records = usePresence(users); // same order as users; null until the first snapshot
  return (
    <ul className="contacts">
      {users.map((user, i) => (
        <li key={user} data-user={user} data-status={records[i]?.status ?? "unknown"}>
          {user}: {records[i]?.status ?? "…"}
        </li>
      ))}
    </ul>
  );
}

function Chat({ room }) {
  const chat = useRoom(room, { state: { view: "chat" } }); // joins on mount, leaves on unmount
  const [draft, setDraft] = useState("");
  const typing = chat.typingUsers;
  if (chat.error && !chat.joined) return <p className="chat-error">{chat.error.code}: {chat.error.message}</p>;
  return (
    <section className="chat" data-joined={String(chat.joined)}>
      <p className="typing">
        {typing.length === 1 ? `${typing[0]} is typing…` : typing.length ? `${typing.join(", ")} are typing…` : ""}
      </p>
      <ul className="members">
        {[...(chat.members ?? [])].map(([user, devices]) => <li key={user} data-user={user}>{user} ({devices.length})</li>)}
      </ul>
      <form onSubmit={(e) => { e.preventDefault(); chat.stopTyping(); setDraft(""); }}>
        <input value={draft} onChange={(e) => { setDraft(e.target.value); e.target.value ? chat.typing() : chat.stopTyping(); }} />
        <button>Send</button>
      </form>
    </section>
  );
}

function HereCount({ room }) {
  const { users } = useOccupancy(room); // re-renders only when the counts change
  return <span className="here">{users} here</span>;
}

export function App({ client, contacts, room }) {
  const [inRoom, setInRoom] = useState(true);
  return (
    <PresenceProvider client={client}>
      <MyStatus />
      <Contacts users={contacts} />
      <h2>{room} {inRoom && <HereCount room={room} />}</h2>
      <button className="toggle" onClick={() => setInRoom(!inRoom)}>{inRoom ? "Leave" : "Join"}</button>
      {inRoom && <Chat room={room} />}
    </PresenceProvider>
  );
}

/** Connects as `user` on `device` (url: one node, or a list tried in turn) and renders the page into `element`. */
export function start(element, { url, user, device, contacts, room }) {
  const client = new PresenceClient({ url, user, device });
  client.connect();
  createRoot(element).render(
    <StrictMode>
      <App client={client} contacts={contacts} room={room} />
    </StrictMode>,
  );
  return client;
}
