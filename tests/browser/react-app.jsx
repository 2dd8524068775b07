// The page the React test bundles: docs/examples/react-chat.jsx as the docs
// show it, started from the query string (?user=&device=&url=&url=&contact=&room=),
// or (?probe=1) components that count their renders, to show which frames
// re-render which components.
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import PresenceClient from "presence-client";
import { PresenceProvider, useRoom, usePresence, useOccupancy, useSelf } from "presence-client/react";
import { start } from "../../docs/examples/react-chat.jsx";

window.PresenceClient = PresenceClient;
window.renders = {};
const rendered = (name) => { window.renders[name] = (window.renders[name] || 0) + 1; };

function RoomProbe({ id, options }) {
  rendered(`room ${id}`);
  const room = useRoom(id, options);
  const members = [...(room.members ?? new Map()).keys()].join(",");
  return <p data-room={id} data-joined={String(room.joined)} data-members={members} data-typing={room.typingUsers.join(",")}
    data-error={room.error?.code ?? ""} />;
}

function SelfProbe() {
  const { user, record, idle } = useSelf();
  return <p data-self={user ?? ""} data-status={record?.status ?? "unknown"} data-idle={String(idle)} />;
}

function UserProbe({ user }) {
  rendered(`user ${user}`);
  const [record] = usePresence([user]);
  return <p data-user={user} data-status={record?.status ?? "unknown"} />;
}

function CountProbe({ id }) {
  rendered(`occupancy ${id}`);
  const { users } = useOccupancy(id);
  return <p data-occupancy={id} data-users={users} />;
}

const params = new URLSearchParams(location.search);
const url = params.getAll("url");
const root = document.getElementById("root");
if (params.get("jwt")) {
  // Token auth: the user comes from hello; rooms under --room-policy token get their room
  // tokens from the client's getToken, or from useRoom's own.
  const client = new PresenceClient({ url, token: params.get("token"), device: "jwt", getToken: (room) => window.clientTokens[room] });
  client.connect();
  window.client = client;
  // Mounted before hello names the user.
  createRoot(document.body.appendChild(document.createElement("div"))).render(<PresenceProvider client={client}><SelfProbe /></PresenceProvider>);
  const byHook = { getToken: (room) => window.hookTokens[room] };
  window.showRooms = (hooked, plain) => createRoot(root).render(
    <PresenceProvider client={client}>
      {hooked.map((id) => <RoomProbe key={id} id={id} options={byHook} />)}
      {plain.map((id) => <RoomProbe key={id} id={id} />)}
    </PresenceProvider>,
  );
} else if (params.get("probe")) {
  const client = new PresenceClient({ url, user: params.get("user"), device: "probe" });
  client.connect();
  window.client = client;
  createRoot(root).render(
    <PresenceProvider client={client}>
      <RoomProbe id="room:a" />
      <RoomProbe id="room:b" />
      <CountProbe id="room:a" />
      <UserProbe user="bob" />
      <UserProbe user="carol" />
    </PresenceProvider>,
  );
  // A component for a user the app watches itself, mounted later, in a root of its own.
  window.showUser = (user) => {
    const el = document.body.appendChild(document.createElement("div"));
    createRoot(el).render(<PresenceProvider client={client}><UserProbe user={user} /></PresenceProvider>);
  };
  // A room's only component, mounted under StrictMode (mount, unmount, mount) while connected.
  window.showRoom = (id) => {
    const el = document.body.appendChild(document.createElement("div"));
    createRoot(el).render(<StrictMode><PresenceProvider client={client}><RoomProbe id={id} /></PresenceProvider></StrictMode>);
  };
} else {
  window.client = start(root, {
    url, user: params.get("user"), device: params.get("device"), contacts: params.getAll("contact"), room: params.get("room"),
  });
}
