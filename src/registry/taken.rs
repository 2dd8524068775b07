//! Word from other nodes about this node's sockets, on the node's own
//! channel (`presence-events-node:{n:<run>}`, subscribed for the node's whole
//! life): a device one of its sessions held was taken away (`DELETE`) or
//! over (an HTTP heartbeat) from outside the connection. The word names the
//! connection by its lease value, which is its session's id here, so no
//! table per session is kept for it; the session checks the user and
//! device and closes with 4001 at once, rather than when its next refresh
//! finds the lease replaced.

use super::{End, Registry};
use crate::store::NodeNotice;

impl Registry {
    /// A payload on this node's own channel.
    pub(super) fn node_notice(&mut self, payload: &str) {
        let notice: NodeNotice = match serde_json::from_str(payload) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("ignoring a malformed word on this node's channel ({e}): {payload}");
                return;
            }
        };
        match notice {
            NodeNotice::Taken {
                user,
                device,
                owner,
                why,
            } => {
                // A session of this node that closed meanwhile (or of an
                // earlier node of this run) is no longer here: nothing to do.
                let Some(joined) = owner.parse().ok().and_then(|id| self.sessions.get(&id)) else {
                    log::debug!("{user}/{device}: taken, but its connection {owner} is not here");
                    return;
                };
                joined.end.do_send(End::Taken { user, device, why });
            }
        }
    }
}
