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
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let kept = sockets.clone();
        let (addr, stop, thread) = Acceptor::start(move |_, std: std::net::TcpStream| {
            // Blocking writes: a round must reach every watcher.
            if std.set_nonblocking(false).is_ok() {
                kept.lock().unwrap().push(std);
            }
        })?;
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
    /// `threads` threads, each taking its share in a tight loop, or with
    /// `pace` of busy work before each write (a server's own work per
    /// delivery). Returns the CPU time the writing threads used, in µs:
    /// (user, system).
    pub fn send(&self, text: &str, threads: usize, pace: std::time::Duration) -> (u64, u64) {
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
                            let until = std::time::Instant::now() + pace;
                            while std::time::Instant::now() < until {
                                std::hint::spin_loop();
                            }
                            // Watchers read all the time: the socket
                            // buffer has room for one small frame.
                            let _ = sock.write_all(frame);
                        }
                        let after = thread_cpu_us();
                        (after.0 - before.0, after.1 - before.1)
                    })
                })
                .collect();
            writers
                .into_iter()
                .map(|w| w.join().unwrap_or((0, 0)))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
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

/// The refresh floor: a bare WebSocket server that, after the handshake
/// and `hello`, only reads. Its connections are spread over two threads
/// (like the node's two workers), each a single-threaded runtime where every
/// connection is a task reading whatever arrives into a buffer of its own:
/// one readiness event, one task wakeup and one `recv` per frame, and nothing
/// else. What a received frame costs it is what any server pays on this box
/// before it does anything with the frame; `refresh` measures it in the
/// same run as the node.
pub struct ReadFloor {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Bytes read from every connection so far.
    bytes: Arc<std::sync::atomic::AtomicU64>,
    /// The reading threads' ids, for their CPU time.
    tids: Arc<Mutex<Vec<i32>>>,
    /// Ends the accept loop; the reading threads end with it.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ReadFloor {
    /// Reading threads, as the node's HTTP workers on this box.
    const THREADS: usize = 2;

    /// Starts it on 127.0.0.1.
    pub fn start() -> anyhow::Result<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        let bytes = Arc::new(AtomicU64::new(0));
        let tids = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        let mut readers = Vec::new();
        for _ in 0..Self::THREADS {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<std::net::TcpStream>();
            readers.push(tx);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (bytes, tids) = (bytes.clone(), tids.clone());
            threads.push(std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                tids.lock().unwrap().push(unsafe { libc::gettid() });
                rt.block_on(async move {
                    while let Some(std) = rx.recv().await {
                        let Ok(mut tcp) = tokio::net::TcpStream::from_std(std) else {
                            continue;
                        };
                        let bytes = bytes.clone();
                        tokio::spawn(async move {
                            use tokio::io::AsyncReadExt;
                            let mut buf = [0u8; 2048];
                            while let Ok(n @ 1..) = tcp.read(&mut buf).await {
                                bytes.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        });
                    }
                });
            }));
        }
        // The senders live in the acceptor: once it ends, so do the
        // reading threads, and their runtimes drop the connections.
        let (addr, stop, accept) = Acceptor::start(move |i, std| {
            let _ = readers[i % readers.len()].send(std);
        })?;
        threads.push(accept);
        Ok(Self {
            addr,
            bytes,
            tids,
            stop: Some(stop),
            threads,
        })
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// CPU time (user + system) the reading threads have used, in µs.
    pub fn cpu_us(&self) -> u64 {
        let tids = self.tids.lock().unwrap();
        tids.iter()
            .filter_map(|&t| crate::procs::thread_cpu_us(t))
            .sum()
    }
}

impl Drop for ReadFloor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The reading threads end once the accept thread has dropped their
        // senders; their runtimes drop the connections.
        for t in self.threads.drain(..).rev() {
            let _ = t.join();
        }
    }
}

/// The accepting half of both floors: a thread with a runtime of its own
/// that makes the WebSocket handshake and sends `hello` on each connection,
/// then hands the raw socket (non-blocking) and its number to `kept`.
struct Acceptor;

impl Acceptor {
    /// Starts it on 127.0.0.1. Returns the address, the sender that stops
    /// it, and its thread.
    fn start(
        kept: impl Fn(usize, std::net::TcpStream) + Send + Sync + 'static,
    ) -> anyhow::Result<(
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    )> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let kept = Arc::new(kept);
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let accept = async {
                    for i in 0.. {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = tcp.set_nodelay(true);
                        let kept = kept.clone();
                        tokio::spawn(async move {
                            if let Some(std) = hello(tcp).await {
                                kept(i, std);
                            }
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Ok((addr, stop, thread))
    }
}

/// The handshake and `hello`; the raw socket.
async fn hello(tcp: tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    use futures_util::SinkExt;
    let mut ws = tokio_tungstenite::accept_async(tcp).await.ok()?;
    ws.send(Message::text(r#"{"type":"hello"}"#)).await.ok()?;
    ws.into_inner().into_std().ok()
}

/// CPU time of the calling thread so far, in µs: (user, system).
fn thread_cpu_us() -> (u64, u64) {
    // SAFETY: getrusage on a zeroed local struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return (0, 0);
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime), us(ru.ru_stime))
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
