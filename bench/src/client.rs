//! WebSocket clients spread over loopback source addresses.
//!
//! One source address has ~28,000 ephemeral ports towards one server port;
//! 100,000 devices need several. Linux routes all of 127.0.0.0/8 to the
//! loopback device, so 127.0.0.2, 127.0.0.3, ... work without setup.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A client WebSocket over plain TCP.
pub type Ws = WebSocketStream<TcpStream>;

/// How long a handshake plus `hello` (or a snapshot) may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Loopback source addresses, handed out round robin.
pub struct Sources {
    /// 127.0.0.2 onwards.
    addrs: Vec<IpAddr>,
    /// Next one to hand out.
    next: AtomicUsize,
}

impl Sources {
    /// `n` addresses from 127.0.0.2.
    pub fn new(n: usize) -> Self {
        let addrs = (0..n.clamp(1, 250))
            .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i as u8)))
            .collect();
        Self {
            addrs,
            next: AtomicUsize::new(0),
        }
    }

    /// The next source address.
    pub fn next(&self) -> IpAddr {
        self.addrs[self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len()]
    }
}

/// Small buffers: the bench holds 100,000 of these, and frames are tiny
/// (tungstenite's default is 128 KiB each way per connection).
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
}

/// Opens a WebSocket from `src` to `node` as user/device and waits for
/// `hello`.
pub async fn connect(
    node: SocketAddr,
    src: IpAddr,
    user: &str,
    device: &str,
) -> anyhow::Result<Ws> {
    let fut = async {
        let sock = TcpSocket::new_v4()?;
        // Leaves the port choice to connect(), which may then reuse a port
        // towards another destination; bind() alone would reserve it.
        let one: libc::c_int = 1;
        // SAFETY: setsockopt on a socket we own, with a c_int option value.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        sock.bind(SocketAddr::new(src, 0))?;
        let tcp = sock.connect(node).await?;
        tcp.set_nodelay(true)?;
        let url = format!("ws://{node}/ws?user={user}&device={device}");
        let (mut ws, _) =
            tokio_tungstenite::client_async_with_config(url, tcp, Some(ws_config())).await?;
        // An error frame (e.g. `unavailable`) comes before the close that
        // says what to do next: read on to it.
        loop {
            let frame = next_json(&mut ws)
                .await
                .context("no hello from the server")?;
            match frame["type"].as_str() {
                Some("hello") => return anyhow::Ok(ws),
                Some("error") => continue,
                _ => bail!("expected hello, got {frame}"),
            }
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, fut)
        .await
        .context("connect timed out")?
        .with_context(|| format!("connect {user}/{device} from {src}"))
}

/// The next text frame as JSON (pings are answered meanwhile).
pub async fn next_json(ws: &mut Ws) -> anyhow::Result<Value> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t)?),
            Some(Ok(Message::Close(Some(f)))) => {
                bail!("closed by the server: {} {}", u16::from(f.code), f.reason)
            }
            Some(Ok(Message::Close(None))) => bail!("closed by the server: no close code"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
            None => bail!("connection dropped"),
        }
    }
}

/// Sends `{"type":"watch","users":[...]}` and waits for the snapshot.
pub async fn watch(ws: &mut Ws, users: &[String]) -> anyhow::Result<Vec<Value>> {
    let frame = serde_json::json!({"type": "watch", "users": users});
    ws.send(Message::Text(frame.to_string().into())).await?;
    let fut = async {
        loop {
            let v = next_json(ws).await?;
            if v["type"] == "snapshot" {
                return anyhow::Ok(v["presence"].as_array().cloned().unwrap_or_default());
            }
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, fut)
        .await
        .context("no snapshot")?
}

/// How a held connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// We closed it (close frame, then the server's answer or a timeout).
    ByUs,
    /// The server closed it or it dropped: the device was lost.
    ByServer,
}

/// A connected device that answers pings until told to close.
pub struct Held {
    /// Asks the task for a clean close.
    close: Option<oneshot::Sender<()>>,
    /// Reads the socket all the time, so that pings are answered.
    pub task: JoinHandle<Ended>,
}

impl Held {
    /// Holds `ws` open: reads (and so answers pings) until asked to close.
    pub fn new(ws: Ws) -> Self {
        Self::chatty(ws, None)
    }

