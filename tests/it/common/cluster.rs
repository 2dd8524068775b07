//! A real Redis Cluster for tests: three primaries with one replica each,
//! `redis-server --cluster-enabled yes` on free ports with the project's
//! redis.conf, joined by `redis-cli --cluster create`, with a short
//! `cluster-node-timeout` so that a killed primary's replica takes over in
//! a couple of seconds. Every process is killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{conn_at, free_port, wait_until, Node, DEADLINE, HEARTBEAT_MS};

/// `cluster-node-timeout` of the test clusters, ms.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One redis-server of the cluster.
pub struct ClusterNode {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Client port.
    pub port: u16,
}

impl ClusterNode {
    fn spawn(port: u16, bus: u16, node_timeout_ms: u64, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let child = presence_bench::procs::cluster_server(port, bus, dir.path(), node_timeout_ms)
            .expect("a copy of redis.conf")
            .args(extra)
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)");
        Self {
            child: Some(child),
            dir,
            port,
        }
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// The server's log file.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One shard as `CLUSTER NODES` tells it.
#[derive(Debug, Clone)]
pub struct Shard {
    /// The primary's port.
    pub primary: u16,
    /// Its replicas' ports.
    pub replicas: Vec<u16>,
    /// The slot ranges it serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl Shard {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// A 3-primary, 3-replica Redis Cluster on loopback.
pub struct Cluster {
    /// Its servers.
    pub nodes: Vec<ClusterNode>,
}

impl Cluster {
    /// Starts six servers, joins them into a cluster and waits until every
    /// node says `cluster_state:ok` and every replica is in sync.
    pub fn start() -> Self {
        Self::start_with(NODE_TIMEOUT_MS, &[])
    }

    /// [`Cluster::start`] with another `cluster-node-timeout`, ms (a longer
    /// one makes a failover as long as a production cluster's), and `extra`
    /// arguments for every redis-server.
    pub fn start_with(node_timeout_ms: u64, extra: &[&str]) -> Self {
        let mut nodes = Vec::new();
        while nodes.len() < 6 {
            let (port, bus) = (free_port(), free_port());
            if port == bus {
                continue;
            }
            let mut node = ClusterNode::spawn(port, bus, node_timeout_ms, extra);
            if Self::wait_ping(&mut node) {
                nodes.push(node);
            }
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (apt-get install -y redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_healthy(&[]);
        cluster
    }

    /// False when the server exited (its port was taken meanwhile).
    fn wait_ping(node: &mut ClusterNode) -> bool {
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            if !node.alive() {
                return false;
            }
            if let Ok(mut c) = conn_at(node.port) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start; log:\n{}", node.log());
    }

    /// Waits until every live node (not in `dead`) says the cluster is ok
    /// and knows only live primaries, and every replica is in sync.
    pub fn wait_healthy(&self, dead: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.healthy(dead) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become healthy; logs:\n{}",
                self.nodes
                    .iter()
                    .map(|n| format!("--- {}\n{}", n.port, n.log()))
                    .collect::<String>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the cluster is healthy now, `dead` left out (see
    /// [`Cluster::wait_healthy`]).
    pub fn is_healthy(&self, dead: &[u16]) -> bool {
        self.healthy(dead)
    }

    fn healthy(&self, dead: &[u16]) -> bool {
        let live: Vec<u16> = self
            .ports()
            .into_iter()
            .filter(|p| !dead.contains(p))
            .collect();
        for &port in &live {
            let Ok(mut c) = conn_at(port) else {
                return false;
            };
            let info: String = match redis::cmd("CLUSTER").arg("INFO").query(&mut c) {
                Ok(info) => info,
                Err(_) => return false,
            };
            if !info.contains("cluster_state:ok") {
                return false;
            }
        }
        let Some(shards) = self.try_shards(dead) else {
            return false;
        };
        if shards.len() != 3 || shards.iter().any(|s| dead.contains(&s.primary)) {
            return false;
        }
        // Every live replica is listed: just after `--cluster create` a node
        // may not know a replica yet, and one killed before its first sync
        // never takes over ("Disconnected from master for longer than
        // allowed").
        let listed: usize = shards
            .iter()
            .map(|s| s.replicas.iter().filter(|p| !dead.contains(p)).count())
            .sum();
        if listed + shards.len() + dead.len() != self.nodes.len() {
            return false;
        }
        // Replicas in sync, so that a primary's death can be taken over.
        for shard in &shards {
            for &replica in shard.replicas.iter().filter(|p| !dead.contains(p)) {
                let Ok(mut c) = conn_at(replica) else {
                    return false;
                };
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut c)
                    .unwrap_or_default();
                if !info.contains("master_link_status:up") {
                    return false;
                }
            }
        }
        true
    }

    /// Every server's port.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// One seed URL: the server finds the rest.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.live_port())
    }

    /// Every server as a comma-separated seed list.
    pub fn seeds(&self) -> String {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The shards as a live node sees them, ordered by their first slot.
    pub fn shards(&self) -> Vec<Shard> {
        let dead: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_none())
            .map(|n| n.port)
            .collect();
        self.try_shards(&dead).expect("CLUSTER NODES")
    }

    /// The shards as a live node sees them, `dead` left out.
    pub fn shards_without(&self, dead: &[u16]) -> Vec<Shard> {
        self.try_shards(dead).unwrap_or_default()
    }

    fn try_shards(&self, dead: &[u16]) -> Option<Vec<Shard>> {
        let port = self.ports().into_iter().find(|p| !dead.contains(p))?;
        let mut c = conn_at(port).ok()?;
        let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()?;
        let mut primaries: Vec<(String, Shard)> = Vec::new();
        let mut replicas: Vec<(String, u16)> = Vec::new();
        for line in text.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 8 {
                continue;
            }
            let port: u16 = parts[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let flags = parts[2];
            if flags.contains("fail") && !flags.contains("fail?") {
                continue;
            }
            if flags.contains("master") {
                let slots = parts[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| match s.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => s.parse().ok().map(|n| (n, n)),
                    })
                    .collect::<Vec<(u16, u16)>>();
                if slots.is_empty() {
                    continue;
                }
                primaries.push((
                    parts[0].to_string(),
                    Shard {
                        primary: port,
                        replicas: Vec::new(),
                        slots,
                    },
                ));
            } else if flags.contains("slave") {
                replicas.push((parts[3].to_string(), port));
            }
        }
        for (master, port) in replicas {
            if let Some((_, shard)) = primaries.iter_mut().find(|(id, _)| *id == master) {
                shard.replicas.push(port);
            }
        }
        let mut shards: Vec<Shard> = primaries.into_iter().map(|(_, s)| s).collect();
        shards.sort_by_key(|s| s.slots.iter().map(|r| r.0).min());
        Some(shards)
    }

    /// The port of a server not killed.
    fn live_port(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live server")
            .port
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        let mut c = self.conn(self.live_port());
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .unwrap()
    }

    /// A user id starting with `prefix` whose keys live on `shard`.
    pub fn user_on(&self, shard: &Shard, prefix: &str) -> String {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|u| shard.serves(self.slot(u)))
            .unwrap()
    }

