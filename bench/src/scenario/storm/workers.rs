//! The coordinator's side of the workers: each one a subprocess (the bench
//! run again as `storm-worker`, so that each process stays within the
//! open-file limit) or, for small runs, a task of this process; both speak
//! the same lines.

use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

use super::worker::{self, Spec};

/// What the workers said last, summed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub held: u64,
    pub watches: u64,
    pub dropped: u64,
    pub back: u64,
    pub last_back_us: u64,
    pub errors: u64,
}

/// One worker, as the coordinator sees it.
struct Handle {
    input: Pin<Box<dyn AsyncWrite + Send>>,
    /// Its last `stat` line, whether it said `calm`, and its `end` line.
    last: Arc<Mutex<Option<Value>>>,
    calm: Arc<AtomicBool>,
    end: Arc<Mutex<Option<Value>>>,
    reader: JoinHandle<()>,
    /// The subprocess (killed on drop) or the task.
    _child: Option<tokio::process::Child>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// All the workers of a run.
pub struct Workers {
    handles: Vec<Handle>,
}

impl Workers {
    /// Starts one worker per spec: in this process when `in_process`, else
    /// as `<this executable> storm-worker --spec <json>`.
    pub fn start(specs: Vec<Spec>, in_process: bool) -> anyhow::Result<Self> {
        let mut handles = Vec::new();
        for spec in specs {
            let (last, end) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)));
            let calm = Arc::new(AtomicBool::new(false));
            let handle = if in_process {
                let (ours, theirs) = tokio::io::duplex(1 << 16);
                let (their_in, their_out) = tokio::io::split(theirs);
                let (our_out, our_in) = tokio::io::split(ours);
                let task = tokio::spawn(worker::serve(spec, their_in, their_out));
                Handle {
                    input: Box::pin(our_in),
                    reader: read_lines(our_out, last.clone(), calm.clone(), end.clone()),
                    last,
                    calm,
                    end,
                    _child: None,
                    task: Some(task),
                }
            } else {
                let exe = std::env::current_exe().context("this executable")?;
                let mut child = tokio::process::Command::new(exe)
                    .args(["storm-worker", "--spec", &spec.to_json().to_string()])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .kill_on_drop(true)
                    .spawn()
                    .context("start a storm worker")?;
                let stdin = child.stdin.take().context("worker stdin")?;
                let stdout = child.stdout.take().context("worker stdout")?;
                Handle {
                    input: Box::pin(stdin),
                    reader: read_lines(stdout, last.clone(), calm.clone(), end.clone()),
                    last,
                    calm,
                    end,
                    _child: Some(child),
                    task: None,
                }
            };
            handles.push(handle);
        }
        Ok(Self { handles })
    }

    /// The sum of the workers' last `stat` lines.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for h in &self.handles {
            let last = h.last.lock().unwrap();
            let Some(v) = last.as_ref() else { continue };
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            t.held += n("held");
            t.watches += n("watches");
            t.dropped += n("dropped");
            t.back += n("back");
            t.errors += n("errors");
            t.last_back_us = t.last_back_us.max(n("last_back_us"));
        }
        t
    }

    /// Sends one command line to every worker.
    pub async fn send(&mut self, line: &str) -> anyhow::Result<()> {
        for h in &mut self.handles {
            h.input.write_all(format!("{line}\n").as_bytes()).await?;
            h.input.flush().await?;
        }
        Ok(())
    }

    /// Sends `calm` and waits until every worker has stopped counting
    /// events (so that no worker counts the offlines of another's devices
    /// closing at the end), then sends `end` and waits for every worker's
    /// summary.
    pub async fn end(mut self, kill_us: u64, held_us: u64) -> anyhow::Result<Vec<Value>> {
        self.send("calm").await?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !self.handles.iter().all(|h| h.calm.load(Ordering::SeqCst)) {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "a worker did not stop counting within 30 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.send(&format!("end {kill_us} {held_us}")).await?;
        let mut out = Vec::new();
        for h in self.handles {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), h.reader).await;
            if let Some(task) = h.task {
                task.await??;
            }
            let end = h.end.lock().unwrap().take();
            out.push(end.context("a worker ended without its summary")?);
        }
        Ok(out)
    }
}

/// Reads a worker's lines: `stat` into `last`, `calm` into `calm`, `end`
/// into `end`.
fn read_lines<R>(
    out: R,
    last: Arc<Mutex<Option<Value>>>,
    calm: Arc<AtomicBool>,
    end: Arc<Mutex<Option<Value>>>,
) -> JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut lines = BufReader::new(out).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            match v["t"].as_str() {
                Some("end") => {
                    *end.lock().unwrap() = Some(v);
                    return;
                }
                Some("calm") => calm.store(true, Ordering::SeqCst),
                _ => *last.lock().unwrap() = Some(v),
            }
        }
    })
}
