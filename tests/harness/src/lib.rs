//! The test kit. Real `redis-server` processes for tests: each on a free loopback port, without
//! persistence, killed (by pid) when dropped. Nothing here mocks Redis. And the sidecar they
//! test, with what a test talks to it with:
//! * [`Sidecar`] (module [`sidecar`]): the sidecar in this process, on a free port.
//! * [`SidecarProcess`] and [`Launch`] (module [`process`]): the real binary as a child process
//!   (its log lines, signals, `/proc` figures); [`sidecar_bin`] says which binary.
//! * [`Subscription`] and [`Worker`] (module [`client`]): one Subscribe stream; a subscription
//!   that acks with side effects counted in Redis. [`STEP`], [`stream_open`] and the messages.
//! * [`FailoverWorker`] and [`Monitor`] (module [`failover`]): a client that keeps going through
//!   failovers, and what the node that took over executed.
//! * [`http_get`], [`scrape`] and the exposition readers [`sample`], [`series`],
//!   [`metric_sum`] (module [`http`]).
//!
//! Topologies beyond a single server:
//! * [`RedisCluster`] (module [`cluster`]): a Redis Cluster with replicas, failover, restart and
//!   slot migration.
//! * [`Sentinels`] (module [`sentinel`]): a primary, a replica and N sentinels.
//! * [`TlsMaterial`] / [`TlsRedisServer`] (module [`tls`]): certificates via the `openssl` CLI
//!   and a TLS-only server.
//! * [`acl_user`] and [`RedisServer::start_with_password`] (module [`acl`]).
//! * [`resp`]: a tiny blocking RESP client for poking individual nodes.
//!
//! What a family of tests spread over several files shares:
//! * [`dead_letters`]: the dead-letter service's client and command, and dead letters made the
//!   way subscriptions make them.
//! * [`refusals`]: the forms whose requeues Redis refuses, the faults that make it refuse them,
//!   and the checks of what comes back once it takes writes again.
//! * [`faults`]: the stream the fault injection tests fill, and what a worker's side effects
//!   tallied of it.
//! * [`forms`]: the opens of the list and pub/sub forms, and a window answered read by read.
//! * [`retention`]: a stream's consumers by hand and through the sidecar.
//! * [`telemetry`]: OTLP receivers, the binary traced and logging JSON, and a subscription
//!   answered with the producer's and the client's trace contexts.
//!
//! Every process is SIGKILLed by pid on drop and its temp dir removed (set
//! `HARNESS_KEEP_DIRS=1` to keep the dirs, with each node's `redis.log`, for debugging).

pub mod acl;
pub mod client;
pub mod cluster;
pub mod dead_letters;
pub mod failover;
pub mod faults;
pub mod forms;
pub mod http;
pub mod process;
pub mod refusals;
pub mod resp;
pub mod retention;
pub mod sentinel;
pub mod sidecar;
pub mod telemetry;
pub mod tls;
mod util;

pub use acl::{acl_user, url_with_auth};
pub use client::*;
pub use cluster::{RedisCluster, SlotMigration, slot_of};
pub use failover::*;
pub use http::*;
pub use process::*;
pub use sentinel::Sentinels;
pub use sidecar::Sidecar;
pub use tls::{TlsMaterial, TlsRedisServer};
pub use util::info_field;
pub use util::tail as tail_file;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;

/// A free TCP port on 127.0.0.1 (free when asked; callers retry on a lost race), below the
/// kernel's ephemeral range: a port the kernel handed out for `:0` would be free again once
/// probed, and the next listener on `:0` (a sidecar's gRPC port) or outgoing connection could be
/// given the same one before its caller binds it.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let (low, high) = (10_000, ephemeral.max(10_001));
    let span = high - low;
    // Test processes running side by side start at different places.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = (low + (start + next) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {low} and {high}")
}

