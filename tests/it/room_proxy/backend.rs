//! The app's backend of these tests: a plain HTTP/1.1 server in the test
//! process on a random port that records every question, answers each as
//! the test says, can hold its answers (slow) and be stopped (down), and
//! measures how many questions it has in flight at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// One question the backend got.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The `Presence-Signature` header.
    pub signature: String,
    /// The raw body.
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
}

impl Asked {
    /// The body, parsed.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a question is JSON")
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: u16,
    /// The body.
    pub body: String,
    /// A `Cache-Control` header, if any.
    pub cache_control: Option<String>,
}

impl Reply {
    /// `200` with `body`.
    pub fn ok(body: &str) -> Self {
        Self::status(200, body)
    }

    /// `status` with `body`.
    pub fn status(status: u16, body: &str) -> Self {
        Self {
            status,
            body: body.to_string(),
            cache_control: None,
        }
    }

    /// The same with `Cache-Control: <value>`.
    pub fn cached(mut self, value: &str) -> Self {
        self.cache_control = Some(value.to_string());
        self
    }
}

/// How the backend answers a question (its parsed body).
type Answer = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// What the server's tasks share with the test.
struct Shared {
    /// Every question, in arrival order.
    asked: Mutex<Vec<Asked>>,
    /// How to answer.
    answer: Mutex<Answer>,
    /// While true, questions wait for it to turn false before their answer.
    hold: watch::Sender<bool>,
    /// Questions received and not yet answered.
    in_flight: AtomicUsize,
    /// The most there ever were.
    most: AtomicUsize,
    /// The tasks serving connections, to stop them.
    conns: Mutex<Vec<AbortHandle>>,
}

/// The backend.
pub struct Backend {
    /// Where the node asks.
    pub url: String,
    shared: Arc<Shared>,
    accept: AbortHandle,
}

impl Backend {
    /// A backend that answers every question with `answer`.
    pub async fn start(answer: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/rooms/join", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            asked: Mutex::new(Vec::new()),
            answer: Mutex::new(Arc::new(answer)),
            hold: watch::channel(false).0,
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            conns: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let task = tokio::spawn(serve(stream, s.clone()));
                s.conns.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        Self {
            url,
            shared,
            accept,
        }
    }

    /// A backend that lets everyone in.
    pub async fn allowing() -> Self {
        Self::start(|_| Reply::ok(r#"{"allow":true}"#)).await
    }

    /// Answers from now on with `answer`.
    pub fn answer(&self, answer: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        *self.shared.answer.lock().unwrap() = Arc::new(answer);
    }

    /// Every question so far.
    pub fn asked(&self) -> Vec<Asked> {
        self.shared.asked.lock().unwrap().clone()
    }

    /// The questions so far about `room`.
    pub fn asked_about(&self, room: &str) -> Vec<Asked> {
        self.asked()
            .into_iter()
            .filter(|a| a.json()["room"] == room)
            .collect()
    }

    /// Questions from now on wait for [`Backend::release`].
    pub fn hold(&self) {
        self.shared.hold.send_replace(true);
    }

    /// The questions held are answered, and the next ones at once.
    pub fn release(&self) {
        self.shared.hold.send_replace(false);
    }

    /// Questions received and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The most questions it ever had at once.
    pub fn most_in_flight(&self) -> usize {
        self.shared.most.load(Ordering::SeqCst)
    }

    /// Down: the port is closed and every connection dropped.
    pub fn stop(&self) {
        self.accept.abort();
        for conn in self.shared.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one connection: requests one after another (keep-alive).
async fn serve(stream: tokio::net::TcpStream, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let Some((signature, body)) = request(&mut read).await else {
            return;
        };
        let at = Instant::now();
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        shared.asked.lock().unwrap().push(Asked {
            signature,
            body,
            at,
        });
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.most.fetch_max(now, Ordering::SeqCst);
        let mut hold = shared.hold.subscribe();
        let _ = hold.wait_for(|held| !held).await;
        let answer = shared.answer.lock().unwrap().clone();
        let reply = answer(&parsed);
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        let cache = reply
            .cache_control
            .map(|v| format!("cache-control: {v}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "HTTP/1.1 {} X\r\ncontent-type: application/json\r\n{cache}content-length: {}\r\n\r\n",
            reply.status,
            reply.body.len()
        );
        if write.write_all(head.as_bytes()).await.is_err()
            || write.write_all(reply.body.as_bytes()).await.is_err()
        {
            return;
        }
    }
}

/// One request's signature and body; `None` when the connection ends.
async fn request(
    read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> Option<(String, Vec<u8>)> {
    let mut line = String::new();
    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
        return None;
    }
    assert!(line.starts_with("POST /rooms/join "), "{line}");
    let (mut len, mut signature) = (0usize, String::new());
    loop {
        line.clear();
        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => len = value.trim().parse().ok()?,
            "presence-signature" => signature = value.trim().to_string(),
            _ => {}
        }
    }
    let mut body = vec![0; len];
    read.read_exact(&mut body).await.ok()?;
    Some((signature, body))
}
