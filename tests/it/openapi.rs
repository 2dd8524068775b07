//! `GET /api/openapi.json`: a valid OpenAPI 3.1 document (parsed by the
//! `oas3` crate, every `$ref` resolved) that describes every route the
//! server registers, and no route it does not serve.

use std::collections::BTreeSet;

use crate::common::*;
use presence_server::http::route_table;
use serde_json::Value;

/// Every `$ref` in `v`.
fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.clone()),
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The document parses as OpenAPI 3.1 and its references resolve.
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
    let text = serde_json::to_string(&doc).unwrap();
    if let Err(e) = oas3::from_json(&text) {
        panic!("not an OpenAPI 3.1 document: {e}\n{text}");
    }
    // Every reference names something the document holds.
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty(), "the schemas are shared by reference");
    for r in refs {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{r}: not local"));
        assert!(doc.pointer(pointer).is_some(), "{r} names nothing");
    }
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
    let node = Node::start_with(&redis, "n1", &["--admin-key", ADMIN]);
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
    assert!(registered.len() >= 11, "{registered:?}");
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