    /// The shard serving `user`'s keys.
    pub fn shard_of(&self, user: &str) -> Shard {
        let slot = self.slot(user);
        self.shards().into_iter().find(|s| s.serves(slot)).unwrap()
    }

    /// A blocking connection to the server on `port`.
    pub fn conn(&self, port: u16) -> redis::Connection {
        conn_at(port).expect("cluster node reachable")
    }

    /// Kills the server on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port).unwrap();
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Subscribers of `user`'s events channel, asked of the node that
    /// serves its slot.
    pub fn shard_subscribers(&self, user: &str) -> i64 {
        let port = self.shard_of(user).primary;
        let mut c = self.conn(port);
        let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(format!("presence-events:{{{user}}}"))
            .query(&mut c)
            .unwrap();
        redis::from_redis_value_ref(&reply[1]).unwrap()
    }

    /// Waits until `user`'s channel has `n` subscribers.
    pub async fn wait_subscribers(&self, user: &str, n: i64) {
        wait_until(
            &format!("{n} subscriber(s) of {user}'s events"),
            DEADLINE,
            || async { self.shard_subscribers(user) == n },
        )
        .await;
    }

    /// Starts a presence-server node on this cluster (one seed URL).
    pub fn node(&self, id: &str) -> Node {
        self.node_with(id, &[])
    }

    /// Starts a node with extra flags.
    pub fn node_with(&self, id: &str, extra: &[&str]) -> Node {
        let mut args: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--redis-url".into(),
            self.url(),
            "--node-id".into(),
            id.into(),
        ];
        if !extra.contains(&"--heartbeat-ms") {
            args.extend(["--heartbeat-ms".to_string(), HEARTBEAT_MS.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Node::spawn(id, &args, &[])
            .unwrap_or_else(|logs| panic!("node {id} did not start:\n{logs}"))
    }
}
