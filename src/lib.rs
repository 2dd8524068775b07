//! # presence-server
//!
//! Who is online, on which devices, with which status: one WebSocket per
//! device, a lease per device in Redis, and each change pushed to the
//! sessions that watch that user, on every node of a fleet.
//!
//! # Layout
//! Lower modules never name higher ones; a test (`tests/it/layout.rs`)
//! fails on an import cycle between these modules, a file over 700 lines
//! or a function over 100.
//!
//! Foundations (name nothing above them):
//! - [`ids`]: user, device and node ids, checked.
//! - [`clock`]: epoch ms, and noticing that the process was frozen.
//! - [`bucket`]: a token bucket, for every per-client rate.
//! - [`model`]: statuses, a user's presence, the record a viewer sees.
//! - [`privacy`]: the one place that turns the truth into a viewer's view.
//! - [`keys`]: the Redis key schema.
//! - [`metrics`]: counters and gauges for `/metrics`.
//! - [`logging`]: log lines that name their node.
//! - [`proxy`]: the client's address behind trusted proxies.
//! - [`admission`]: what one client may hold and cost: WebSockets per
//!   address, sockets awaiting auth, the HTTP API's read budget.
//! - [`config`], [`config_file`]: timings and limits; the TOML file.
//! - [`protocol`]: the WebSocket frames, parsed and built.
//! - [`frames`]: WebSocket frame rules beneath the JSON (close codes,
//!   fragments).
//! - [`conn`]: a client's TCP connection, to cut from outside its session.
//! - [`auth`]: development ids or JSON Web Tokens; origins and hosts.
//!
//! Redis and state:
//! - [`redis`]: the one way to connect (one server, Sentinel, Cluster, the
//!   private local server), the connection type, health, pub/sub.
//! - [`webhooks`]: each transition this node makes, POSTed in signed batches.
//! - [`store`]: every Redis read and write, with its Lua steps (`src/lua/`).
//! - [`lease`]: the node's side of a device lease: batched refreshes,
//!   release after a close.
//! - [`expiry`]: the expiry listener: lapsed leases become departures
//!   (expired events of every primary, the deadline pass, reconciliation);
//!   statuses whose `until` came are reset by the same pass.
//! - [`registry`]: which local sessions watch which users; sharded
//!   subscriptions; fan-out of each event to its watchers.
//! - [`rooms`]: presence in a place: room events and frames, who may join,
//!   what a session told its client of each room (its Redis steps are the
//!   store's, `store::rooms`).
//! - [`node`]: the shared parts of a node (store, refresher, registry,
//!   config) in one handle.
//!
//! Transport and wiring:
//! - [`session`]: the actor per WebSocket: it authenticates, keeps the lease
//!   alive and routes each client frame to the feature it belongs to (user
//!   presence in `watches.rs`, rooms in `rooms.rs`).
//! - [`http`]: the upgrade, the read API, users' settings and the admin
//!   API, HTTP heartbeat devices and statuses (`http/devices/`),
//!   operations, OpenAPI and the demo page.
//! - [`server`]: starting a node: Redis, the actors, the HTTP servers.
//!
//! # Two paths through them
//! A client frame: the socket's bytes reach [`session`] (`stream.rs` routes
//! the frame); a `watch` asks [`registry`] to subscribe to the user's channel
//! and reads the snapshot through [`store`], filtered by [`privacy`]; a
//! `status` runs a [`store`] step whose Lua script publishes the change; a
//! `join` subscribes the node to the room's channel ([`registry`]), then runs
//! the room step, whose reply is the room frame ([`rooms`]).
//!
//! A Redis event: a change published with SPUBLISH inside a [`store`] step
//! reaches every node subscribed to the user's channel ([`registry`]'s
//! subscriptions), which hands one serialized frame to each local watcher's
//! session ([`registry`]'s fan-out); a lapsed lease's `expired` event reaches
//! [`expiry`], which runs the same departure step as a clean close, and so
//! publishes the same event. A room's events come the same way on the room's
//! channel, and [`registry`] hands them to the room's local members.

pub mod admission;
pub mod auth;
pub mod bucket;
pub mod clock;
pub mod config;
pub mod config_file;
pub mod conn;
pub mod expiry;
pub mod feed;
pub mod frames;
pub mod http;
pub mod ids;
pub mod keys;
pub mod lease;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod node;
pub mod privacy;
pub mod protocol;
pub mod proxy;
pub mod readiness;
pub mod redis;
pub mod registry;
pub mod rooms;
pub mod server;
pub mod session;
pub mod store;
pub mod webhooks;
