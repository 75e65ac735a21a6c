//! Ordered across replicas: a partitioned stream (`StreamSource.partitions`), its partitions
//! `bench:{0}` … `bench:{P-1}` shared out among the replicas of group `g`, each replica a
//! sidecar process of its own with one client stream under its own consumer name. The
//! `sidecar-rust-replicas-<n>` contenders run it on a single `redis-server`; the
//! many-partitions phase runs it with more partitions on a 3-primary Redis Cluster and reads
//! every primary's `INFO commandstats`.
//!
//! The entries are keyed as `sidecar-rust-ordered-64`'s (1,000 keys round-robin, the key in
//! field `k`) and written by the bench straight to their key's partition, as a producer that
//! writes itself computes it ([`partition::of_key`], the sidecar's own FNV-1a). They are all in
//! Redis before the clock but not yet new to the group: each partition's group is created at
//! `$`, and its last entry is held back. The replicas open, and settle (each reads exactly the
//! partitions [`partition::assign`] gives it, no hand-over under way) before the clock. Then
//! the clock starts and one pipeline sets every partition's group back to `0` and appends the
//! held-back entries, which wakes the replicas' blocked reads. The run ends when every replica
//! has had its partitions' entries acknowledged; the subscriptions stay open until then, so
//! that a replica done first does not hand its partitions to the others while they run.
//!
//! A run is verified when nothing is pending on any partition, each partition's XLEN is its
//! entries, each key's list (the side effect, `RPUSH order:<key> <id>`) holds exactly its ids
//! in stream order (so the side effects ran exactly N times), and the ids handed out to the
//! clients, in the order this process received them across every replica, are each key's ids
//! in stream order, each once.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use tokio::time::Instant;
use window_sidecar::partition;
use window_sidecar_harness::{RedisCluster, RedisServer, cpu_seconds, slot_of, try_http_get};

use crate::Measured;
use crate::client::{ClientOutcome, HandedOut, OpenStream, SidecarClient};
use crate::procs::{SidecarProcess, metric_sum, status_kb};
use crate::workload::{self, GROUP, Keying, STREAM};

/// The partitions of the replicas contenders' stream. Divisible by 1, 2 and 3: each replica
/// count splits them evenly (six, three or two each), so the three contenders compare groups
/// whose replicas do equal shares; more than the replicas, as the design asks, and few enough
/// that each partition keeps a backlog of N / 6 entries (its reads full, COUNT 64) as
/// `sidecar-rust-ordered-64`'s one stream does.
pub(crate) const PARTITIONS: u32 = 6;

/// The replicas of the many-partitions phase: one per primary of the cluster.
pub(crate) const CLUSTER_REPLICAS: usize = 3;

/// The replicas' `--consumer-lease`. A replica renews its membership every third of it, which
/// is how soon the others see it join: 3 s lets the group settle in about a second before the
/// clock (the default 10 s takes up to 3.3 s a run), and still leaves a replica 2.4 s (four
/// fifths of it) without a confirmed renewal before it fences itself.
const LEASE: &str = "3s";

/// How long the replicas may take to settle before the run counts as failed.
const SETTLE: Duration = Duration::from_secs(20);

/// The keys of every run here: `sidecar-rust-ordered-64`'s.
const KEYING: Keying = Keying::RoundRobin;

/// What one replica (its sidecar process and its client) did in a run.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    /// Its consumer name.
    pub name: String,
    /// The partitions it read.
    pub partitions: Vec<u32>,
    /// The deliveries its client acknowledged.
    pub deliveries: u64,
    /// Its sidecar's CPU seconds during the run.
    pub cpu_s: Option<f64>,
    /// Its sidecar's peak RSS (kB).
    pub hwm_kb: Option<u64>,
}

