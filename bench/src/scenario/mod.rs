//! One module per subcommand, each with its flags (`*Args`) and `run`.

pub mod attack;
pub mod churn;
pub mod connections;
pub mod cursors;
pub mod expiry;
pub mod fanout;
pub mod feed;
pub mod feed_deliver;
pub mod fleet;
pub mod join_policies;
pub mod online;
pub mod refresh;
pub mod rooms;
pub mod storm;
pub mod transitions;
pub mod watches;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use hdrhistogram::Histogram;
use tokio::sync::Semaphore;

use crate::client::{self, Held, Sources, Ws};

/// Connects `users` (device `d` each) to `node`, at most `concurrency`
/// handshakes at a time. Returns the sockets in order, the handshake
/// latencies (µs) and the first error, if any connection failed.
pub async fn connect_many(
    node: SocketAddr,
    sources: &Arc<Sources>,
    users: Vec<String>,
    concurrency: usize,
) -> anyhow::Result<(Vec<Ws>, Histogram<u64>)> {
    connect_many_as(node, sources, users, concurrency, |ws| ws).await
}

/// Like [`connect_many`], for devices that must stay alive meanwhile: each
/// is [`Held`] (answering pings) from the moment it is connected, not from
/// when the last one is.
pub async fn hold_many(
    node: SocketAddr,
    sources: &Arc<Sources>,
    users: Vec<String>,
    concurrency: usize,
) -> anyhow::Result<Vec<Held>> {
    let (held, _) = connect_many_as(node, sources, users, concurrency, Held::new).await?;
    Ok(held)
}

/// [`connect_many`], with each socket passed through `wrap` as soon as it
/// is connected.
async fn connect_many_as<T: Send + 'static>(
    node: SocketAddr,
    sources: &Arc<Sources>,
    users: Vec<String>,
    concurrency: usize,
    wrap: fn(Ws) -> T,
) -> anyhow::Result<(Vec<T>, Histogram<u64>)> {
    let sem = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(users.len());
    for user in users {
        let permit = sem.clone().acquire_owned().await?;
        let sources = sources.clone();
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let ws = client::connect(node, sources.next(), &user, "d").await;
            drop(permit);
            ws.map(|ws| (wrap(ws), start.elapsed()))
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    let mut hist = crate::report::latency_histogram();
    for t in tasks {
        let (ws, took) = t.await??;
        hist.saturating_record(took.as_micros() as u64);
        out.push(ws);
    }
    Ok((out, hist))
}

/// Splits `users` into watch lists of at most `per` (the node's
/// max_watches), one per watcher.
pub fn watch_lists(users: &[String], per: usize) -> Vec<Vec<String>> {
    users.chunks(per.max(1)).map(<[String]>::to_vec).collect()
}

/// One device of `user` that connects to `node` from `src`, stays `hold`,
/// then closes and waits briefly for the server's close answer. `mark(0)`
/// runs just before the connect (the online transition's start), `mark(1)`
/// just before the close frame (the offline one's).
pub async fn arrive_and_leave(
    node: SocketAddr,
    src: IpAddr,
    user: &str,
    hold: Duration,
    mark: impl Fn(usize),
) -> anyhow::Result<()> {
    mark(0);
    let mut ws = client::connect(node, src, user, "d").await?;
    tokio::time::sleep(hold).await;
    mark(1);
    ws.close(None).await?;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    Ok(())
}
