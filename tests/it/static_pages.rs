//! What the public port serves besides the API (issue 16, item 8): the demo
//! page by default, nothing with `--no-demo`, an operator's directory with
//! `--static-dir`; and `GET /api/info`, which the demo page reads first.

use crate::common::*;

/// Status, content type and body of a GET.
async fn fetch(url: &str) -> (u16, String, String) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status().as_u16();
    let ty = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ty, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_page_is_served_by_default() {
    let redis = Redis::start();
    let node = Node::start(&redis, "demo");
    let (status, ty, body) = fetch(&format!("{}/", node.http())).await;
    assert_eq!(status, 200);
    assert!(ty.starts_with("text/html"), "{ty}");
    assert!(body.contains("presence-client.js"), "{body}");
    let (status, ty, _) = fetch(&format!("{}/presence-client.js", node.http())).await;
    assert_eq!((status, ty.starts_with("text/javascript")), (200, true));
    let (status, _, body) = fetch(&format!("{}/presence-client.d.ts", node.http())).await;
    assert_eq!(status, 200);
    assert!(body.contains("declare class PresenceClient"), "{body}");
    let (status, _, _) = fetch(&format!("{}/nothing-here.html", node.http())).await;
    assert_eq!(status, 404);
    // The info the page reads before it connects.
    let (status, info) = get(&format!("{}/api/info", node.http())).await;
    assert_eq!(status, 200);
    assert_eq!(info["auth"], "dev", "{info}");
    assert_eq!(info["server"], "presence-server", "{info}");
    assert_eq!(info["heartbeat_ms"], HEARTBEAT_MS, "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_demo_serves_no_static_file() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "prod", &["--no-demo"]);
    for path in [
        "/",
        "/index.html",
        "/presence-client.js",
        "/presence-client.d.ts",
    ] {
        let (status, _, body) = fetch(&format!("{}{path}", node.http())).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    // The API is untouched.
    let (status, _) = get(&format!("{}/api/presence/bob", node.http())).await;
    assert_eq!(status, 200);
    let c = Client::connect(&node, "bob", "phone").await;
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_dir_serves_the_operators_files() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "<h1>our own app</h1>").unwrap();
    std::fs::create_dir(dir.path().join("js")).unwrap();
    std::fs::write(dir.path().join("js/app.js"), "console.log(1)").unwrap();
    std::fs::write(dir.path().join(".env"), "SECRET=1").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("link.txt"),
    )
    .unwrap();
    let node = Node::start_with(
        &redis,
        "own",
        &["--static-dir", dir.path().to_str().unwrap()],
    );
    let (status, ty, body) = fetch(&format!("{}/", node.http())).await;
    assert_eq!((status, body.as_str()), (200, "<h1>our own app</h1>"));
    assert!(ty.starts_with("text/html"), "{ty}");
    let (status, ty, body) = fetch(&format!("{}/js/app.js", node.http())).await;
    assert_eq!((status, body.as_str()), (200, "console.log(1)"));
    assert!(ty.starts_with("text/javascript"), "{ty}");
    // Not the demo's files, nothing hidden, nothing outside.
    for path in [
        "/presence-client.js",
        "/.env",
        "/link.txt",
        "/js/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/js",
    ] {
        let (status, _, body) = fetch(&format!("{}{path}", node.http())).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            !body.contains("outside") && !body.contains("SECRET"),
            "{path}: {body}"
        );
    }
    // The API still wins over a file of the same name.
    let (status, info) = get(&format!("{}/api/info", node.http())).await;
    assert_eq!((status, info["auth"].as_str()), (200, Some("dev")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_static_flags_are_refused_at_start() {
    let redis = Redis::start();
    let base = |extra: &[&str]| {
        let mut a: Vec<String> = ["--listen", "127.0.0.1:0", "--redis-url", &redis.url]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let err = Node::spawn("missing", &base(&["--static-dir", "/no/such/dir"]), &[])
        .err()
        .expect("a missing --static-dir must not start");
    assert!(err.contains("--static-dir /no/such/dir"), "{err}");
    let err = Node::spawn("both", &base(&["--static-dir", "/tmp", "--no-demo"]), &[])
        .err()
        .expect("--no-demo with --static-dir must not start");
    assert!(
        err.contains("--no-demo") && err.contains("--static-dir"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_says_jwt_when_tokens_are_needed() {
    let redis = Redis::start();
    let node = Node::start_with(
        &redis,
        "jwt-info",
        &[
            "--auth",
            "jwt",
            "--jwt-secret",
            "0123456789abcdef0123456789abcdef-info",
        ],
    );
    let (status, info) = get(&format!("{}/api/info", node.http())).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["auth"], "jwt", "{info}");
}
