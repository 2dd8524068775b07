//! What the public listener serves besides the API: the demo page (the
//! default), nothing (`--no-demo`), or an operator's own directory
//! (`--static-dir`).

use std::path::{Component, Path, PathBuf};

use actix_web::{web, HttpRequest, HttpResponse};

use crate::config::StaticFiles;
use crate::http::AppState;

/// The demo page and the client library it uses, built into the binary.
const EMBEDDED: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../static/index.html"),
    ),
    (
        "presence-client.js",
        "text/javascript; charset=utf-8",
        include_str!("../../clients/js/presence-client.js"),
    ),
    (
        "presence-client.d.ts",
        "application/typescript; charset=utf-8",
        include_str!("../../clients/js/presence-client.d.ts"),
    ),
];

/// Content type by file extension, for `--static-dir`.
fn content_type(path: &Path) -> &'static str {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with(".d.ts") || name.ends_with(".ts") {
        return "application/typescript; charset=utf-8";
    }
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// The request path as a relative file path: `index.html` for `/`; `None`
/// for anything that could leave the directory or name a hidden file.
fn relative(path: &str) -> Option<PathBuf> {
    let path = path.trim_start_matches('/');
    if path.is_empty() {
        return Some(PathBuf::from("index.html"));
    }
    let mut out = PathBuf::new();
    for part in path.split('/') {
        if part.is_empty() || part.starts_with('.') || part.contains('\\') {
            return None;
        }
        out.push(part);
    }
    out.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(out)
}

fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(crate::protocol::ProtocolError::new(
        crate::protocol::ErrorCode::NotFound,
        "no such route",
    ))
}

/// `GET /` and `GET /<file>`: the demo page, the operator's files, or 404.
pub async fn serve(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let Some(rel) = relative(req.path()) else {
        return not_found();
    };
    match &state.node.config.static_files {
        StaticFiles::Off => not_found(),
        StaticFiles::Demo => EMBEDDED
            .iter()
            .find(|(name, _, _)| Path::new(name) == rel)
            .map_or_else(not_found, |(_, ty, body)| {
                HttpResponse::Ok().content_type(*ty).body(*body)
            }),
        StaticFiles::Dir(dir) => {
            let dir = dir.clone();
            let found = web::block(move || {
                let path = dir.join(&rel).canonicalize().ok()?;
                // A symlink may not lead out of the directory.
                if !path.starts_with(&dir) || !path.is_file() {
                    return None;
                }
                let body = std::fs::read(&path).ok()?;
                Some((content_type(&path), body))
            })
            .await
            .ok()
            .flatten();
            match found {
                Some((ty, body)) => HttpResponse::Ok().content_type(ty).body(body),
                None => not_found(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        assert_eq!(relative("/"), Some(PathBuf::from("index.html")));
        assert_eq!(relative("/a/b.js"), Some(PathBuf::from("a/b.js")));
        for bad in [
            "/../etc/passwd",
            "/a/../../x",
            "/.git/config",
            "/a//x",
            "/a\\..\\b",
        ] {
            assert_eq!(relative(bad), None, "{bad}");
        }
    }
}