/// One Redis primary in a run.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub port: u16,
    /// The partitions whose streams it holds.
    pub partitions: Vec<u32>,
    /// Its CPU seconds during the run.
    pub cpu_s: Option<f64>,
    /// Calls per command during the run (`INFO commandstats` after `CONFIG RESETSTAT`), without
    /// the bench's own `INFO` and `CONFIG`, most called first.
    pub commands: Vec<(String, u64)>,
}

impl Node {
    pub(crate) fn total(&self) -> u64 {
        self.commands.iter().map(|(_, n)| n).sum()
    }

    /// The calls of one command (lower case, as `INFO commandstats` names it).
    pub(crate) fn calls(&self, name: &str) -> u64 {
        self.commands
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, n)| *n)
    }
}

/// What one run of a group measured.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub partitions: u32,
    pub entries: u64,
    pub secs: f64,
    pub replicas: Vec<Replica>,
    /// This process's CPU seconds: every replica's client.
    pub client_cpu: Option<f64>,
    /// The primaries, in slot order (a single node: itself).
    pub nodes: Vec<Node>,
    /// Over every sidecar's `/metrics`, during the run.
    pub reads: u64,
    pub round_trips: u64,
    pub flush_round_trips: u64,
    pub flush_mean_ms: Option<f64>,
    /// Flat out: each entry's read's arrival at its client to the report that settled it.
    pub lat_us: Vec<u64>,
}

impl Group {
    pub(crate) fn rate(&self) -> f64 {
        self.entries as f64 / self.secs
    }

    /// The sidecars' CPU seconds together.
    pub(crate) fn sidecars_cpu(&self) -> Option<f64> {
        self.replicas.iter().map(|r| r.cpu_s).sum()
    }

    /// The primaries' CPU seconds together.
    pub(crate) fn redis_cpu(&self) -> Option<f64> {
        self.nodes.iter().map(|n| n.cpu_s).sum()
    }
}

/// Where the group's Redis runs.
enum Deployment {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Deployment {
    fn url(&self) -> String {
        match self {
            Deployment::Single(redis) => redis.url(),
            Deployment::Cluster(cluster) => cluster.url(),
        }
    }

    async fn client(&self) -> Client {
        match self {
            Deployment::Single(redis) => redis.client().await,
            Deployment::Cluster(cluster) => cluster.client().await,
        }
    }

