//! The many-subscriptions phase: one sidecar serving N subscriptions on N streams, all loaded
//! at once, beside one subscription consuming the same number of entries on the same
//! topology, on a single `redis-server` and on a 3-primary Redis Cluster.
//!
//! Each stream `many:{<i>}` holds `entries / N` entries; each subscription (the Rust tonic
//! client, pipeline mode, COUNT 64) runs `INCR many:{<i>}:done` per entry and acks it, so on a
//! cluster a stream and its side effect share a slot. A run is verified when every stream has
//! nothing pending, its XLEN is its entries and its counter is exactly its entries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fred::prelude::*;
use tokio::time::Instant;
use window_sidecar_harness::{RedisCluster, RedisServer};

use crate::client::{self, SidecarClient};
use crate::procs::{SidecarProcess, status_kb};
use crate::workload::{self, GROUP};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    SingleNode,
    Cluster,
}

impl Topology {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Topology::SingleNode => "single node",
            Topology::Cluster => "cluster, 3 primaries",
        }
    }
}

/// What one run of the phase measured.
#[derive(Clone, Debug)]
pub(crate) struct Many {
    pub subscriptions: usize,
    /// Deliveries/s of one subscription consuming all the entries.
    pub single_rate: f64,
    /// Deliveries/s of all subscriptions together, over the time until the last finished.
    pub aggregate_rate: f64,
    /// When half of all entries were settled: the smallest share a subscription had settled
    /// against the mean (1.0 is perfectly fair).
    pub slowest_share: f64,
    pub sidecar_hwm_kb: Option<u64>,
}

enum Redis {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Redis {
    fn start(topology: Topology) -> Self {
        match topology {
            Topology::SingleNode => Redis::Single(RedisServer::start()),
            Topology::Cluster => Redis::Cluster(RedisCluster::start(3, 0)),
        }
    }

    fn url(&self) -> String {
        match self {
            Redis::Single(redis) => redis.url(),
            Redis::Cluster(cluster) => cluster.url(),
        }
    }

    async fn client(&self) -> Client {
        match self {
            Redis::Single(redis) => redis.client().await,
            Redis::Cluster(cluster) => cluster.client().await,
        }
    }
}

fn stream(i: usize) -> String {
    format!("many:{{{i}}}")
}

fn counter(i: usize) -> String {
    format!("many:{{{i}}}:done")
}

/// One run: the single subscription, then `n` at once, each on a sidecar of its own.
pub(crate) async fn run(
    bin: &std::path::Path,
    topology: Topology,
    n: usize,
    entries: u64,
    window_reads: u32,
) -> Result<Many, String> {
    let per = (entries / n as u64).max(1);
    let (single_rate, _, _) = consume(bin, topology, 1, per * n as u64, window_reads).await?;
    let (aggregate_rate, slowest_share, sidecar_hwm_kb) =
        consume(bin, topology, n, per, window_reads).await?;
    Ok(Many {
        subscriptions: n,
        single_rate,
        aggregate_rate,
        slowest_share,
        sidecar_hwm_kb,
    })
}

/// `n` subscriptions of `per` entries each: their aggregate deliveries/s, the slowest share
/// and the sidecar's peak RSS.
async fn consume(
    bin: &std::path::Path,
    topology: Topology,
    n: usize,
    per: u64,
    window_reads: u32,
) -> Result<(f64, f64, Option<u64>), String> {
    let redis = Redis::start(topology);
    let admin = redis.client().await;
    for i in 0..n {
        workload::create_group_on(&admin, &stream(i)).await?;
        workload::fill_stream(&admin, &stream(i), per).await?;
    }
    let sidecar = SidecarProcess::start(bin, &redis.url(), &[]).await?;
    let progress: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::default()).collect();
    // One channel, as one application would hold: the subscriptions share its connection.
    let channel = client::connect_sidecar(sidecar.grpc).await?;
    let count = 64;
    let clients: Vec<SidecarClient> = progress
        .iter()
        .enumerate()
        .map(|(i, progress)| {
            SidecarClient::over(channel.clone(), count, window_reads * count, false).on_stream(
                stream(i),
                counter(i),
                Arc::clone(progress),
            )
        })
        .collect();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        tasks.spawn(client.run(per, false));
    }
    let halfway = tokio::spawn(halfway(progress, per * n as u64 / 2));
    let limit = Duration::from_secs(120) + Duration::from_millis(2 * per * n as u64);
    let deadline = started + limit;
    while let Some(joined) = tokio::time::timeout_at(deadline, tasks.join_next())
        .await
        .map_err(|_| format!("{n} subscriptions timed out after {limit:?}"))?
    {
        let outcome = joined.map_err(|e| format!("a subscription's task: {e}"))??;
        if outcome.acked < per {
            return Err(format!("a subscription acked {} of {per}", outcome.acked));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let hwm = status_kb(sidecar.pid(), "VmHWM");
    let settled = halfway.await.map_err(|e| format!("the watcher: {e}"))?;
    let mean = settled.iter().sum::<u64>() as f64 / n as f64;
    let slowest = settled.iter().copied().min().unwrap_or(0) as f64;
    for i in 0..n {
        verify(&admin, i, per).await?;
    }
    let _ = admin.quit().await;
    drop(sidecar);
    Ok(((per * n as u64) as f64 / secs, slowest / mean, hwm))
}

/// What each subscription had settled once `half` entries were settled in all.
async fn halfway(progress: Vec<Arc<AtomicU64>>, half: u64) -> Vec<u64> {
    loop {
        let settled: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
        if settled.iter().sum::<u64>() >= half {
            return settled;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Nothing pending on stream `i`, and its XLEN and side-effect counter are both `per`.
async fn verify(client: &Client, i: usize, per: u64) -> Result<(), String> {
    let pending: Value = client
        .custom(fred::cmd!("XPENDING"), vec![stream(i), GROUP.to_owned()])
        .await
        .map_err(|e| format!("XPENDING: {e}"))?;
    let pending = match pending {
        Value::Array(parts) => parts.first().and_then(Value::as_u64),
        _ => None,
    };
    let xlen: u64 = client
        .custom(fred::cmd!("XLEN"), vec![stream(i)])
        .await
        .map_err(|e| format!("XLEN: {e}"))?;
    let done: Option<u64> = client
        .get(counter(i))
        .await
        .map_err(|e| format!("GET: {e}"))?;
    if pending != Some(0) || xlen != per || done != Some(per) {
        return Err(format!(
            "stream {} not verified: XPENDING {pending:?} (want 0), XLEN {xlen}, counter \
             {done:?} (want {per})",
            stream(i)
        ));
    }
    Ok(())
}
