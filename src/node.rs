//! The parts of a node that every session and every HTTP handler shares,
//! in one handle: the store, the lease refresher, the registry and the
//! settings. Built once at start (`server::run`) and shared behind an
//! `Arc`.

use std::sync::Arc;

use actix::Addr;

use crate::admission::ConnLimits;
use crate::config::Config;
use crate::lease::{Claimer, Refresher};
use crate::registry::Registry;
use crate::rooms::proxy::RoomProxy;
use crate::store::Store;

/// One node's shared parts; cheap to share (`Arc<Node>`).
pub struct Node {
    /// Redis state.
    pub store: Store,
    /// Batches and bounds this node's lease claims.
    pub claimer: Claimer,
    /// Batches this node's lease refreshes.
    pub refresher: Refresher,
    /// This node's registry.
    pub registry: Addr<Registry>,
    /// Timings and limits.
    pub config: Arc<Config>,
    /// Open WebSockets per client address, and sockets awaiting auth.
    pub conns: Arc<ConnLimits>,
    /// Asks the app's backend about joins to `proxy` rooms
    /// (`--room-join-url`); `None` when no room has that policy.
    pub room_proxy: Option<Arc<RoomProxy>>,
}