/// `127.0.0.1` with a free port, for a listener of the sidecar (gRPC, metrics) to bind.
pub fn listen_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// The Redis server binary the tests run: `WINDOW_TEST_REDIS_SERVER` (CI's server matrix runs
/// the server-dependent suites again against Redis 8 and Valkey through it), else
/// `redis-server` on the PATH.
pub fn redis_server_bin() -> String {
    std::env::var("WINDOW_TEST_REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!(
                "window-sidecar-redis-{port}-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut server = Self {
                child: None,
                port,
                dir,
                extra: extra.clone(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!(
            "could not start redis-server on a free port after 5 attempts (is redis-server installed?)"
        );
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new(redis_server_bin());
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command
            .spawn()
            .expect("redis-server is installed and runnable");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false; // exited: most likely the port was taken meanwhile
            }
            match self.answering_pid() {
                Some(reported) if reported == pid => return true,
                // Another test's server holds the port: ours cannot bind and will exit.
                Some(_) => break,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        self.kill();
        false
    }

    /// The `process_id` of whatever server answers on the port, once one does. A connect
    /// alone proves nothing: with tests in parallel, a port picked as free can be another
    /// test's server for a moment.
    fn answering_pid(&self) -> Option<u32> {
        let mut conn = resp::Conn::connect(self.port).ok()?;
        if let Some(at) = self.extra.iter().position(|arg| arg == "--requirepass") {
            let password = self.extra.get(at + 1)?;
            conn.call(&["AUTH", password.as_str()]).ok()?;
        }
        match conn.call(&["INFO", "server"]).ok()? {
            resp::Reply::Bulk(info) => info_field(&String::from_utf8_lossy(&info), "process_id")?
                .parse()
                .ok(),
            _ => None, // still loading, or not a server yet
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL by pid): everything in memory is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty, since nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// A connected fred client for inspecting the server from a test.
    pub async fn client(&self) -> Client {
        let config = Config::from_url(&self.url()).expect("valid url");
        let client = Builder::from_config(config).build().expect("client");
        client
            .init()
            .await
            .expect("connect to the test redis-server");
        client
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Calls of one command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
pub async fn command_calls(client: &Client, command: &str) -> u64 {
    let info: String = client
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Entries pending in a consumer group (XPENDING summary count).
pub async fn pending(client: &Client, key: &str, group: &str) -> u64 {
    let reply: Value = client
        .custom(
            fred::cmd!("XPENDING"),
            vec![key.to_owned(), group.to_owned()],
        )
        .await
        .expect("XPENDING");
    match reply {
        Value::Array(parts) => parts
            .first()
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("XPENDING summary without a count: {parts:?}")),
        other => panic!("unexpected XPENDING reply {other:?}"),
    }
}

/// The entries pending in a consumer group (XPENDING's extended form): (id, consumer,
/// deliveries) each.
pub async fn pending_rows(client: &Client, key: &str, group: &str) -> Vec<(String, String, u64)> {
    let reply: Value = client
        .custom(fred::cmd!("XPENDING"), vec![key, group, "-", "+", "100"])
        .await
        .unwrap();
    let Value::Array(rows) = reply else {
        panic!("XPENDING: {reply:?}")
    };
    rows.into_iter()
        .map(|row| {
            let Value::Array(row) = row else {
                panic!("XPENDING row: {row:?}")
            };
            (
                row[0].as_string().unwrap(),
                row[1].as_string().unwrap(),
                row[3].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Polls `check` until it returns true or `timeout` passes; returns whether it did.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A fred builder for topology tests: reconnects every 100 ms without limit, 1 s connection
/// timeout, 5 s internal command timeout, up to 20 attempts per command, 10 redirections.
pub fn reconnecting_builder(config: Config) -> Builder {
    let mut builder = Builder::from_config(config);
    builder
        .set_policy(ReconnectPolicy::new_constant(0, 100))
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(1);
            c.internal_command_timeout = Duration::from_secs(5);
            c.max_command_attempts = 20;
            c.max_redirections = 10;
        });
    builder
}

/// A connected fred client for any URL fred understands (see [`reconnecting_builder`]).
pub async fn connect(url: &str) -> Client {
    let config = Config::from_url(url).unwrap_or_else(|e| panic!("bad redis url {url}: {e}"));
    let client = reconnecting_builder(config).build().expect("client");
    client
        .init()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    client
}