    /// Like [`Held::new`], and sends `{"type":"heartbeat"}` every `every`
    /// as well, as a client that heartbeats on its own timer does.
    pub fn chatty(mut ws: Ws, every: Option<Duration>) -> Self {
        let (tx, mut rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut tick = every.map(tokio::time::interval);
            loop {
                let beat = async {
                    match &mut tick {
                        Some(t) => t.tick().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = beat => {
                        if ws.send(Message::text(r#"{"type":"heartbeat"}"#)).await.is_err() {
                            return Ended::ByServer;
                        }
                    }
                    msg = ws.next() => match msg {
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Ended::ByServer,
                        Some(Ok(_)) => {}
                    },
                    _ = &mut rx => {
                        let _ = ws.close(None).await;
                        // Waits for the server's close, briefly.
                        let _ = tokio::time::timeout(Duration::from_secs(5), async {
                            while let Some(Ok(_)) = ws.next().await {}
                        })
                        .await;
                        return Ended::ByUs;
                    }
                }
            }
        });
        Self {
            close: Some(tx),
            task,
        }
    }

    /// Starts a clean close (close frame); does not wait for it.
    pub fn close(&mut self) {
        if let Some(tx) = self.close.take() {
            let _ = tx.send(());
        }
    }

    /// True while the connection is open.
    pub fn is_open(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The task holds the socket: stop it to close the socket.
        self.task.abort();
    }
}

/// A presence event a watcher received: (user, status, when).
pub type Seen = (String, String, Instant);

/// Reads a watcher's socket all the time and hands every `presence` event
/// to `on_event`; returns when the connection ends or `stop` fires.
pub fn spawn_watcher<F>(
    ws: Ws,
    stop: tokio::sync::watch::Receiver<bool>,
    mut on_event: F,
) -> JoinHandle<()>
where
    F: FnMut(Seen) + Send + 'static,
{
    spawn_reader(ws, stop, move |v, at| {
        if v["type"] == "presence" {
            let user = v["user"].as_str().unwrap_or_default().to_string();
            let status = v["status"].as_str().unwrap_or_default().to_string();
            on_event((user, status, at));
        }
    })
}

/// Reads a socket (or its reading half) all the time and hands every text
/// frame, as JSON, to `on_frame` with its receipt time; returns when the
/// connection ends or `stop` fires.
pub fn spawn_reader<S, F>(
    mut ws: S,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut on_frame: F,
) -> JoinHandle<()>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + Unpin
        + Send
        + 'static,
    F: FnMut(&Value, Instant) + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            tokio::select! {
                msg = ws.next() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        let at = Instant::now();
                        let Ok(v) = serde_json::from_str::<Value>(&t) else { continue };
                        on_frame(&v, at);
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                    Some(Ok(_)) => {}
                },
                _ = stop.changed() => return,
            }
        }
    })
}

/// Sends `{"type":"join","room":..,"state":{}}` and waits for the `room`
/// frame that answers it (frames of other rooms' events meanwhile are
/// skipped).
pub async fn join(ws: &mut Ws, room: &str) -> anyhow::Result<Value> {
    join_with(ws, room, &serde_json::json!({})).await
}

/// [`join`] with `state` as the device's state in the room.
pub async fn join_with(ws: &mut Ws, room: &str, state: &Value) -> anyhow::Result<Value> {
    join_as(ws, room, state, false).await
}

/// [`join_with`], asking for the others' state changes in `room_updates`
/// batches when `batch`.
pub async fn join_as(ws: &mut Ws, room: &str, state: &Value, batch: bool) -> anyhow::Result<Value> {
    let frame = serde_json::json!({"type": "join", "room": room, "state": state, "batch": batch});
    ws.send(Message::Text(frame.to_string().into())).await?;
    let fut = async {
        loop {
            let v = next_json(ws).await?;
            match v["type"].as_str() {
                Some("room") if v["room"] == room => return anyhow::Ok(v),
                Some("error") => bail!("join {room}: {v}"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, fut)
        .await
        .with_context(|| format!("no room frame for {room}"))?
}

/// A room state that serializes (compactly, as the server measures it) to
/// `bytes` bytes: `{"s":"xx.."}`, or `{}` below the 8 bytes of `{"s":""}`.
pub fn state_of(bytes: usize) -> Value {
    const EMPTY: usize = r#"{"s":""}"#.len();
    if bytes < EMPTY {
        return serde_json::json!({});
    }
    serde_json::json!({ "s": "x".repeat(bytes - EMPTY) })
}