    /// The primaries (port, pid) in slot order, and the slot ranges each serves.
    fn layout(&self) -> Layout {
        match self {
            Deployment::Single(redis) => Layout {
                nodes: vec![(redis.port(), redis.pid())],
                ranges: Vec::new(),
            },
            Deployment::Cluster(cluster) => {
                let ranges: Vec<((u16, u16), u16)> = cluster.slot_owners().into_iter().collect();
                let mut nodes: Vec<(u16, Option<u32>)> = Vec::new();
                for (_, port) in &ranges {
                    if !nodes.iter().any(|(p, _)| p == port) {
                        nodes.push((*port, cluster.pid(*port)));
                    }
                }
                Layout { nodes, ranges }
            }
        }
    }
}

/// A deployment's primaries and who serves which slots.
struct Layout {
    nodes: Vec<(u16, Option<u32>)>,
    /// Empty on a single node.
    ranges: Vec<((u16, u16), u16)>,
}

impl Layout {
    /// The index in `nodes` of the primary holding `key`.
    fn node_of(&self, key: &str) -> usize {
        let slot = slot_of(key);
        let port = self
            .ranges
            .iter()
            .find(|((first, last), _)| (*first..=*last).contains(&slot))
            .map(|(_, port)| *port);
        port.and_then(|port| self.nodes.iter().position(|(p, _)| *p == port))
            .unwrap_or(0)
    }
}

/// The stream of partition `p`.
fn stream(p: u32) -> String {
    partition::stream_key(STREAM, p)
}

/// The partition of entry `id`: its key's, as the sidecar's `Publish` routes it.
fn partition_of(id: u64, partitions: u32) -> u32 {
    partition::of_key(KEYING.key_of(id).as_bytes(), partitions)
}

/// One `sidecar-rust-replicas-<replicas>` run: a group of `replicas` on a single
/// `redis-server`, over [`PARTITIONS`] partitions.
pub(crate) async fn run_contender(
    bin: &Path,
    replicas: usize,
    entries: u64,
    window_reads: u32,
) -> Result<Measured, String> {
    let redis = Deployment::Single(RedisServer::start());
    let group = consume(&redis, bin, replicas, PARTITIONS, entries, window_reads).await?;
    let node = group.nodes.first().ok_or("no Redis node")?;
    Ok(Measured {
        entries: group.entries,
        secs: group.secs,
        commands: node.commands.clone(),
        reads: group.reads,
        round_trips: group.round_trips,
        flush_round_trips: Some(group.flush_round_trips),
        sidecar_cpu: group.sidecars_cpu(),
        client_cpu: group.client_cpu,
        redis_cpu: node.cpu_s,
        sidecar_hwm_kb: group.replicas.iter().filter_map(|r| r.hwm_kb).max(),
        flush_mean_ms: group.flush_mean_ms,
        lat_us: group.lat_us.clone(),
        replicas: group.replicas,
        ..Default::default()
    })
}

/// One run of the many-partitions phase: [`CLUSTER_REPLICAS`] replicas over `partitions`
/// partitions on a 3-primary cluster, each side effect's list in its partition's slot.
pub(crate) async fn run_cluster(
    bin: &Path,
    partitions: u32,
    entries: u64,
    window_reads: u32,
) -> Result<Group, String> {
    let redis = Deployment::Cluster(RedisCluster::start(3, 0));
    consume(
        &redis,
        bin,
        CLUSTER_REPLICAS,
        partitions,
        entries,
        window_reads,
    )
    .await
}

/// CPU seconds used so far by the sidecars, the primaries and this process.
struct CpuMark {
    sidecars: Vec<Option<f64>>,
    nodes: Vec<Option<f64>>,
    bench: Option<f64>,
}

impl CpuMark {
    fn take(sidecars: &[SidecarProcess], layout: &Layout) -> Self {
        Self {
            sidecars: sidecars.iter().map(|s| cpu_seconds(s.pid())).collect(),
            nodes: layout
                .nodes
                .iter()
                .map(|(_, pid)| pid.and_then(cpu_seconds))
                .collect(),
            bench: cpu_seconds(std::process::id()),
        }
    }
}

fn used(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some(after? - before?)
}

/// A sidecar's counters (reads, round trips, flush round trips, flush seconds, flushes).
async fn counters(sidecar: &SidecarProcess) -> Result<[f64; 5], String> {
    let metrics = sidecar.scrape().await?;
    let rt = "window_sidecar_redis_round_trips_total";
    Ok([
        metric_sum(&metrics, "window_sidecar_reads_total", ""),
        metric_sum(&metrics, rt, ""),
        metric_sum(&metrics, rt, "kind=\"flush\""),
        metric_sum(&metrics, "window_sidecar_flush_duration_seconds_sum", ""),
        metric_sum(&metrics, "window_sidecar_flush_duration_seconds_count", ""),
    ])
}

/// A group of `replicas` consuming `entries` entries over `partitions` partitions on `redis`.
async fn consume(
    redis: &Deployment,
    bin: &Path,
    replicas: usize,
    partitions: u32,
    entries: u64,
    window_reads: u32,
) -> Result<Group, String> {
    let layout = redis.layout();
    let cluster = matches!(redis, Deployment::Cluster(_));
    let admin = redis.client().await;
    // Each partition's entries in stream order, its last held back until the clock.
    let mut ids: Vec<Vec<u64>> = vec![Vec::new(); partitions as usize];
    for id in 0..entries {
        ids[partition_of(id, partitions) as usize].push(id);
    }
    let held: Vec<Option<u64>> = ids.iter().map(|p| p.last().copied()).collect();
    let early: Vec<u64> = (0..entries)
        .filter(|id| held[partition_of(*id, partitions) as usize] != Some(*id))
        .collect();
    workload::fill_keyed_to(&admin, &early, KEYING, |id| {
        stream(partition_of(id, partitions))
    })
    .await?;
    for p in 0..partitions {
        let _: Value = admin
            .xgroup_create(stream(p), GROUP, "$", true)
            .await
            .map_err(|e| format!("XGROUP CREATE {}: {e}", stream(p)))?;
    }
    let names: Vec<String> = (1..=replicas).map(|i| format!("replica-{i}")).collect();
    let owners = partition::assign(&names, partitions);
    let mine: Vec<Vec<u32>> = (0..replicas)
        .map(|i| {
            (0..partitions)
                .filter(|p| owners[*p as usize] == Some(i))
                .collect()
        })
        .collect();
    let expect: Vec<u64> = mine
        .iter()
        .map(|ps| ps.iter().map(|p| ids[*p as usize].len() as u64).sum())
        .collect();
    let mut sidecars = Vec::with_capacity(replicas);
    for _ in 0..replicas {
        sidecars
            .push(SidecarProcess::start(bin, &redis.url(), &["--consumer-lease", LEASE]).await?);
    }
    let handed: HandedOut = Arc::new(Mutex::new(Vec::with_capacity(entries as usize)));
    let count = 64;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, sidecar) in sidecars.iter().enumerate() {
        let client = SidecarClient::connect(sidecar.grpc, count, window_reads * count, false)
            .await?
            .ordered(KEYING)
            .replica(partitions, names[i].clone(), Arc::clone(&handed), cluster);
        let expect = expect[i];
        tasks.spawn(async move { (i, client.run_open(expect, false).await) });
    }
    settle(&sidecars, &names, &mine).await?;
    let mut nodes = Vec::with_capacity(layout.nodes.len());
    for (port, _) in &layout.nodes {
        let node = workload::connect(&format!("redis://127.0.0.1:{port}")).await?;
        workload::reset_stats(&node).await?;
        nodes.push(node);
    }
    let mut counted = Vec::with_capacity(replicas);
    for sidecar in &sidecars {
        counted.push(counters(sidecar).await?);
    }

