//! A device's lease in Redis, from the node's side: refreshing every
//! session's lease in batches ([`refresh`]) and releasing a device whose
//! connection closed ([`release`]). Claiming is the session's first
//! refresh ([`crate::store::ArriveMode`]).

pub mod refresh;
pub mod release;

pub use refresh::{LeaseState, Refreshed, Refresher};
pub use release::{release, release_with};
