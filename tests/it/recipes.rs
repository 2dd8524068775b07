//! The HS256 JWT recipe of docs/security.md is pasted into bash as printed
//! (all of it on bash's standard input, as a paste arrives)
//! (on a fresh port instead of 8090, with the binary under test as
//! `presence-server` on the PATH) and must print what the doc says it
//! prints, keep its keys out of the server's output, and stop its server.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// How long the whole recipe may take (the server starts its own Redis).
const RECIPE_DEADLINE: Duration = Duration::from_secs(90);

/// The first fenced block after `marker` in `doc`, and the first fenced
/// block after that one (the output the doc shows).
fn block_and_output(doc: &str, marker: &str) -> (String, String) {
    let rest = &doc[doc.find(marker).unwrap_or_else(|| panic!("no {marker}"))..];
    let mut blocks = rest.split("```").skip(1).step_by(2).map(|b| {
        // Drop the info string (`sh`, `text`).
        b.split_once('\n')
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    });
    (blocks.next().unwrap(), blocks.next().unwrap())
}

#[test]
fn the_hs256_recipe_works_when_pasted() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md"))
            .unwrap();
    let (script, printed) = block_and_output(&doc, "<!-- recipe: hs256 -->");
    assert!(
        script.contains("8090"),
        "the recipe runs on its own port:\n{script}"
    );
    assert!(
        !script.contains("8080"),
        "the recipe must not talk to the quick-start server:\n{script}"
    );
    let port = free_port();
    let script = script.replace("8090", &port.to_string());

    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(binary(), bin.join("presence-server")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // As a paste: bash reads the recipe from its standard input, line by
    // line, so a command that reads its input (wscat does) would eat the
    // lines after it, and they would never run.
    let mut child = Command::new("bash")
        .arg("-s")
        .current_dir(dir.path())
        .env("PATH", path)
        .env("PRESENCE_LOCAL_REDIS_DIR", dir.path())
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash");
    // The whole paste at once, then the end of the input (a terminal's stays
    // open, which only matters to a command that should not read it anyway).
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).unwrap();
    drop(stdin);
    let deadline = Instant::now() + RECIPE_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the recipe did not finish within {RECIPE_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let demo = dir.path().join("jwt-demo");
    let log = std::fs::read_to_string(demo.join("server.log")).unwrap_or_default();
    let context = format!(
        "stdout:\n{out}\nstderr:\n{err}\nserver.log:\n{log}\n(wscat missing? npm install -g wscat)"
    );
    assert!(status.success(), "{status}\n{context}");

    // It prints the admin key it saved, then what the doc shows.
    let admin_key = std::fs::read_to_string(demo.join("admin-key")).unwrap();
    let admin_key = admin_key.trim();
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(format!("admin key: {admin_key} (saved in jwt-demo/admin-key)").as_str()),
        "{context}"
    );
    let got: Vec<&str> = lines.collect();
    let want: Vec<&str> = printed.lines().collect();
    assert_eq!(
        got, want,
        "the recipe prints other lines than the doc\n{context}"
    );

    // No key in the server's output.
    let secret = std::fs::read_to_string(demo.join("jwt-secret")).unwrap();
    assert!(
        !log.contains(secret.trim()),
        "the secret is in the log:\n{log}"
    );
    assert!(
        !log.contains(admin_key),
        "the admin key is in the log:\n{log}"
    );
    assert!(log.contains("listening on"), "{context}");

    // The server stopped, and took its private Redis and its directory along.
    let pid: i32 = std::fs::read_to_string(demo.join("server.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only checks whether the process exists.
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "the server still runs");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("presence-redis-"))
        .collect();
    assert!(left.is_empty(), "private Redis directories left: {left:?}");
}
