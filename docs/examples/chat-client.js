// chat-client.js: the browser side of docs/rooms-guide.md, with the JS client
// (a <script src="/presence-client.js"> gives window.PresenceClient).
//
//   const client = connectChat({ PresenceClient, url: "wss://chat.example.com/ws",
//                                backend: "https://chat.example.com", device: "tab-1", token });
//   const chat = client.join("chat:7");                   // members: no room token
//   const doc = client.join("doc:42", { state: { page: 1 } }); // token: getToken asks the backend
//   chat.onError = (e) => showBanner(roomErrorText(e));
"use strict";

function connectChat({ PresenceClient, url, backend, device, token, ...options }) {
  const client = new PresenceClient({
    url,
    device,
    token, // the connection token from your sign-in (add refreshToken, see docs/client.md)
    // doc:* rooms take a room token from the backend; every other room takes none.
    getToken: (room) =>
      room.startsWith("doc:")
        ? fetch(`${backend}/presence/room-token?room=${encodeURIComponent(room)}`, {
            headers: { authorization: `Bearer ${token}` }, // your app's session, really
          }).then((r) => (r.ok ? r.text() : Promise.reject(new Error(`HTTP ${r.status}`))))
        : false,
    ...options,
  });
  client.connect();
  return client;
}

/** What an error about a room means for the person looking at it; null: nothing to say. */
function roomErrorText(e) {
  switch (e.code) {
    case "forbidden":
      return "You don't have access to this room.";
    case "removed":
      return "You were removed from this room.";
    case "token_expired": // the client asks getToken and joins again, once
      return e.willRetry ? null : "Your access to this room has ended.";
    case "unavailable": // the client tries again, with backoff, a few times
      return e.willRetry ? "Connecting to this room…" : "This room can't be reached right now. Try again later.";
    case "client": // getToken failed: the backend refused a room token, or did not answer
      return "You don't have access to this room, or it can't be reached right now.";
    default:
      return e.willRetry === false ? `This room is closed (${e.code}).` : null;
  }
}

if (typeof module !== "undefined") module.exports = { connectChat, roomErrorText };
