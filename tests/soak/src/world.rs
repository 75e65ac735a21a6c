//! What the soak starts: Redis, the sidecar binary on free loopback ports, and the soak's own
//! named Redis clients, with the idle sidecar's figures before the first subscription opened.

use fred::prelude::*;
use window_sidecar_harness::{Launch, RedisServer, SidecarProcess, free_port};

use crate::observe::{Rest, settled_rest};

/// A test-side Redis client, named so that `CLIENT LIST` tells it from the sidecar's
/// connections (which have no name).
async fn named_client(redis: &RedisServer, name: &str) -> Client {
    let client = redis.client().await;
    let _: Value = client
        .custom(fred::cmd!("CLIENT"), vec!["SETNAME", name])
        .await
        .expect("CLIENT SETNAME");
    client
}

/// Redis, the sidecar and the soak's own clients, with the sidecar's figures before the first
/// subscription opened. Fields drop in order: the sidecar goes before the Redis it talks to.
pub(crate) struct Rig {
    pub(crate) sidecar: SidecarProcess,
    pub(crate) listen: String,
    pub(crate) metrics_addr: String,
    /// At rest before any subscription.
    pub(crate) baseline: Rest,
    pub(crate) baseline_rss: u64,
    pub(crate) producers_redis: Client,
    /// Named so that `CLIENT LIST` tells the test's connections from the sidecar's.
    pub(crate) inspect: Client,
    _redis: RedisServer,
}

impl Rig {
    /// Starts Redis and the sidecar, and waits until the idle sidecar's figures settle.
    pub(crate) async fn start(bin: &std::path::Path) -> Rig {
        let redis = RedisServer::start();
        let inspect = named_client(&redis, "soak-inspect").await;
        let producers_redis = named_client(&redis, "soak-producers").await;
        let listen = format!("127.0.0.1:{}", free_port());
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let url = redis.url();
        let sidecar = Launch::with_bin(bin)
            .args([
                "--redis-url",
                &url,
                "--listen",
                &listen,
                "--metrics-listen",
                &metrics_addr,
                "--reclaim-interval",
                "2s",
                // Generous for a loaded 2-core machine: a flush slower than this would be
                // reported failed, which this soak treats as a defect.
                "--redis-timeout",
                "15s",
            ])
            .start();
        sidecar.wait_for("Redis answers: SERVING");
        let baseline = settled_rest(&sidecar, &inspect).await;
        let baseline_rss = sidecar.rss_kib();
        println!(
            "before any subscription: {} sidecar connections to Redis, {} fds, {} threads, RSS {baseline_rss} KiB",
            baseline.redis_connections, baseline.fds, baseline.threads
        );
        Rig {
            sidecar,
            listen,
            metrics_addr,
            baseline,
            baseline_rss,
            producers_redis,
            inspect,
            _redis: redis,
        }
    }
}
