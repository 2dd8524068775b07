//! A private `redis-server` for running without `--redis-url`: started from
//! the bundled redis.conf on its own port, data dir and log, stopped on exit.
//! Its directory, `presence-redis-<pid>-<port>` under `--local-redis-dir`,
//! is removed on exit; one left by a server that was killed is removed by
//! the next start there.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bundled configuration (the repository's redis.conf), compiled in so
/// that the binary runs from anywhere.
pub const REDIS_CONF: &str = include_str!("../../redis.conf");

/// What every private server's directory name starts with.
const DIR_PREFIX: &str = "presence-redis-";

/// How long to wait for the private server to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running private redis-server; killed and its directory removed on drop.
pub struct LocalRedis {
    child: Child,
    dir: PathBuf,
    /// `redis://127.0.0.1:<port>/0`.
    pub url: String,
}

/// Why the private Redis did not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalRedisError {
    /// The binary is not on PATH.
    #[error("no Redis: pass --redis-url (REDIS_URL) to use one, or install redis-server (Debian/Ubuntu: `sudo apt-get install -y redis-server`, macOS: `brew install redis`) for a private one")]
    NotInstalled,
    /// Anything else, with the server's log when there is one.
    #[error("could not start redis-server: {0}")]
    Start(String),
}

impl LocalRedis {
    /// Starts redis-server with the bundled config in a fresh directory
    /// under `parent` and waits until it answers.
    pub fn start(parent: &Path) -> Result<Self, LocalRedisError> {
        remove_stale(parent);
        let port = free_port().map_err(|e| LocalRedisError::Start(e.to_string()))?;
        let dir = parent.join(format!("{DIR_PREFIX}{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| LocalRedisError::Start(format!("cannot create {}: {e}", dir.display())))?;
        let conf = dir.join("redis.conf");
        std::fs::write(&conf, REDIS_CONF)
            .map_err(|e| LocalRedisError::Start(format!("cannot write {}: {e}", conf.display())))?;
        let log = dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        cmd.arg(&conf)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; it asks the kernel to stop
        // the private Redis if this process dies, even by SIGKILL.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(LocalRedisError::NotInstalled);
            }
            Err(e) => return Err(LocalRedisError::Start(e.to_string())),
        };
        let mut redis = Self {
            child,
            dir,
            url: format!("redis://127.0.0.1:{port}/0"),
        };
        redis.wait_ready(port, &log)?;
        log::info!(
            "started private redis-server on port {port} (data and log in {})",
            redis.dir.display()
        );
        Ok(redis)
    }

    fn wait_ready(&mut self, port: u16, log: &Path) -> Result<(), LocalRedisError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/0"))
            .map_err(|e| LocalRedisError::Start(e.to_string()))?;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                return Err(LocalRedisError::Start(format!(
                    "exited with {status}:\n{log}"
                )));
            }
            if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                return Err(LocalRedisError::Start(format!(
                    "no answer on port {port} after {START_TIMEOUT:?}:\n{log}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        // SIGTERM lets Redis exit cleanly; SIGKILL after a grace period.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        log::info!("stopped private redis-server");
    }
}

/// Removes the directories under `parent` that servers killed without a
/// chance to clean up (SIGKILL, a power cut) left behind: those whose
/// process is gone and whose Redis no longer answers on its port.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let Some((pid, port)) = entry.file_name().to_str().and_then(owner) else {
            continue;
        };
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if !is_dir || pid == std::process::id() || alive(pid) || listening(port) {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => log::info!(
                "removed {}, left by a server (pid {pid}) that is gone",
                entry.path().display()
            ),
            Err(e) => log::warn!("cannot remove {}: {e}", entry.path().display()),
        }
    }
}

/// The pid and port a private server's directory name holds.
fn owner(name: &str) -> Option<(u32, u16)> {
    let (pid, port) = name.strip_prefix(DIR_PREFIX)?.split_once('-')?;
    Some((pid.parse().ok()?, port.parse().ok()?))
}

/// Whether a process with this pid exists (EPERM: it does, another user's).
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether something accepts connections on this loopback port: a server in
/// another pid namespace sharing the directory would.
fn listening(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// A port free on loopback right now.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
