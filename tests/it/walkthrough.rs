//! The walkthroughs the docs print (the README's wscat one, the websocat one
//! of docs/protocol.md) are run as printed against a fresh node, and the
//! answers must be the ones printed, times aside. A doc marks each block with
//! `<!-- terminal: NAME -->` (and a terminal's Ctrl+C with
//! `<!-- terminal: NAME closes -->`); in a block, `$ ... 'URL'` connects,
//! `> FRAME` is typed, and `< FRAME` (wscat) or a bare `{...}` line
//! (websocat) is what the server answers. In the terminal named `http`,
//! `$ curl ...` runs with bash and the `{...}` lines after it are its output.

use std::path::Path;

use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

/// One step of a walkthrough, in the order the doc gives them.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// A terminal connects to this URL (as printed: port 8080).
    Connect { term: String, url: String },
    /// A frame typed in a terminal.
    Send { term: String, frame: String },
    /// A frame the terminal shows next.
    Expect { term: String, frame: String },
    /// Ctrl+C in that terminal.
    Close { term: String },
    /// A shell command of the `http` terminal (curl).
    Shell { command: String },
}

/// The steps of the marked blocks of `doc`.
fn steps(doc: &str) -> Vec<Step> {
    let mut out = Vec::new();
    let mut term: Option<String> = None;
    let mut in_block = false;
    for line in doc.lines() {
        let trimmed = line.trim();
        if let Some(marker) = trimmed
            .strip_prefix("<!-- terminal: ")
            .and_then(|m| m.strip_suffix(" -->"))
        {
            match marker.strip_suffix(" closes") {
                Some(name) => out.push(Step::Close { term: name.into() }),
                None => term = Some(marker.to_string()),
            }
            continue;
        }
        if trimmed.starts_with("```") {
            if in_block {
                term = None;
            }
            in_block = !in_block;
            continue;
        }
        let Some(t) = term.clone().filter(|_| in_block) else {
            continue;
        };
        if let Some(cmd) = trimmed.strip_prefix("$ ").filter(|_| t == "http") {
            out.push(Step::Shell {
                command: cmd.into(),
            });
        } else if let Some(cmd) = trimmed.strip_prefix("$ ") {
            let url = cmd.split('\'').nth(1).expect("a quoted URL").to_string();
            out.push(Step::Connect { term: t, url });
        } else if let Some(frame) = trimmed.strip_prefix("> ") {
            out.push(Step::Send {
                term: t,
                frame: frame.into(),
            });
        } else if let Some(frame) = trimmed.strip_prefix("< ") {
            out.push(Step::Expect {
                term: t,
                frame: frame.into(),
            });
        } else if trimmed.starts_with('{') {
            out.push(Step::Expect {
                term: t,
                frame: trimmed.into(),
            });
        }
    }
    out
}

