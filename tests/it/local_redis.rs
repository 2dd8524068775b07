//! The private Redis of a node started without `--redis-url`: a directory
//! left behind by a node killed with SIGKILL is removed by the next start,
//! and a directory whose owner still runs is left alone.

use std::path::Path;

use crate::common::*;

/// The private-Redis directories under `dir`.
fn private_dirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("presence-redis-"))
        .collect();
    names.sort();
    names
}

fn start_private(dir: &Path, id: &str) -> Node {
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--node-id",
        id,
        "--local-redis-dir",
        dir.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Node::spawn(id, &args, &[]).unwrap_or_else(|logs| panic!("{id} did not start:\n{logs}"))
}

#[tokio::test]
async fn a_crashed_nodes_private_redis_dir_is_removed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start_private(dir.path(), "crashes");
    let first_dir = format!("presence-redis-{}-", first.pid());
    let dirs = private_dirs(dir.path());
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].starts_with(&first_dir), "{dirs:?}");
    first.kill();
    // Its Redis follows it (PDEATHSIG); the directory stays behind.
    let left = dir.path().join(&dirs[0]);
    let redis_port: u16 = dirs[0].rsplit('-').next().unwrap().parse().unwrap();
    wait_until("the crashed node's Redis to stop", DEADLINE, || async {
        conn_at(redis_port).is_err()
    })
    .await;
    assert!(
        left.exists(),
        "nothing removed the directory of a SIGKILLed node"
    );
    // A directory whose owner still runs (this test) is kept.
    let live = dir
        .path()
        .join(format!("presence-redis-{}-1", std::process::id()));
    std::fs::create_dir(&live).unwrap();

    let second = start_private(dir.path(), "next");
    let dirs = private_dirs(dir.path());
    assert!(
        !left.exists(),
        "the stale directory is still there: {dirs:?}\n{}",
        second.logs()
    );
    assert!(live.exists(), "a live process's directory was removed");
    assert!(
        dirs.iter()
            .any(|d| d.starts_with(&format!("presence-redis-{}-", second.pid()))),
        "{dirs:?}"
    );
    assert!(
        second.logs().contains("that is gone"),
        "the removal is logged:\n{}",
        second.logs()
    );
}
