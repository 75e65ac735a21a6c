//! What a run starts: Redis (one AOF-backed node, or a 3-primary cluster with a replica each)
//! with the sidecars' own user, and the sidecar binaries, each on its own port behind a proxy of
//! its own, restarted on that port after the nemesis takes one out.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tonic::transport::Channel;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar_harness::{
    RedisCluster, RedisServer, SidecarProcess, free_port, slot_of, try_http_get,
};

use crate::admin::SubscriptionState;
use crate::form;
use crate::proxy::Proxy;
use crate::refusal;

/// The Redis the run is against.
pub(crate) enum Backend {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    pub(crate) fn url(&self) -> String {
        match self {
            Backend::Single(redis) => redis.url(),
            Backend::Cluster(cluster) => cluster.url(),
        }
    }

    /// The port of the node that owns the campaign's keys.
    pub(crate) fn primary(&self) -> u16 {
        match self {
            Backend::Single(redis) => redis.port(),
            Backend::Cluster(cluster) => cluster.primary_for_slot(slot_of(form::STREAM)),
        }
    }

    /// The ports of every primary (the single node's own).
    pub(crate) fn primaries(&self) -> Vec<u16> {
        match self {
            Backend::Single(redis) => vec![redis.port()],
            Backend::Cluster(cluster) => cluster.primaries(),
        }
    }
}

/// The sidecars, by index: each on its own port, restarted on it after a kill, and each behind
/// a proxy that the workers go through.
pub(crate) struct Sidecars {
    redis_url: String,
    cluster: bool,
    /// The stream runs under retention by acknowledgement.
    retain: bool,
    pub(crate) ports: Vec<u16>,
    /// Each sidecar's `--metrics-listen` port: its admin view of open subscriptions.
    admin_ports: Vec<u16>,
    pub(crate) proxies: Vec<Proxy>,
    running: Mutex<Vec<Option<SidecarProcess>>>,
    /// The processes taken out by a bounce, for their logs.
    retired: Mutex<Vec<SidecarProcess>>,
}

impl Sidecars {
    pub(crate) async fn start(
        redis_url: &str,
        count: usize,
        cluster: bool,
        retain: bool,
    ) -> Arc<Self> {
        let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let admin_ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let mut proxies = Vec::new();
        for port in &ports {
            proxies.push(Proxy::start(([127, 0, 0, 1], *port).into()).await);
        }
        let sidecars = Arc::new(Self {
            redis_url: redis_url.to_owned(),
            cluster,
            retain,
            ports,
            admin_ports,
            proxies,
            running: Mutex::new((0..count).map(|_| None).collect()),
            retired: Mutex::new(Vec::new()),
        });
        let s = Arc::clone(&sidecars);
        tokio::task::spawn_blocking(move || (0..count).for_each(|i| s.restart(i)))
            .await
            .expect("sidecars");
        sidecars
    }

    /// Sidecar `i`'s own address (producers use it).
    pub(crate) fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i % self.ports.len()])
    }

    /// Sidecar `i` through its proxy (workers use it).
    pub(crate) fn proxied(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.proxies[i % self.proxies.len()].port)
    }

    fn restart(&self, i: usize) {
        let listen = self.addr(i);
        let admin = format!("127.0.0.1:{}", self.admin_ports[i]);
        let mut args = vec![
            // Read back at the end of the run (see `said`).
            "--log-format",
            "json",
            "--metrics-listen",
            &admin,
            "--reclaim-interval",
            "500ms",
            "--promote-interval",
            "100ms",
            "--consumer-lease",
            "2s",
            "--shutdown-grace",
            "1s",
            "--redis-timeout",
            "2s",
        ];
        if self.retain {
            args.extend([
                "--ack-retention",
                form::STREAM,
                "--retention-interval",
                "300ms",
            ]);
        }
        if self.cluster {
            // Claims reach the replica before entries are delivered: a failover then hands
            // nothing out twice (exactly once in atomic mode).
            args.extend(["--wait-replicas", "1"]);
        }
        let process = SidecarProcess::serve(&self.redis_url, &listen, &args);
        self.running.lock()[i] = Some(process);
    }

    /// Every sidecar's open subscriptions, from its admin view (None: it did not answer).
    pub(crate) async fn subscriptions(&self) -> Vec<Option<Vec<SubscriptionState>>> {
        let mut all = Vec::new();
        for port in &self.admin_ports {
            let answer = tokio::time::timeout(
                Duration::from_secs(2),
                try_http_get(format!("127.0.0.1:{port}"), "/subscriptions"),
            )
            .await;
            all.push(match answer {
                Ok(Ok((200, body))) => SubscriptionState::parse(&body),
                _ => None,
            });
        }
        all
    }

    /// Every answering sidecar's `/metrics` (each counts since it last started).
    pub(crate) async fn metrics(&self) -> Vec<String> {
        let mut bodies = Vec::new();
        for port in &self.admin_ports {
            let answer = tokio::time::timeout(
                Duration::from_secs(2),
                try_http_get(format!("127.0.0.1:{port}"), "/metrics"),
            )
            .await;
            if let Ok(Ok((200, body))) = answer {
                bodies.push(body);
            }
        }
        bodies
    }

    /// Every line the sidecars logged, those taken out by a bounce first.
    pub(crate) fn logged(&self) -> Vec<String> {
        let retired = self.retired.lock();
        let running = self.running.lock();
        retired
            .iter()
            .chain(running.iter().flatten())
            .flat_map(SidecarProcess::lines)
            .collect()
    }

    /// Takes sidecar `i` out (SIGKILL, or SIGTERM and its drain), then starts it again.
    pub(crate) fn bounce(&self, i: usize, graceful: bool, down_for: Duration) {
        let taken = self.running.lock()[i].take();
        if let Some(mut process) = taken {
            if graceful {
                process.terminate();
            } else {
                process.signal("KILL");
                process.wait_exit();
            }
            self.retired.lock().push(process);
        }
        std::thread::sleep(down_for);
        self.restart(i);
    }
}

/// A cluster of three primaries with a replica each, or one node that writes its AOF on every
/// command (a restart then loses nothing acknowledged); either with the sidecars' own user.
pub(crate) async fn start_backend(cluster: bool) -> Backend {
    tokio::task::spawn_blocking(move || {
        if cluster {
            let cluster = RedisCluster::start(3, 1);
            for port in cluster.ports() {
                refusal::create_user(port)
                    .unwrap_or_else(|e| panic!("the sidecars' user on {port}: {e}"));
            }
            Backend::Cluster(cluster)
        } else {
            let mut args = vec!["--appendonly", "yes", "--appendfsync", "always"];
            let user = refusal::user_args();
            args.extend(user.iter().map(String::as_str));
            Backend::Single(RedisServer::start_with(&args))
        }
    })
    .await
    .expect("redis")
}

/// A gRPC client of the sidecar at `addr`, or None when it does not answer within a second.
pub(crate) async fn client(addr: &str) -> Option<WindowServiceClient<Channel>> {
    let connect = WindowServiceClient::connect(format!("http://{addr}"));
    tokio::time::timeout(Duration::from_secs(1), connect)
        .await
        .ok()?
        .ok()
}
