//! A minimal HTTP/1.1 server for the scenarios that play the app's backend
//! (the room-join proxy, the webhook receiver): keep-alive, one request at
//! a time per connection, `Content-Length` bodies; `answer` gives each
//! request's status and body.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Serves on a random loopback port until the process ends; its address.
pub async fn serve<F>(answer: F) -> anyhow::Result<SocketAddr>
where
    F: Fn(&[u8]) -> (u16, String) + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(connection(sock, answer.clone()));
        }
    });
    Ok(addr)
}

/// One connection's requests, answered in turn.
async fn connection<F>(mut sock: TcpStream, answer: Arc<F>)
where
    F: Fn(&[u8]) -> (u16, String),
{
    let _ = sock.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        // One request: its head, then Content-Length bytes.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !read_more(&mut sock, &mut buf).await {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            if !read_more(&mut sock, &mut buf).await {
                return;
            }
        }
        let (status, body) = answer(&buf[head_end..head_end + len]);
        buf.drain(..head_end + len);
        let reply = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if sock.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads what `sock` has into `buf`; false at its end.
async fn read_more(sock: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16384];
    match sock.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}
