//! A device's lease in Redis, from the node's side: claiming it when a
//! session connects, in bounded batches ([`claim`]), refreshing every
//! session's lease in batches ([`refresh`]) and releasing a device whose
//! connection closed ([`release`]).

pub mod claim;
pub mod refresh;
pub mod release;
pub mod shed;

pub use claim::{Busy, Claimer};
pub use refresh::{LeaseState, Refreshed, Refresher};
pub use release::{release, release_with};
