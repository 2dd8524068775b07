//! A private `redis-server` for running without `--redis-url`: started from
//! the bundled redis.conf on its own port, data dir and log, stopped on exit.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bundled configuration (the repository's redis.conf), compiled in so
/// that the binary runs from anywhere.
pub const REDIS_CONF: &str = include_str!("../../redis.conf");

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
    #[error("redis-server is not installed; install it (Debian/Ubuntu: `sudo apt-get install -y redis-server`, macOS: `brew install redis`) or pass --redis-url / REDIS_URL")]
    NotInstalled,
    /// Anything else, with the server's log when there is one.
    #[error("could not start redis-server: {0}")]
    Start(String),
}

impl LocalRedis {
    /// Starts redis-server with the bundled config in a fresh directory
    /// under `parent` and waits until it answers.
    pub fn start(parent: &Path) -> Result<Self, LocalRedisError> {
        let port = free_port().map_err(|e| LocalRedisError::Start(e.to_string()))?;
        let dir = parent.join(format!("presence-redis-{}-{port}", std::process::id()));
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

/// A port free on loopback right now.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