    let before = CpuMark::take(&sidecars, &layout);
    let started = Instant::now();
    go(&admin, &held).await?;
    let limit = Duration::from_secs(60) + Duration::from_millis(2 * entries);
    let deadline = started + limit;
    let mut outcomes: Vec<Option<ClientOutcome>> = (0..replicas).map(|_| None).collect();
    let mut open: Vec<OpenStream> = Vec::with_capacity(replicas);
    while let Some(joined) = tokio::time::timeout_at(deadline, tasks.join_next())
        .await
        .map_err(|_| format!("timed out after {limit:?}"))?
    {
        let (i, result) = joined.map_err(|e| format!("a replica's task: {e}"))?;
        let (outcome, stream) = result.map_err(|e| format!("{}: {e}", names[i]))?;
        outcomes[i] = Some(outcome);
        open.push(stream);
    }
    let done_at = outcomes
        .iter()
        .flatten()
        .filter_map(|o| o.done_at)
        .max()
        .unwrap_or_else(Instant::now);
    // Every replica is done: they may leave the group now.
    let mut closing = tokio::task::JoinSet::new();
    for stream in open {
        closing.spawn(stream.close());
    }
    while closing.join_next().await.is_some() {}
    let after = CpuMark::take(&sidecars, &layout);

    let mut group = Group {
        partitions,
        entries,
        secs: (done_at - started).as_secs_f64(),
        replicas: Vec::with_capacity(replicas),
        client_cpu: used(before.bench, after.bench),
        nodes: Vec::with_capacity(nodes.len()),
        reads: 0,
        round_trips: 0,
        flush_round_trips: 0,
        flush_mean_ms: None,
        lat_us: Vec::with_capacity(entries as usize),
    };
    for (i, ((port, _), node)) in layout.nodes.iter().zip(&nodes).enumerate() {
        let held_here: Vec<u32> = (0..partitions)
            .filter(|p| layout.node_of(&stream(*p)) == i)
            .collect();
        let mut commands = workload::command_stats(node).await?;
        // The bench's own start is not the group's work.
        let appended = held_here.iter().filter(|p| held[**p as usize].is_some());
        uncount(&mut commands, "xadd", appended.count() as u64);
        if !uncount(&mut commands, "xgroup|setid", held_here.len() as u64) {
            uncount(&mut commands, "xgroup", held_here.len() as u64);
        }
        group.nodes.push(Node {
            port: *port,
            partitions: held_here,
            cpu_s: used(before.nodes[i], after.nodes[i]),
            commands,
        });
        let _ = node.quit().await;
    }
    let (mut flush_s, mut flushes) = (0.0, 0.0);
    for (i, sidecar) in sidecars.iter().enumerate() {
        let [reads, rts, flush_rts, sum, n] = counters(sidecar).await?;
        let [reads0, rts0, flush_rts0, sum0, n0] = counted[i];
        group.reads += (reads - reads0) as u64;
        group.round_trips += (rts - rts0) as u64;
        group.flush_round_trips += (flush_rts - flush_rts0) as u64;
        flush_s += sum - sum0;
        flushes += n - n0;
        let outcome = outcomes[i].take().ok_or("a replica without an outcome")?;
        crate::check_outcome(&outcome, expect[i]).map_err(|e| format!("{}: {e}", names[i]))?;
        group.replicas.push(Replica {
            name: names[i].clone(),
            partitions: mine[i].clone(),
            deliveries: outcome.acked,
            cpu_s: used(before.sidecars[i], after.sidecars[i]),
            hwm_kb: status_kb(sidecar.pid(), "VmHWM"),
        });
        group.lat_us.extend(outcome.lat_us);
    }
    if flushes > 0.0 {
        group.flush_mean_ms = Some(1000.0 * flush_s / flushes);
    }
    group.lat_us.sort_unstable();
    let handed = std::mem::take(&mut *handed.lock().unwrap_or_else(|p| p.into_inner()));
    verify(&admin, &ids, cluster, &handed).await?;
    let _ = admin.quit().await;
    drop(sidecars);
    Ok(group)
}

