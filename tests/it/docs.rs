//! The docs say what the code does: every flag of `--help` is in a flag
//! table under docs/ with its environment variable and its default, every
//! flag those tables name exists, the fixed limits quoted in
//! docs/security.md are the constants the code uses, and every relative
//! link of the README and docs/ leads to a file (and heading) that exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use presence_server::config;
use presence_server::http;

use crate::common::binary;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn doc_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    files.sort();
    files
}

/// What `--help` says of one flag.
#[derive(Debug, Default)]
struct HelpFlag {
    env: Option<String>,
    default: Option<String>,
}

/// Every long flag of `presence-server --help`, with its env and default.
fn help_flags() -> BTreeMap<String, HelpFlag> {
    let out = std::process::Command::new(binary())
        .arg("--help")
        .env_remove("TMPDIR")
        .output()
        .expect("presence-server --help");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("--") || t.starts_with("-h, --") || t.starts_with("-V, --") {
            let name = t
                .split(|c: char| c.is_whitespace() || c == ',')
                .find(|w| w.starts_with("--"))
                .unwrap()
                .to_string();
            flags.insert(name.clone(), HelpFlag::default());
            current = Some(name);
        } else if let (Some(name), Some(env)) = (&current, t.strip_prefix("[env: ")) {
            let env = env.trim_end_matches(']').trim_end_matches('=').to_string();
            flags.get_mut(name).unwrap().env = Some(env);
        } else if let (Some(name), Some(d)) = (&current, t.strip_prefix("[default: ")) {
            flags.get_mut(name).unwrap().default = Some(d.trim_end_matches(']').to_string());
        }
    }
    flags.remove("--help");
    flags.remove("--version");
    flags
}

/// One row of a `| flag | env | default | meaning |` table.
#[derive(Debug)]
struct DocRow {
    file: String,
    env: String,
    default: String,
}

/// The flags named in the first cell of the docs' flag tables.
fn documented_flags() -> BTreeMap<String, DocRow> {
    let mut rows = BTreeMap::new();
    for file in doc_files() {
        let mut in_table = false;
        for line in read(&file).lines() {
            if line.starts_with("| flag | env | default |") {
                in_table = true;
                continue;
            }
            if !line.starts_with('|') {
                in_table = false;
                continue;
            }
            if !in_table || line.starts_with("|---") {
                continue;
            }
            let cells: Vec<&str> = line.split(" | ").collect();
            let (flag_cell, env, default) = (cells[0], cells[1], cells[2]);
            for flag in flag_cell.split('`').filter(|w| w.starts_with("--")) {
                rows.insert(
                    flag.to_string(),
                    DocRow {
                        file: file.clone(),
                        env: env.to_string(),
                        default: default.to_string(),
                    },
                );
            }
        }
    }
    rows
}

