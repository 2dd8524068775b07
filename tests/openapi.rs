//! `GET /api/openapi.json`: a valid OpenAPI document (checked by the
//! openapi-spec-validator Python package) that describes every route the
//! server registers, and no route it does not serve.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::*;
use presence_server::http::route_table;
use serde_json::Value;

/// The document, validated by openapi-spec-validator (Debian:
/// python3-openapi-spec-validator; `.ci/run` installs it).
#[tokio::test]
async fn the_document_is_valid_openapi() {
    let redis = Redis::start();
    let node = Node::start(&redis, "n1");
    let r = reqwest::get(format!("{}/api/openapi.json", node.http()))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let doc: Value = r.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import json, sys\n\
             from openapi_spec_validator import validate\n\
             validate(json.load(open(sys.argv[1])))\n\
             print('valid')",
        )
        .arg(&path)
        .output()
        .expect("python3 (with openapi-spec-validator) must be installed");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"),
        "openapi-spec-validator refused the document:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The webhook payload is described too.
    for schema in ["WebhookBatch", "WebhookEvent", "Record", "ProtocolError"] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
}

/// Every (method, path) the server registers is in the document, and every
/// one the document names is served: the server answers it with something
/// other than its "no such route" 404.
#[tokio::test]
async fn the_document_covers_every_route() {
    let redis = Redis::start();
    let node = Node::start_with(&redis, "n1", &["--admin-key", "admin-key-for-tests-0123"]);
    let (_, doc) = get(&format!("{}/api/openapi.json", node.http())).await;
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .filter(|k| {
                    ["get", "put", "post", "delete", "patch", "head", "options"]
                        .contains(&k.as_str())
                })
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let registered: BTreeSet<(String, String)> = route_table()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert!(registered.len() >= 12, "{registered:?}");
    assert_eq!(
        registered.difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "registered but not documented"
    );
    assert_eq!(
        documented.difference(&registered).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "documented but not registered"
    );
    // The table is the server's: each route is served.
    let http = reqwest::Client::new();
    for (method, path) in &registered {
        let url = format!("{}{}", node.http(), path.replace("{user}", "alice"));
        let r = http
            .request(method.parse().unwrap(), &url)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        assert!(
            !(status == 404 && body.contains("no such route")),
            "{method} {path}: {status} {body}"
        );
    }
    // And a route that is not registered is not served.
    let r = http
        .delete(format!("{}/api/presence/alice", node.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