/// Takes `n` calls of `name` off `commands` (the whole entry when none is left); whether it
/// was there.
fn uncount(commands: &mut Vec<(String, u64)>, name: &str, n: u64) -> bool {
    let Some(at) = commands.iter().position(|(c, _)| c == name) else {
        return false;
    };
    commands[at].1 = commands[at].1.saturating_sub(n);
    if commands[at].1 == 0 {
        commands.remove(at);
    }
    true
}

/// Starts the run: every partition's group back to `0` (its entries new again) and its
/// held-back last entry appended, which wakes the replica blocked reading it. One pipeline.
async fn go(admin: &Client, held: &[Option<u64>]) -> Result<(), String> {
    let pipeline = admin.pipeline();
    for (p, last) in held.iter().enumerate() {
        let stream = stream(p as u32);
        let _: Result<Value, _> = pipeline.xgroup_setid(&stream, GROUP, "0").await;
        if let Some(id) = last {
            let args = workload::xadd_keyed_args(&stream, *id, KEYING);
            let _: Result<Value, _> = pipeline.custom(fred::cmd!("XADD"), args).await;
        }
    }
    for reply in pipeline.try_all::<Value>().await {
        reply.map_err(|e| format!("the start (XGROUP SETID, XADD): {e}"))?;
    }
    Ok(())
}

/// What a replica's sidecar says of it in its admin view (`/subscriptions`).
#[derive(Debug)]
struct View {
    reading: Vec<u32>,
    waiting: usize,
    leaving: usize,
    members: usize,
}