/// Times (and node ids) differ from run to run: every number under one of
/// these keys, and every node id, becomes the same placeholder.
fn without_times(v: &mut Value) {
    const TIMES: [&str; 5] = [
        "last_seen",
        "connected_at",
        "joined_at",
        "active_at",
        "expires_in_ms",
    ];
    match v {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if TIMES.contains(&k.as_str()) && v.is_number() {
                    *v = Value::String("<time>".into());
                } else if k == "node" && v.is_string() {
                    *v = Value::String("<node>".into());
                } else {
                    without_times(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(without_times),
        _ => {}
    }
}

/// Runs the walkthrough of `file` against a fresh node with the defaults
/// the docs assume, and compares every answer with the printed one.
async fn run(file: &str, min_steps: usize) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let steps = steps(&text);
    assert!(
        steps.len() >= min_steps,
        "{file}: expected a walkthrough of at least {min_steps} steps, found {steps:?}"
    );
    let redis = Redis::start();
    let node = Node::start_with(&redis, "walkthrough", &["--heartbeat-ms", "15000"]);
    let base = format!("ws://{}", node.http().trim_start_matches("http://"));
    let mut terms: Vec<(String, Client)> = Vec::new();
    let mut shell_output = std::collections::VecDeque::new();
    for step in steps {
        match step {
            Step::Connect { term, url } => {
                assert!(url.starts_with("ws://127.0.0.1:8080/"), "{file}: {url}");
                let url = url.replace("ws://127.0.0.1:8080", &base);
                let c = Client::connect_raw(&url, &term, "")
                    .await
                    .unwrap_or_else(|e| panic!("{file}: {term} connects to {url}: {e}"));
                terms.push((term, c));
            }
            Step::Send { term, frame } => {
                let c = client(&mut terms, &term, file);
                c.send_raw(Message::Text(frame.into())).await;
            }
            Step::Shell { command } => {
                shell_output.extend(shell(&command, &node, file));
            }
            Step::Expect { term, frame } => {
                let mut want: Value = serde_json::from_str(&frame)
                    .unwrap_or_else(|e| panic!("{file}: printed frame is not JSON: {frame}: {e}"));
                let mut got = if term == "http" {
                    let line: String = shell_output.pop_front().unwrap_or_else(|| {
                        panic!("{file}: no output where the doc prints {frame}")
                    });
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{file}: {line}: {e}"))
                } else {
                    client(&mut terms, &term, file).recv().await
                };
                without_times(&mut want);
                without_times(&mut got);
                assert_eq!(
                    got, want,
                    "{file}: {term}'s terminal shows another frame than the doc prints"
                );
            }
            Step::Close { term } => {
                let i = terms.iter().position(|(t, _)| *t == term).unwrap();
                let (_, c) = terms.remove(i);
                c.close().await;
            }
        }
    }
    // Nothing more arrived that the doc does not show.
    assert!(
        shell_output.is_empty(),
        "{file}: output the doc does not show: {shell_output:?}"
    );
    for (term, c) in terms.iter_mut() {
        if let Some(Incoming::Frame(v)) = c.try_next() {
            panic!("{file}: {term} got a frame the doc does not show: {v}");
        }
    }
}

/// Runs a printed curl command against `node`; its output lines.
fn shell(command: &str, node: &Node, file: &str) -> Vec<String> {
    assert!(command.starts_with("curl "), "{file}: {command}");
    let addr = node.http().trim_start_matches("http://").to_string();
    let command = command.replace("localhost:8080", &addr);
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&command)
        .output()
        .unwrap_or_else(|e| panic!("{file}: {command}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{file}: {command}: {}\n{text}",
        out.status
    );
    text.lines().map(str::to_string).collect()
}

fn client<'a>(terms: &'a mut [(String, Client)], term: &str, file: &str) -> &'a mut Client {
    terms
        .iter_mut()
        .find(|(t, _)| t == term)
        .map(|(_, c)| c)
        .unwrap_or_else(|| panic!("{file}: terminal {term} used before it connects"))
}

#[tokio::test]
async fn the_readme_wscat_walkthrough_gets_the_printed_answers() {
    run("README.md", 16).await;
}

#[tokio::test]
async fn the_websocat_walkthrough_gets_the_printed_answers() {
    run("docs/protocol.md", 10).await;
}

/// The parser itself: a doc that prints a wrong answer fails the run.
#[test]
fn the_parser_reads_terminals_frames_and_closes() {
    let doc = "<!-- terminal: bob -->\n```\n$ wscat -c 'ws://127.0.0.1:8080/ws?user=bob&device=x'\nConnected\n< {\"a\":1}\n> {\"b\":2}\n```\ntext\n```\n< {\"ignored\":1}\n```\n<!-- terminal: bob closes -->\n";
    assert_eq!(
        steps(doc),
        vec![
            Step::Connect {
                term: "bob".into(),
                url: "ws://127.0.0.1:8080/ws?user=bob&device=x".into()
            },
            Step::Expect {
                term: "bob".into(),
                frame: "{\"a\":1}".into()
            },
            Step::Send {
                term: "bob".into(),
                frame: "{\"b\":2}".into()
            },
            Step::Close { term: "bob".into() },
        ]
    );
    let mut v: Value = serde_json::json!({"last_seen": 5, "x": [{"joined_at": 1}], "n": 2});
    without_times(&mut v);
    assert_eq!(
        v,
        serde_json::json!({"last_seen": "<time>", "x": [{"joined_at": "<time>"}], "n": 2})
    );
}
