//! The webhook receiver of these tests: a plain HTTP/1.1 server inside the
//! test that records every POST (answering 500 while told to fail, or to a
//! share of them at random, and closing the connection without an answer
//! while down), the signature check of docs/events.md, and nodes that send
//! to it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::*;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

pub(crate) const SECRET: &str = "whsec_test_0123456789abcdef";

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    /// The `Presence-Signature` header.
    pub signature: String,
    /// The raw body.
    pub body: Vec<u8>,
    /// What the receiver answered: `0` when it was down and closed the
    /// connection without an answer.
    pub answered: u16,
}

impl Delivery {
    /// The body, parsed.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("webhook body is JSON")
    }
}

/// A webhook receiver: a plain HTTP/1.1 server on a random port that
/// records every POST and answers 500 to the first `fail` ones.
pub(crate) struct Receiver {
    /// Where the nodes POST.
    pub url: String,
    /// Every POST, in arrival order.
    got: Arc<Mutex<Vec<Delivery>>>,
    /// POSTs still to be answered 500: set it to 0 to bring the receiver up.
    pub fail: Arc<AtomicUsize>,
    /// Percent of the other POSTs answered 500 at random (0 by default).
    pub fail_percent: Arc<AtomicU32>,
    /// While set, the receiver is down: it closes each connection once
    /// the request is in, without an answer.
    pub down: Arc<AtomicBool>,
}

/// The receiver's failure switches, shared with its connections.
#[derive(Clone, Default)]
struct Faults {
    fail: Arc<AtomicUsize>,
    fail_percent: Arc<AtomicU32>,
    down: Arc<AtomicBool>,
}

impl Faults {
    /// What to answer the next POST: `None` to close without an answer.
    fn answer(&self) -> Option<u16> {
        if self.down.load(Ordering::SeqCst) {
            return None;
        }
        let failing = self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
            || rand::random_range(0..100) < self.fail_percent.load(Ordering::SeqCst);
        Some(if failing { 500 } else { 200 })
    }
}

impl Receiver {
    /// A receiver that answers 500 to its first `fail` POSTs.
    pub async fn start(fail: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/presence", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        let faults = Faults::default();
        faults.fail.store(fail, Ordering::SeqCst);
        let (g, f) = (got.clone(), faults.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, g.clone(), f.clone()));
            }
        });
        Self {
            url,
            got,
            fail: faults.fail.clone(),
            fail_percent: faults.fail_percent.clone(),
            down: faults.down,
        }
    }

    /// Every POST so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.got.lock().unwrap().clone()
    }

    /// The events of the POSTs answered 200, in arrival order, each with
    /// the node that sent it as `_node`.
    pub fn events(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for d in self.deliveries().iter().filter(|d| d.answered == 200) {
            let body = d.json();
            for e in body["events"].as_array().unwrap() {
                let mut e = e.clone();
                e["_node"] = body["node"].clone();
                out.push(e);
            }
        }
        out
    }

    /// Events of `user` of type `kind` accepted so far.
    pub fn of(&self, user: &str, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["user"] == user && e["type"] == kind)
            .collect()
    }

    /// The first event of `user` of type `kind`, once it came.
    pub async fn wait_for(&self, user: &str, kind: &str) -> Value {
        wait_until(&format!("webhook {kind} of {user}"), DEADLINE, || async {
            !self.of(user, kind).is_empty()
        })
        .await;
        self.of(user, kind).remove(0)
    }
}

/// Serves one connection: requests one after another (keep-alive).
async fn serve(stream: tokio::net::TcpStream, got: Arc<Mutex<Vec<Delivery>>>, faults: Faults) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut len = 0usize;
        let mut signature = String::new();
        let mut line = String::new();
        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /hooks/presence "), "{line}");
        loop {
            line.clear();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (name, value) = l.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => len = value.trim().parse().unwrap(),
                "presence-signature" => signature = value.trim().to_string(),
                _ => {}
            }
        }
        let mut body = vec![0; len];
        if read.read_exact(&mut body).await.is_err() {
            return;
        }
        let answer = faults.answer();
        got.lock().unwrap().push(Delivery {
            signature,
            body,
            answered: answer.unwrap_or(0),
        });
        let Some(answered) = answer else {
            // Down: the connection closes with no answer.
            return;
        };
        let reply = format!(
            "HTTP/1.1 {answered} {}\r\ncontent-length: 0\r\n\r\n",
            if answered == 500 {
                "Internal Server Error"
            } else {
                "OK"
            }
        );
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The verification recipe of docs/events.md: `t=<unix>,v1=<hex>`, HMAC-SHA256
/// over `<unix>.<body>`, compared in constant time, within 5 minutes.
pub(crate) fn verify(secret: &str, header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = v.parse::<u64>().ok(),
            Some(("v1", v)) => v1 = Some(v.to_string()),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if now.abs_diff(t) > 300 {
        return false;
    }
    let Ok(given) = (0..v1.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(v1.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
    else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// A node `id` that sends its webhooks to `receiver` (from its own queue,
/// unless `extra` turns the event feed on), with `extra` flags.
pub(crate) fn node_with_hooks(
    redis: &Redis,
    id: &str,
    receiver: &Receiver,
    extra: &[&str],
) -> Node {
    let mut args = vec![
        "--webhook-url",
        receiver.url.as_str(),
        "--webhook-secret",
        SECRET,
    ];
    // These tests are of the webhooks each node sends from its own queue,
    // as with the event feed off; the feed's own are in tests/it/feed*.
    if !extra.contains(&"--event-retention-secs") {
        args.extend(["--event-retention-secs", "0"]);
    }
    args.extend_from_slice(extra);
    Node::start_with(redis, id, &args)
}
