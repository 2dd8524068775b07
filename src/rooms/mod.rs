//! Rooms: presence in a place (who is in this conversation, viewing this
//! document, in this call), beside user presence.
//!
//! A device joins a room with a small state; the members see who is here,
//! grouped by user, with each device's state, and exactly one join when a
//! user's first device arrives and one leave when its last one goes, on
//! every node. Signals (typing, cursors) are relayed to the other members
//! and never stored.
//!
//! - [`events`]: the room events as Redis publishes them, and the frames
//!   a member gets for them (`room`, `room_join`, `room_leave`,
//!   `room_update`, `signal`).
//! - [`grant`]: who may join which room (`--room-policy`, the token's
//!   rooms claim).
//! - [`held`]: the rooms one session is in, and what it told its client of
//!   each.
//! - [`proxy`]: the `proxy` policy: the app's backend asked, its answers
//!   cached and its requests bounded.
//! - [`token`]: the room tokens one session holds (`--room-policy token`):
//!   when each lapses, and the one timer that warns and expires them.
//!
//! The Redis steps are the store's (`store::rooms`, `src/lua/room_*.lua`);
//! the registry subscribes a node to a room's channel while one of its
//! sessions is in the room, and the session routes the room frames here.

pub mod events;
pub mod grant;
pub mod held;
pub mod proxy;
pub mod token;

pub use events::{RoomDeliver, RoomEvent};
pub use grant::allows;
pub use held::{Held, Rooms};