#[test]
fn every_flag_is_documented_with_its_env_and_default_and_no_other() {
    let help = help_flags();
    let docs = documented_flags();
    assert!(help.len() > 50, "--help lists few flags: {help:?}");
    let missing: Vec<_> = help.keys().filter(|f| !docs.contains_key(*f)).collect();
    assert!(
        missing.is_empty(),
        "flags of --help missing from the flag tables under docs/: {missing:?}"
    );
    let unknown: Vec<_> = docs.keys().filter(|f| !help.contains_key(*f)).collect();
    assert!(
        unknown.is_empty(),
        "flags documented under docs/ that --help does not have: {unknown:?}"
    );
    let mut wrong = Vec::new();
    for (flag, h) in &help {
        let row = &docs[flag];
        if row.default.trim().is_empty() {
            wrong.push(format!("{flag} ({}): no default", row.file));
        }
        if let Some(env) = &h.env {
            if !row.env.contains(&format!("`{env}`")) && !row.env.contains("PRESENCE_WEBHOOK_*") {
                wrong.push(format!(
                    "{flag} ({}): env {env}, documented {}",
                    row.file, row.env
                ));
            }
        }
        if let Some(d) = &h.default {
            if !row.default.contains(&format!("`{d}`")) {
                wrong.push(format!(
                    "{flag} ({}): default {d}, documented {}",
                    row.file, row.default
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "docs disagree with --help:\n{}",
        wrong.join("\n")
    );
}

/// The default cell of the Limits table's row that starts with `limit`.
fn limit_row(limit: &str) -> String {
    let doc = read("docs/security.md");
    let start = doc
        .find("## Limits")
        .expect("docs/security.md has a Limits section");
    doc[start..]
        .lines()
        .find(|l| l.starts_with(&format!("| {limit} |")))
        .unwrap_or_else(|| panic!("no Limits row for {limit}"))
        .split(" | ")
        .nth(2)
        .unwrap()
        .to_string()
}

fn assert_quotes(limit: &str, n: usize) {
    let cell = limit_row(limit);
    // The first number of the cell, `1,000` read as 1000.
    let first: String = cell
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    assert_eq!(
        first.parse::<usize>().ok(),
        Some(n),
        "Limits, {limit}: the code says {n}, the docs say {cell}"
    );
}

#[test]
fn the_fixed_limits_in_the_docs_are_the_code_constants() {
    assert_eq!(
        limit_row("bulk query body"),
        format!("{} KiB", http::MAX_QUERY_BODY / 1024)
    );
    assert_quotes("users per bulk query", config::MAX_QUERY_USERS);
    assert_quotes("contacts per user", http::MAX_CONTACTS);
    assert_quotes("`GET /api/events` page", http::EVENTS_MAX_LIMIT);
    assert_quotes("`GET /api/online` page", http::ONLINE_MAX_LIMIT);
    assert_quotes("`GET /api/rooms/{room}` page", http::ROOM_PAGE_MAX_LIMIT);
    assert!(
        limit_row("`GET /api/rooms/{room}` page").contains(&format!(
            "{} KiB of states",
            presence_server::store::rooms::MAX_PAGE_BYTES / 1024
        )),
        "Limits, room page: the code's byte cap is {} B",
        presence_server::store::rooms::MAX_PAGE_BYTES
    );
    assert_quotes(
        "HTTP reads in flight per client",
        config::DEFAULT_HTTP_READS_IN_FLIGHT as usize,
    );
    assert_quotes("status text", config::MAX_STATUS_TEXT);
    assert_quotes("signal data size", config::MAX_SIGNAL_BYTES);
    assert_quotes("frame or message size", config::DEFAULT_MAX_FRAME_BYTES);
    assert_quotes("watched users per session", config::DEFAULT_MAX_WATCHES);
    assert_quotes(
        "devices per user",
        config::DEFAULT_MAX_DEVICES_PER_USER as usize,
    );
    assert_quotes(
        "events waiting for a slow client",
        config::DEFAULT_MAX_QUEUED_EVENTS,
    );
    assert_quotes("rooms per device", config::DEFAULT_MAX_ROOMS_PER_DEVICE);
    assert_quotes(
        "answers of the room-join backend kept",
        presence_server::rooms::proxy::cache::MAX_ENTRIES,
    );
    assert_quotes(
        "requests to the room-join backend (`proxy` rooms)",
        presence_server::rooms::proxy::DEFAULT_MAX_IN_FLIGHT as usize,
    );
    assert_quotes(
        "devices per room",
        config::DEFAULT_MAX_ROOM_DEVICES as usize,
    );
    assert_quotes("room state size", config::DEFAULT_MAX_ROOM_STATE_BYTES);
    assert_quotes(
        "frames per second per session",
        config::DEFAULT_MAX_FRAMES_PER_SEC as usize,
    );
    assert_quotes(
        "signal frames (and joins that change the state)",
        config::DEFAULT_MAX_ROOM_MESSAGES_PER_SEC as usize,
    );
    assert_quotes(
        "room state writes and updates",
        config::DEFAULT_ROOM_STATE_HZ as usize,
    );
    assert_quotes("silence", config::DEFAULT_HEARTBEAT.as_millis() as usize);
    assert_quotes(
        "WebSockets per client address",
        config::DEFAULT_MAX_CONNECTIONS_PER_IP as usize,
    );
    assert_quotes(
        "sockets awaiting their `auth` frame (JWT)",
        config::DEFAULT_MAX_PENDING_AUTH as usize,
    );
    assert_quotes(
        "new sessions setting up at once",
        config::DEFAULT_MAX_PENDING_CLAIMS as usize,
    );
    assert_quotes(
        "sockets awaiting their `auth` frame from one address (JWT)",
        presence_server::admission::MAX_PENDING_AUTH_PER_ADDRESS as usize,
    );
    assert_quotes(
        "a message before auth (JWT)",
        config::DEFAULT_MAX_AUTH_FRAME_BYTES,
    );
    assert_quotes(
        "HTTP reads per client",
        config::DEFAULT_HTTP_READS_PER_SEC as usize,
    );
    assert_quotes(
        "HTTP reads with the admin or service key",
        config::DEFAULT_SERVICE_READS_PER_SEC as usize,
    );
    assert_quotes(
        "users added to a session's watches per second",
        config::DEFAULT_MAX_USER_READS_PER_SEC as usize,
    );
    assert_quotes(
        "lingering subscriptions",
        presence_server::registry::MAX_LINGERING,
    );
    assert_quotes(
        "a status's `until`",
        (presence_server::model::MAX_UNTIL_AHEAD_MS / 86_400_000) as usize,
    );
    assert_quotes(
        "the recently-seen window (`seen_within_ms`)",
        (http::MAX_SEEN_WITHIN_MS / 86_400_000) as usize,
    );
}

/// GitHub's anchor of a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

pub(crate) fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_docs_leads_somewhere() {
    let mut files = vec![
        "README.md".to_string(),
        "BENCHMARKS.md".to_string(),
        "clients/js/README.md".to_string(),
        "clients/python/README.md".to_string(),
    ];
    files.extend(doc_files());
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file);
        let dir = Path::new(file).parent().unwrap().to_path_buf();
        for piece in text.split("](").skip(1) {
            let Some(target) = piece.split(')').next() else {
                continue;
            };
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if path.is_empty() {
                PathBuf::from(file)
            } else {
                dir.join(path)
            };
            let full = root().join(&resolved);
            if !full.exists() {
                broken.push(format!("{file}: {target} (no {})", resolved.display()));
                continue;
            }
            if !anchor.is_empty() {
                let body = std::fs::read_to_string(&full).unwrap_or_default();
                if !anchors(&body).iter().any(|a| a == anchor) {
                    broken.push(format!("{file}: {target} (no heading #{anchor})"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_short() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; the manual belongs under docs/"
    );
}

/// The deploy files' comments send an operator to docs: each `docs/*.md` they
/// name exists, and none points to a README section (the README has none of
/// the manual: it lives under docs/).
#[test]
fn the_deploy_files_point_to_docs_that_exist() {
    let mut broken = Vec::new();
    for entry in std::fs::read_dir(root().join("deploy")).unwrap() {
        let path = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for word in text.split(|c: char| c.is_whitespace() || "(),;`'\"".contains(c)) {
            if word.starts_with("docs/") && word.ends_with(".md") && !root().join(word).exists() {
                broken.push(format!("deploy/{name}: {word} does not exist"));
            }
        }
        if text.contains("README, \"") || text.contains("see README") {
            broken.push(format!(
                "deploy/{name}: points to the README; the manual is under docs/"
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
