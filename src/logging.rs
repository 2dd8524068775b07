//! Log lines that say which node wrote them: several nodes usually log into
//! one place, and a line without its node is of little use there.
//!
//! Text (the default), one line per record:
//! `2026-11-21T10:04:14.123Z INFO  node=presence-1a2b presence_server::server: message`
//!
//! JSON (`--log-format json`), one object per line for log shippers:
//! `{"ts":"2026-11-21T10:04:14.123Z","level":"INFO","node":"presence-1a2b","target":"presence_server::server","msg":"message"}`

use std::io::Write as _;

/// How log records are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per record.
    Text,
    /// One JSON object per line.
    Json,
}

/// One JSON log line; fields in the order a reader scans them.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    /// RFC 3339 time, ms, UTC.
    ts: String,
    /// ERROR, WARN, INFO, DEBUG or TRACE.
    level: &'a str,
    /// The node that wrote the line.
    node: &'a str,
    /// The module that logged.
    target: &'a str,
    /// The message.
    msg: String,
}

/// Installs the global logger: level filter from `RUST_LOG` (default
/// `info`), every record stamped with `node`.
pub fn init(node: &str, format: LogFormat) {
    let node = node.to_string();
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    match format {
        LogFormat::Text => builder.format(move |buf, record| {
            writeln!(
                buf,
                "{} {:<5} node={} {}: {}",
                buf.timestamp_millis(),
                record.level(),
                node,
                record.target(),
                record.args()
            )
        }),
        LogFormat::Json => builder.format(move |buf, record| {
            let line = JsonLine {
                ts: buf.timestamp_millis().to_string(),
                level: record.level().as_str(),
                node: &node,
                target: record.target(),
                msg: record.args().to_string(),
            };
            // Serializing strings cannot fail.
            let line = serde_json::to_string(&line).unwrap_or_default();
            writeln!(buf, "{line}")
        }),
    };
    builder.init();
}
