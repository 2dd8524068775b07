//! `presence-server --check-config`: the flags, environment and config
//! file checked as a start would check them, without binding a port or
//! connecting to anything; the effective settings printed, secrets masked.
//! For deploy pipelines and the tests that keep `deploy/` true.

use std::net::ToSocketAddrs;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::CommandFactory;

use presence_server::redis::redact;

use crate::args::{self, Args};
use crate::Settings;

/// Flags that choose what the binary does rather than how a node runs.
const MODES: &[&str] = &["help", "version", "check_config"];

/// Prints the effective settings and returns 0, or the reason the node
/// would not start and 1.
pub fn run(args: &Args, settings: anyhow::Result<Settings>) -> ExitCode {
    let settings = match settings.and_then(|s| listen_addresses(args).map(|()| s)) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("presence-server: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = effective(&Args::command());
    for var in unread_env() {
        out.push_str(&format!("# warning: {var} is set, but no flag reads it\n"));
    }
    let config = &settings.config;
    out.push_str(&format!(
        "# lease ttl {} ms, heartbeat {} ms\n",
        config.ttl.as_millis(),
        config.heartbeat.as_millis()
    ));
    let redis = &settings.redis;
    let target = match (&redis.url, redis.sentinels.is_empty()) {
        (Some(url), _) => redact(url),
        (None, false) => format!("sentinels {}", redis.sentinels.join(",")),
        (None, true) => "a private redis-server (no --redis-url)".to_string(),
    };
    out.push_str(&format!("# redis: {target}\n"));
    out.push_str(&format!(
        "# room policies: {}\n",
        config.rooms.policies.describe()
    ));
    out.push_str("# configuration ok\n");
    // A closed pipe (`| head`) is no error of the configuration.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    ExitCode::SUCCESS
}

/// The `PRESENCE_*` variables of this process that no flag reads: a typo
/// (`PRESENCE_ALLOWED_ORIGIN`) would otherwise be ignored without a word.
pub fn unread_env() -> Vec<String> {
    let command = Args::command();
    let read: std::collections::BTreeSet<String> = command
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    let mut unread: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("PRESENCE_") && !read.contains(k))
        .collect();
    unread.sort();
    unread
}

/// The listen addresses resolve (nothing is bound).
fn listen_addresses(args: &Args) -> anyhow::Result<()> {
    let internal = args
        .internal_listen
        .iter()
        .map(|a| ("--internal-listen", a));
    for (flag, addr) in std::iter::once(("--listen", &args.listen)).chain(internal) {
        addr.to_socket_addrs()
            .map_err(|e| anyhow::anyhow!("{flag} {addr}: not an address to listen on: {e}"))?;
    }
    Ok(())
}

/// One `--flag = value  # source` line per flag of `command`, as parsed
/// from this process's arguments and environment (the config file's keys
/// are in the environment by now).
fn effective(command: &clap::Command) -> String {
    let matches = command.clone().get_matches();
    let from_file = args::from_config_file();
    let mut out = String::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long().filter(|_| !MODES.contains(&id)) else {
            continue;
        };
        let value = match matches.get_raw(id) {
            Some(values) => {
                let values: Vec<String> =
                    values.map(|v| v.to_string_lossy().into_owned()).collect();
                let value = values.join(",");
                if arg.is_hide_env_values_set() {
                    mask(long, &value)
                } else {
                    value
                }
            }
            None => "(not set)".to_string(),
        };
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) => "flag".to_string(),
            Some(ValueSource::EnvVariable) => match env {
                Some(env) if from_file.contains(&env) => "config file".to_string(),
                Some(env) => format!("env {env}"),
                None => "env".to_string(),
            },
            Some(ValueSource::DefaultValue) => "default".to_string(),
            _ => "default".to_string(),
        };
        out.push_str(&format!("--{long} = {value}  # {source}\n"));
    }
    out
}

/// A secret as printed: the URLs of a `--*-url` flag keep their scheme,
/// host and path, and lose the password and the query string (webhook
/// URLs carry tokens there); any other secret is `***`.
fn mask(long: &str, value: &str) -> String {
    if !long.ends_with("-url") {
        return "***".to_string();
    }
    // A comma inside a password must not split the URL it belongs to: a
    // piece without a scheme goes with the one before it.
    let mut urls: Vec<String> = Vec::new();
    for piece in value.split(',') {
        match urls.last_mut() {
            Some(last) if !piece.contains("://") => {
                last.push(',');
                last.push_str(piece);
            }
            _ => urls.push(piece.to_string()),
        }
    }
    let masked: Vec<String> = urls
        .iter()
        .map(|url| match url.split_once('?') {
            Some((base, _)) => format!("{}?***", redact(base)),
            None => redact(url),
        })
        .collect();
    masked.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked() {
        assert_eq!(mask("jwt-secret", "s3cret-s3cret"), "***");
        assert_eq!(mask("jwt-secret", "abc://user:pw@x,0123"), "***");
        assert_eq!(
            mask("redis-url", "rediss://app:p@ss@redis.example:6380/0"),
            "rediss://app:***@redis.example:6380/0"
        );
        assert_eq!(
            mask("redis-url", "redis://u:pa,ss@h:1/0,redis://h2:2"),
            "redis://u:***@h:1/0,redis://h2:2"
        );
        assert_eq!(
            mask("redis-url", "redis://10.0.0.6:6379/0"),
            "redis://10.0.0.6:6379/0"
        );
        assert_eq!(
            mask("webhook-url", "https://u:pw@hook.example/x?token=qq"),
            "https://u:***@hook.example/x?***"
        );
    }
}
