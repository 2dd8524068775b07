//! The fan-out floor: after a WebSocket handshake, the bare server keeps
//! only the raw sockets, and a round writes one pre-encoded frame to each of
//! them from two threads in a tight loop (one `send` syscall per watcher,
//! like the node's two workers). No tasks to wake, no per-watcher logic:
//! what is left is the kernel's loopback TCP path and the load generator's
//! own reads, which any server pays on this box. `fanout` measures it in
//! the same run as the node, as `refresh` measures its direct-to-Redis
//! ceiling.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio_tungstenite::tungstenite::Message;

/// The bare server. Dropping it stops accepting and closes every socket.
pub struct FloorServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Every handshaken connection, ready for raw writes.
    sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
    /// Ends the accept loop.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FloorServer {
    /// Starts it on 127.0.0.1, accepting on a runtime of its own.
    pub fn start() -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let kept = sockets.clone();
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let accept = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = tcp.set_nodelay(true);
                        tokio::spawn(handshake(tcp, kept.clone()));
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(Self {
            addr,
            sockets,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Connections handshaken so far.
    pub fn connections(&self) -> usize {
        self.sockets.lock().unwrap().len()
    }

    /// Writes `text` as one WebSocket text frame to every connection, from
    /// `threads` threads, each taking its share in a tight loop. Returns
    /// the CPU time (user + system) the writing threads used, in µs.
    pub fn send(&self, text: &str, threads: usize) -> u64 {
        let frame = encode_text(text);
        let sockets = self.sockets.lock().unwrap();
        let per = sockets.len().div_ceil(threads.max(1)).max(1);
        std::thread::scope(|s| {
            let writers: Vec<_> = sockets
                .chunks(per)
                .map(|chunk| {
                    let frame = &frame;
                    s.spawn(move || {
                        let before = thread_cpu_us();
                        for mut sock in chunk {
                            // Watchers read all the time: the socket
                            // buffer has room for one small frame.
                            let _ = sock.write_all(frame);
                        }
                        thread_cpu_us() - before
                    })
                })
                .collect();
            writers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
        })
    }
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.sockets.lock().unwrap().clear();
    }
}

/// The WebSocket handshake and `hello`, then the raw socket is kept.
async fn handshake(tcp: tokio::net::TcpStream, kept: Arc<Mutex<Vec<std::net::TcpStream>>>) {
    use futures_util::SinkExt;
    let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
        return;
    };
    if ws.send(Message::text(r#"{"type":"hello"}"#)).await.is_err() {
        return;
    }
    let Ok(std) = ws.into_inner().into_std() else {
        return;
    };
    // Blocking writes: a round must reach every watcher.
    if std.set_nonblocking(false).is_ok() {
        kept.lock().unwrap().push(std);
    }
}

/// CPU time (user + system) of the calling thread so far, in µs.
fn thread_cpu_us() -> u64 {
    // SAFETY: getrusage on a zeroed local struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// One unmasked, final text frame (a server's), as the node writes it.
fn encode_text(text: &str) -> Vec<u8> {
    let len = text.len();
    let mut out = Vec::with_capacity(len + 10);
    out.push(0x81);
    if len < 126 {
        out.push(len as u8);
    } else if len <= u16::MAX as usize {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(text.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::encode_text;
    use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};

    #[test]
    fn frames_parse_back() {
        for n in [0, 125, 126, 200, 70_000] {
            let text = "x".repeat(n);
            let bytes = encode_text(&text);
            let mut cur = std::io::Cursor::new(&bytes[..]);
            let (header, len) = FrameHeader::parse(&mut cur).unwrap().unwrap();
            assert!(header.is_final);
            assert_eq!(len as usize, n);
            let _ = Frame::message(text, header.opcode, true);
        }
    }
}