async fn view(sidecar: &SidecarProcess, name: &str) -> Result<View, String> {
    let (status, body) = try_http_get(sidecar.metrics, "/subscriptions").await?;
    if status != 200 {
        return Err(format!("/subscriptions answered {status}"));
    }
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("/subscriptions: {e}"))?;
    let member = json["partitioned"]
        .as_array()
        .and_then(|all| all.iter().find(|m| m["member"] == name))
        .ok_or_else(|| format!("{name} is not a member yet"))?;
    let len = |field: &str| member[field].as_array().map_or(0, Vec::len);
    let mut reading: Vec<u32> = member["reading"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|p| p.as_u64())
                .map(|p| p as u32)
                .collect()
        })
        .unwrap_or_default();
    reading.sort_unstable();
    Ok(View {
        reading,
        waiting: len("waiting"),
        leaving: len("leaving"),
        members: len("members"),
    })
}

/// Waits until every replica sees all the members and reads exactly its partitions, with no
/// hand-over under way (the first replica to open reads every partition until the others
/// join, then hands them their shares).
async fn settle(
    sidecars: &[SidecarProcess],
    names: &[String],
    mine: &[Vec<u32>],
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let mut unsettled = None;
        for (i, sidecar) in sidecars.iter().enumerate() {
            let name = &names[i];
            match view(sidecar, name).await {
                Ok(v)
                    if v.reading == mine[i]
                        && v.waiting == 0
                        && v.leaving == 0
                        && v.members == names.len() => {}
                Ok(v) => {
                    unsettled = Some(format!(
                        "{name} reads {:?} (its share {:?}), {} waiting, {} leaving, {} of {} \
                         members seen",
                        v.reading,
                        mine[i],
                        v.waiting,
                        v.leaving,
                        v.members,
                        names.len()
                    ));
                }
                Err(err) => unsettled = Some(err),
            }
        }
        let Some(why) = unsettled else {
            return Ok(());
        };
        if std::time::Instant::now() >= deadline {
            return Err(format!("the replicas did not settle in {SETTLE:?}: {why}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks a run: nothing pending on any partition, each partition's XLEN its entries, each
/// key's side effects exactly its ids in stream order, and the ids handed out across the
/// replicas (`handed`, in the order they arrived) each key's ids in stream order, each once.
async fn verify(
    admin: &Client,
    ids: &[Vec<u64>],
    tagged: bool,
    handed: &[u64],
) -> Result<(), String> {
    let partitions = ids.len() as u32;
    let entries: usize = ids.iter().map(Vec::len).sum();
    for (p, want) in ids.iter().enumerate() {
        let stream = stream(p as u32);
        let pending = workload::pending_on(admin, &stream).await?;
        let xlen = workload::xlen_on(admin, &stream).await?;
        if pending != 0 || xlen != want.len() as u64 {
            return Err(format!(
                "not verified: {stream}: XPENDING {pending} (want 0), XLEN {xlen} (want {})",
                want.len()
            ));
        }
    }
    let want = workload::keyed(0..entries as u64, KEYING);
    if tagged {
        workload::verify_lists(admin, &want, |key| {
            workload::tagged_order_list(key, partitions)
        })
        .await?;
    } else {
        workload::verify_lists(admin, &want, workload::order_list).await?;
    }
    if handed.len() != entries {
        return Err(format!(
            "not verified: {} deliveries handed out for {entries} entries",
            handed.len()
        ));
    }
    let got = workload::keyed(handed.iter().copied(), KEYING);
    for (key, want) in &want {
        let got = got.get(key).map_or(&[][..], Vec::as_slice);
        if got != want.as_slice() {
            return Err(format!(
                "not verified: key {key} was handed out {} times for {} entries across the \
                 replicas{}",
                got.len(),
                want.len(),
                workload::out_of_order(got, want)
            ));
        }
    }
    Ok(())
}
