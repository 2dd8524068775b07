//! A raw WebSocket client over a plain TCP socket, for tests that must send
//! what a well-behaved library never would: oversized or malformed headers,
//! fragments, unsolicited pongs, bytes that are not UTF-8; and that must
//! see exactly when the server's close frame and its end of the TCP
//! connection arrive.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Continuation frame.
pub const CONT: u8 = 0x0;
/// Text frame.
pub const TEXT: u8 = 0x1;
/// Binary frame.
pub const BINARY: u8 = 0x2;
/// Close frame.
pub const CLOSE: u8 = 0x8;
/// Ping frame.
pub const PING: u8 = 0x9;
/// Pong frame.
pub const PONG: u8 = 0xA;

/// The masking key of every frame this client sends.
const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// The header of a masked client frame announcing `len` payload bytes.
pub fn header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut h = vec![if fin { 0x80 } else { 0 } | opcode];
    if len < 126 {
        h.push(0x80 | len as u8);
    } else if len <= u64::from(u16::MAX) {
        h.push(0x80 | 126);
        h.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        h.push(0x80 | 127);
        h.extend_from_slice(&len.to_be_bytes());
    }
    h.extend_from_slice(&MASK);
    h
}

/// Masks payload bytes that start at `offset` within their frame.
pub fn mask(payload: &[u8], offset: usize) -> Vec<u8> {
    payload
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ MASK[(offset + i) % 4])
        .collect()
}

/// A whole masked client frame.
pub fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = header(fin, opcode, payload.len() as u64);
    f.extend(mask(payload, 0));
    f
}

/// A close frame with `code`.
pub fn close_frame(code: u16) -> Vec<u8> {
    frame(true, CLOSE, &code.to_be_bytes())
}

/// One frame from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// FIN bit.
    pub fin: bool,
    /// Opcode.
    pub opcode: u8,
    /// Payload (server frames are unmasked).
    pub payload: Vec<u8>,
}

impl Frame {
    /// The close code and reason of a close frame.
    pub fn close(&self) -> Option<(u16, String)> {
        (self.opcode == CLOSE && self.payload.len() >= 2).then(|| {
            (
                u16::from_be_bytes([self.payload[0], self.payload[1]]),
                String::from_utf8_lossy(&self.payload[2..]).into_owned(),
            )
        })
    }

    /// A text frame's JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap_or(serde_json::Value::Null)
    }
}

/// What reading found.
#[derive(Debug)]
pub enum Read {
    /// A frame.
    Frame(Frame),
    /// The server closed the TCP connection (EOF or reset).
    Eof,
    /// Nothing within the time given.
    Timeout,
}

/// The reading half of a raw connection.
pub struct Reader {
    half: OwnedReadHalf,
    buf: Vec<u8>,
}

/// A raw WebSocket connection after a successful handshake.
pub struct Raw {
    /// Reads server frames.
    pub reader: Reader,
    /// Writes whatever the test wants.
    pub writer: OwnedWriteHalf,
}

/// Sends a WebSocket handshake for `path` with extra request `headers`
/// (one named `host` replaces the node's address as `Host`); returns the
/// status code, the response head, and the stream with any bytes read past
/// the head.
pub async fn handshake(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, TcpStream, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let is_host = |name: &str| name.eq_ignore_ascii_case("host");
    let host = headers
        .iter()
        .find(|(name, _)| is_host(name))
        .map_or_else(|| addr.to_string(), |(_, value)| value.to_string());
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    );
    for (name, value) in headers.iter().filter(|(name, _)| !is_host(name)) {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let deadline = Instant::now() + super::DEADLINE;
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline.into(), stream.read(&mut chunk))
            .await
            .expect("handshake answered")
            .unwrap();
        assert!(n > 0, "connection closed during the handshake: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head, stream, buf[end..].to_vec())
}

impl Raw {
    /// Connects to `path` (e.g. `/ws?user=a&device=d`) and completes the
    /// handshake; panics unless the server switches protocols.
    pub async fn connect(addr: SocketAddr, path: &str) -> Self {
        Self::connect_with(addr, path, &[]).await
    }

    /// [`Raw::connect`] with extra request `headers`.
    pub async fn connect_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Self {
        let (status, head, stream, rest) = handshake(addr, path, headers).await;
        assert_eq!(status, 101, "handshake refused: {head}");
        let (half, writer) = stream.into_split();
        Self {
            reader: Reader { half, buf: rest },
            writer,
        }
    }

    /// Connects as `user`/`device` and waits for the `hello` frame.
    pub async fn hello(node: &super::Node, user: &str, device: &str) -> Self {
        let mut raw = Self::connect(node.addr, &format!("/ws?user={user}&device={device}")).await;
        let hello = raw.reader.expect_text().await;
        assert_eq!(hello["type"], "hello", "{hello}");
        raw
    }

    /// Writes bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.unwrap();
    }
}

impl Reader {
    /// The next frame, EOF, or a timeout.
    pub async fn next(&mut self, timeout: Duration) -> Read {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((frame, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                return Read::Frame(frame);
            }
            let mut chunk = vec![0u8; 64 * 1024];
            match tokio::time::timeout_at(deadline.into(), self.half.read(&mut chunk)).await {
                Err(_) => return Read::Timeout,
                Ok(Ok(0)) | Ok(Err(_)) => return Read::Eof,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The next text frame as JSON, skipping pings; panics on anything else.
    pub async fn expect_text(&mut self) -> serde_json::Value {
        loop {
            match self.next(super::DEADLINE).await {
                Read::Frame(f) if f.opcode == TEXT => return f.json(),
                Read::Frame(f) if f.opcode == PING => continue,
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    }

    /// Skips text, ping and pong frames up to the server's close frame;
    /// returns its code and reason. Panics when the connection ends
    /// without one.
    pub async fn expect_close(&mut self, timeout: Duration) -> (u16, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Read::Frame(f) if f.opcode == CLOSE => {
                    return f.close().unwrap_or((1005, String::new()))
                }
                Read::Frame(_) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    }

    /// Waits for the server to end the TCP connection (EOF or reset);
    /// false if it still holds it after `timeout`. Frames meanwhile are
    /// skipped.
    pub async fn wait_eof(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Read::Eof => return true,
                Read::Timeout => return false,
                Read::Frame(_) => continue,
            }
        }
    }
}

/// Parses one unmasked server frame at the start of `buf`.
fn parse(buf: &[u8]) -> Option<(Frame, usize)> {
    if buf.len() < 2 {
        return None;
    }
    let (fin, opcode) = (buf[0] & 0x80 != 0, buf[0] & 0x0f);
    let (len, mut at) = match buf[1] & 0x7f {
        126 => (
            u16::from_be_bytes(buf.get(2..4)?.try_into().ok()?) as usize,
            4,
        ),
        127 => (
            u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    if buf[1] & 0x80 != 0 {
        at += 4; // a masked server frame would be a server bug; skip the key
    }
    let payload = buf.get(at..at + len)?.to_vec();
    Some((
        Frame {
            fin,
            opcode,
            payload,
        },
        at + len,
    ))
}

/// Resident memory of a process, in KiB (`VmRSS` of /proc/<pid>/status).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
