//! The integration tests: real redis-servers, server nodes as separate
//! processes and real WebSocket clients (the harness is `common`). One test
//! binary, so that a change to the server links the tests once, not once per
//! file. Run one module with `cargo test --test it <module>::`.

mod common;

mod admission;
mod bench_smoke;
mod chaos;
mod cluster;
mod config;
mod cursors;
mod dashboard;
mod deploy;
mod devices_watch;
mod docs;
mod edge;
mod feed;
mod feed_chaos;
mod fuzz;
mod grants;
mod hostile;
mod http_api;
mod http_devices;
mod identity;
mod idle;
mod interest;
mod layout;
mod limits;
mod local_redis;
mod managed;
mod metrics;
mod online_list;
mod openapi;
mod pause;
mod presence;
mod privacy_matrix;
mod probes;
mod protocol;
mod proxy;
mod recipes;
mod refresh;
mod reliability;
mod retention;
mod room_access;
mod room_proxy;
mod room_revoke;
mod room_token;
mod rooms;
mod rooms_abuse;
mod rooms_chaos;
mod rooms_privacy;
mod scale;
mod security;
mod sentinel;
mod service_view;
mod slow_redis;
mod startup;
mod static_pages;
mod walkthrough;
mod webhooks;
