//! Fault injection against the real binary: Redis killed and restarted, the sidecar SIGKILLed,
//! a client that vanishes without closing, a slow client, a stalled Redis, and SIGTERM under
//! load. Every test ends by counting entries and side effects in Redis: each entry `e<n>` (id
//! `<n+1>-0`) is handled with `SADD seen e<n>`, `INCR count` and `HINCRBY applied e<n> 1`, so
//! `SCARD seen` says nothing was lost, `count` how often side effects ran, and `applied` which
//! entry ran twice.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use fred::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use window_sidecar::proto::{self, Mode};
use window_sidecar_harness::{
    Next, OpenExt, RedisServer, STEP, SidecarProcess, Worker, connect, duration, free_port,
    ok_body, pending, resp, stream_open, value,
};

const KEY: &str = "orders";

fn listen_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

fn id_of(n: usize) -> String {
    format!("{}-0", n + 1)
}

fn value_of_id(id: &str) -> String {
    let n: usize = id
        .strip_suffix("-0")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not an id of ours: {id}"));
    format!("e{}", n - 1)
}

/// Appends entries `e<n>` for `ns` (ids `<n+1>-0`), with a `pad`-byte header, in pipelines of
/// 1000.
async fn produce(client: &Client, ns: std::ops::Range<usize>, pad: usize) {
    let padding = "x".repeat(pad);
    let ns: Vec<usize> = ns.collect();
    for chunk in ns.chunks(1000) {
        let pipeline = client.pipeline();
        for &n in chunk {
            let mut args = vec![KEY.to_owned(), id_of(n), "_payload".into(), format!("e{n}")];
            if pad > 0 {
                args.extend(["h:pad".to_owned(), padding.clone()]);
            }
            let _: Result<Value, _> = pipeline.custom(fred::cmd!("XADD"), args).await;
        }
        let replies: Vec<Value> = pipeline.all().await.expect("XADD");
        assert_eq!(replies.len(), chunk.len());
    }
}

/// `SCARD seen`, `GET count` and the group's pending count.
async fn state(inspect: &Client) -> (usize, usize, u64) {
    let seen: usize = inspect.scard("seen").await.unwrap();
    let count: Option<usize> = inspect.get("count").await.unwrap();
    (seen, count.unwrap_or(0), pending(inspect, KEY, "g").await)
}

/// Entries whose side effects ran more than once, with how often.
async fn applied_twice(inspect: &Client) -> Vec<(String, i64)> {
    let applied: HashMap<String, i64> = inspect.hgetall("applied").await.unwrap();
    let mut twice: Vec<_> = applied.into_iter().filter(|(_, n)| *n > 1).collect();
    twice.sort();
    twice
}

/// The ids pending in the group (on any consumer, or on `consumer`).
async fn pending_ids(inspect: &Client, consumer: Option<&str>) -> Vec<String> {
    let mut args = vec![
        KEY.to_owned(),
        "g".into(),
        "-".into(),
        "+".into(),
        "100000".into(),
    ];
    args.extend(consumer.map(str::to_owned));
    let rows: Vec<Value> = inspect
        .custom(fred::cmd!("XPENDING"), args)
        .await
        .expect("XPENDING");
    rows.into_iter()
        .filter_map(|row| match row {
            Value::Array(row) => row.into_iter().next()?.as_string(),
            _ => None,
        })
        .collect()
}

/// Answers reads whole until all `n` entries are in `seen` and nothing is pending.
async fn work_until_settled(worker: &mut Worker, inspect: &Client, n: usize, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (seen, count, pending) = state(inspect).await;
        if seen == n && pending == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled within {within:?}: seen {seen} of {n}, count {count}, pending {pending}"
        );
        worker.work_once(Duration::from_millis(300)).await;
    }
}

/// Each read a worker got (its first and last value) with its flush reports, for diagnosing
/// entries applied twice.
fn timeline(worker: &Worker) -> String {
    let mut ids: Vec<&u64> = worker.reads.keys().collect();
    ids.sort();
    ids.iter()
        .map(|id| {
            let values = &worker.reads[id];
            let reports: Vec<String> = worker
                .reports
                .iter()
                .filter(|r| r.read_id == **id)
                .map(|r| match r.ok {
                    true => "ok".to_owned(),
                    false => format!("failed ({}, unknown={})", r.error, r.outcome_unknown),
                })
                .collect();
            format!(
                "read {id}: {}..{} ({}) flush {reports:?}",
                values.first().map_or("", String::as_str),
                values.last().map_or("", String::as_str),
                values.len()
            )
        })
        .collect::<Vec<_>>()
        .join("\n  ")
}

fn print_report(what: &str, r: &proto::FlushReport) {
    println!(
        "{what}: read {} ok={} failed={} settle_failed={} outcome_unknown={} settles={} error={:?}",
        r.read_id, r.ok, r.failed, r.settle_failed, r.outcome_unknown, r.settles, r.error
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Redis killed and restarted in the middle of a stream run.

/// What a run with a Redis restart left behind.
struct RestartRun {
    count: usize,
    /// Entries whose side effects ran more than once, with how often.
    twice: Vec<(String, i64)>,
    /// Entries of flushes reported `outcome_unknown`: Redis may have applied them, or may still
    /// apply them later, so their side effects may legitimately run again.
    unknown: HashSet<String>,
}

/// A read handed out; Redis dies before the client settles it, so its flush fails, and says
/// the XACK did not take effect, or may not have. Returns the read and its flush report, with
/// Redis down.
async fn flush_while_redis_is_down(
    worker: &mut Worker,
    redis: &mut RedisServer,
) -> (proto::Read, proto::FlushReport) {
    let held = worker.next_read().await;
    redis.kill();
    worker.ack(&held.deliveries).await;
    let report = worker
        .report_for(held.read_id, STEP)
        .await
        .expect("the flush of the read settled while Redis was down is reported");
    print_report("flush while Redis was down", &report);
    assert!(!report.ok, "{report:?}");
    assert!(report.failed > 0, "{report:?}");
    assert!(
        report.settle_failed || report.outcome_unknown,
        "the XACK did not take effect, or may not have: {report:?}"
    );
    (held, report)
}

async fn redis_restart_mid_run(mode: Mode) -> RestartRun {
    const N: usize = 200;
    // Persisted on every write, so the stream, the group and its pending entries survive the
    // restart as Redis acknowledged them.
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = redis.url();
    let inspect = connect(&url).await;
    produce(&inspect, 0..N, 0).await;
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(
        &url,
        &listen,
        &["--redis-timeout", "1s", "--reclaim-interval", "500ms"],
    );
    // The default min_idle (60 s): entries come back through the re-read of the consumer's own
    // pending entries, not through a claim.
    let open = proto::Open {
        mode: mode as i32,
        ..stream_open(KEY, "g", "c1", 10).with_max_in_flight(20)
    };
    let mut worker = Worker::open(&listen, open).await;
    while worker.acked.len() < 50 {
        let read = worker.next_read().await;
        worker.ack(&read.deliveries).await;
    }

    let (held, report) = flush_while_redis_is_down(&mut worker, &mut redis).await;
    redis.restart();
    work_until_settled(&mut worker, &inspect, N, Duration::from_secs(60)).await;
    // Late flushes of the last reads.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, count, left) = state(&inspect).await;
    let twice = applied_twice(&inspect).await;
    let failed: Vec<_> = worker.reports.iter().filter(|r| !r.ok).collect();
    for r in &failed {
        print_report("failed flush", r);
    }
    let unknown: HashSet<String> = failed
        .iter()
        .filter(|r| r.outcome_unknown)
        .flat_map(|r| worker.reads[&r.read_id].iter().cloned())
        .collect();
    let held_values: Vec<String> = held.deliveries.iter().map(value).collect();
    let came_back = held_values
        .iter()
        .filter(|v| worker.delivered[*v].0 >= 2)
        .count();
    println!(
        "{mode:?}, Redis killed and restarted: {N} entries, {seen} seen, {count} side effects, \
         {} entries applied twice {twice:?}, {} failed flushes, {} duplicate deliveries, \
         {came_back} of the {} entries of the flush sent while Redis was down came back, \
         pending {left}",
        twice.len(),
        failed.len(),
        worker.duplicate_deliveries(),
        held_values.len()
    );
    if !twice.is_empty() {
        println!("{mode:?} reads:\n  {}", timeline(&worker));
    }
    assert_eq!(seen, N, "no entry is lost");
    assert_eq!(left, 0, "every entry ends settled");
    assert_eq!(
        worker
            .reports
            .iter()
            .filter(|r| r.read_id == held.read_id)
            .count(),
        1,
        "the failed flush is reported once"
    );
    if report.settle_failed && !report.outcome_unknown {
        // Not sent at all: every entry it should have settled comes back.
        assert_eq!(
            came_back,
            held_values.len(),
            "the unsent flush's entries come back"
        );
    }
    drop(sidecar);
    RestartRun {
        count,
        twice,
        unknown,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_run_reports_the_failed_flush_once_and_loses_no_entry() {
    let run = redis_restart_mid_run(Mode::Pipeline).await;
    let unexplained: Vec<_> = run
        .twice
        .iter()
        .filter(|(value, _)| !run.unknown.contains(value))
        .collect();
    println!("pipeline: applied twice though not in a flush reported unknown: {unexplained:?}");
    // "A side effect of an acked entry runs again only if its flush failed before the XACK
    // took effect" (docs/design.md, Streams in depth): only entries of failed flushes whose
    // outcome is unknown.
    assert!(unexplained.is_empty(), "{unexplained:?}");
    // Pipeline mode is at least once: a flush cut between its side effects and its XACK runs
    // them again.
    assert!(run.count >= 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_atomic_mode_a_redis_restart_runs_no_acked_side_effect_twice() {
    let run = redis_restart_mid_run(Mode::Atomic).await;
    // A transaction carries its entry's XACK, and a flush whose outcome was unknown is not read
    // again until nothing of it can still run (fred may write it after reconnecting): every
    // entry's side effects ran once, including those of flushes reported `outcome_unknown`.
    println!(
        "atomic: {} side effects for 200 entries; applied twice: {:?}; entries of flushes reported \
         outcome_unknown: {}",
        run.count,
        run.twice,
        run.unknown.len()
    );
    assert!(
        run.twice.is_empty(),
        "side effects of acked entries ran twice in atomic mode: {:?}",
        run.twice
    );
    assert_eq!(run.count, 200);
}

/// Hands each read's acks over only once the next read is there (a client slower than Redis),
/// so each flush goes with the next read at its end; hands over what it holds when idle.
async fn work_holding_one_read(worker: &mut Worker, held: &mut Vec<proto::Read>) {
    match worker.next(Duration::from_millis(300)).await {
        Next::Read(read) => {
            held.push(read);
            while held.len() >= 2 {
                let read = held.remove(0);
                worker.ack(&read.deliveries).await;
            }
        }
        // Nothing more is coming: answer what is held.
        Next::Idle => {
            for read in std::mem::take(held) {
                worker.ack(&read.deliveries).await;
            }
        }
        other => panic!("the subscription ended: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_atomic_mode_a_redis_restart_while_reads_ride_on_flushes_runs_every_side_effect_once() {
    const N: usize = 300;
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = redis.url();
    let inspect = connect(&url).await;
    produce(&inspect, 0..N, 0).await;
    let (listen, metrics) = (listen_addr(), listen_addr());
    let sidecar = SidecarProcess::serve(
        &url,
        &listen,
        &[
            "--redis-timeout",
            "1s",
            "--reclaim-interval",
            "500ms",
            "--metrics-listen",
            &metrics,
        ],
    );
    let open = proto::Open {
        mode: Mode::Atomic as i32,
        ..stream_open(KEY, "g", "c1", 10).with_max_in_flight(20)
    };
    let mut worker = Worker::open(&listen, open).await;
    let mut held = Vec::new();
    while worker.acked.len() < 100 {
        work_holding_one_read(&mut worker, &mut held).await;
    }
    let text = ok_body(&metrics, "/metrics").await;
    let read_aheads = |text: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix("window_sidecar_read_aheads_total{form=\"stream\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let before = read_aheads(&text);
    assert!(before >= 5.0, "reads ride on flushes by now: {before}");

    // Redis dies with two reads at the client: their flushes, and the reads riding on them,
    // fail; entries such a read may have claimed come back through the pending entries.
    redis.kill();
    for read in held.drain(..) {
        worker.ack(&read.deliveries).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.restart();

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (seen, count, pending) = state(&inspect).await;
        if seen == N && pending == 0 && held.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: seen {seen} of {N}, count {count}, pending {pending}"
        );
        work_holding_one_read(&mut worker, &mut held).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, count, left) = state(&inspect).await;
    let twice = applied_twice(&inspect).await;
    let failed = worker.reports.iter().filter(|r| !r.ok).count();
    let after = read_aheads(&ok_body(&metrics, "/metrics").await);
    println!(
        "atomic, reads riding on flushes, Redis killed and restarted: {N} entries, {seen} seen, \
         {count} side effects, applied twice {twice:?}, {failed} failed flushes, \
         {} duplicate deliveries, read-aheads {before} before the kill and {after} in all",
        worker.duplicate_deliveries()
    );
    if !twice.is_empty() {
        println!("reads:\n  {}", timeline(&worker));
    }
    assert_eq!(seen, N, "no entry is lost");
    assert_eq!(left, 0, "every entry ends settled");
    assert!(failed > 0, "a flush failed while Redis was down");
    assert!(twice.is_empty(), "side effects ran twice: {twice:?}");
    assert_eq!(count, N, "every acked side effect ran exactly once");

    // Once every flush of unknown outcome can no longer run (fred reconnects each pool
    // connection within its 2 s backoff) and the pending entries were read again, reads ride on
    // flushes again.
    produce(&inspect, N..2 * N, 0).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&inspect).await.0 < 2 * N || !held.is_empty() {
        assert!(Instant::now() < deadline, "the second batch is not settled");
        work_holding_one_read(&mut worker, &mut held).await;
    }
    let again = read_aheads(&ok_body(&metrics, "/metrics").await);
    println!("read-aheads after the second batch: {again}");
    assert!(
        again > after,
        "reads ride on flushes again after the restart"
    );
    assert_eq!(state(&inspect).await.1, 2 * N, "each side effect once");
    drop(sidecar);
}

/// The test's own `XAUTOCLAIM … <min_idle> 0-0` as consumer `c2`: the ids it took.
async fn claim_as_c2(inspect: &Client, min_idle: Duration) -> Vec<String> {
    let args = vec![
        KEY.to_owned(),
        "g".into(),
        "c2".into(),
        min_idle.as_millis().to_string(),
        "0-0".into(),
        "JUSTID".into(),
    ];
    let reply: Value = inspect
        .custom(fred::cmd!("XAUTOCLAIM"), args)
        .await
        .expect("XAUTOCLAIM");
    match reply {
        Value::Array(parts) => match parts.into_iter().nth(1) {
            Some(Value::Array(ids)) => ids.into_iter().filter_map(|v| v.as_string()).collect(),
            _ => Vec::new(),
        },
        other => panic!("XAUTOCLAIM replied {other:?}"),
    }
}

/// Redis keeps a re-read of a consumer's own pending entries (`XREADGROUP … 0`) in memory only:
/// restarted from its AOF, it would show an entry just delivered again as idle since its first
/// read, and another consumer's reclaim would take it while its handler runs, in atomic mode
/// running its side effects twice. The sidecar claims such entries again to itself, which
/// Redis persists: the entry stays this consumer's, its side effects run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_delivered_again_from_pending_stays_this_consumers_across_a_redis_restart() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = redis.url();
    let inspect = connect(&url).await;
    produce(&inspect, 0..1, 0).await;
    let _: Value = inspect
        .custom(fred::cmd!("XGROUP"), vec!["CREATE", KEY, "g", "0"])
        .await
        .expect("XGROUP CREATE");
    // Read by `c1` before, by a sidecar that died holding it.
    let _: Value = inspect
        .custom(
            fred::cmd!("XREADGROUP"),
            vec!["GROUP", "g", "c1", "COUNT", "1", "STREAMS", KEY, ">"],
        )
        .await
        .expect("XREADGROUP");
    tokio::time::sleep(Duration::from_secs(4)).await;

    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&url, &listen, &["--redis-timeout", "1s"]);
    // The default min_idle (60 s): c1 gets its entry back through the re-read of its own
    // pending entries, not through a claim of its own.
    let open = proto::Open {
        mode: Mode::Atomic as i32,
        ..stream_open(KEY, "g", "c1", 10)
    };
    let mut worker = Worker::open(&listen, open).await;
    let read = worker.next_read().await;
    assert_eq!(read.deliveries.len(), 1);
    assert_eq!(read.deliveries[0].delivery_count, 2, "{read:?}");
    let delivered = Instant::now();

    redis.restart();
    let inspect = connect(&url).await;
    // Idle since it was delivered again, it is not claimed with a min_idle a second above
    // that; idle since its first read (4 s more), it would be.
    let min_idle = delivered.elapsed() + Duration::from_secs(1);
    let claimed = claim_as_c2(&inspect, min_idle).await;
    assert!(
        claimed.is_empty(),
        "another consumer's reclaim took {claimed:?} with min_idle {min_idle:?}, delivered \
         again to c1 a second less ago, 4 s after its first read"
    );
    let rows: Vec<Value> = inspect
        .custom(fred::cmd!("XPENDING"), vec![KEY, "g", "-", "+", "10"])
        .await
        .expect("XPENDING");
    let Some(Value::Array(row)) = rows.into_iter().next() else {
        panic!("the entry is no longer pending")
    };
    assert_eq!(row[1].as_string().as_deref(), Some("c1"), "{row:?}");
    assert_eq!(row[3].as_u64(), Some(2), "the count survives too: {row:?}");

    worker.ack(&read.deliveries).await;
    let report = worker
        .report_for(read.read_id, STEP)
        .await
        .expect("the ack is flushed");
    assert!(report.ok, "{report:?}");
    let (seen, count, left) = state(&inspect).await;
    assert_eq!((seen, count, left), (1, 1, 0), "handled once, settled");
    drop(sidecar);
}

// ---------------------------------------------------------------------------------------------
// 2. The sidecar SIGKILLed mid-window.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_mid_window_and_restarted_settles_every_entry() {
    const N: usize = 100;
    const COUNT: u32 = 10;
    const MAX_IN_FLIGHT: u32 = 20;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..N, 0).await;
    let listen = listen_addr();
    let flags = ["--reclaim-interval", "200ms"];
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &flags);
    let open = || stream_open(KEY, "g", "c1", COUNT).with_max_in_flight(MAX_IN_FLIGHT);
    let mut worker = Worker::open(&listen, open()).await;
    // One read settled, the next half settled: SIGKILL before its flush.
    worker.work(2, Some(2)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    sidecar.kill9();
    let in_flight = pending(&inspect, KEY, "g").await;

    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &flags);
    let mut worker = Worker::open(&listen, open()).await;
    work_until_settled(&mut worker, &inspect, N, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, count, left) = state(&inspect).await;
    // Deliveries of entries the killed sidecar had handed out (the group's counter says so).
    let redelivered = worker.delivered.values().filter(|(_, c)| *c > 1).count();
    println!(
        "stream after SIGKILL: {N} entries, pending at the kill {in_flight}, \
         {redelivered} delivered again (count {COUNT}, max_in_flight {MAX_IN_FLIGHT}), \
         {count} side effects ({} twice)",
        count - N
    );
    assert_eq!((seen, left), (N, 0));
    assert!(count >= N);
    assert!(
        redelivered as u64 <= in_flight,
        "only what was in flight comes again"
    );
    // What may be pending: the in-flight limit, plus one read's worth of settled deliveries
    // waiting for their flush (they do not count against the limit, so the next read overlaps
    // the flush: see `Engine::room` in server/core/src/engine/flow.rs).
    assert!(
        redelivered <= (MAX_IN_FLIGHT + COUNT) as usize,
        "duplicate deliveries are bounded by the in-flight limit and one read: {redelivered}"
    );
    drop(sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_claims_a_killed_replicas_pending_entries_after_min_idle() {
    const N: usize = 60;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..N, 0).await;
    let (a, b) = (listen_addr(), listen_addr());
    let replica = |addr: &str, name: &str| {
        SidecarProcess::serve(
            &redis.url(),
            addr,
            &["--reclaim-interval", "200ms", "--consumer-name", name],
        )
    };
    let (replica_a, replica_b) = (replica(&a, "pod-a"), replica(&b, "pod-b"));
    // The consumer name comes from each replica's --consumer-name.
    let open = || {
        stream_open(KEY, "g", "", 10)
            .with_max_in_flight(20)
            .with_min_idle(Some(Duration::from_secs(1)))
    };
    let mut worker_a = Worker::open(&a, open()).await;
    worker_a.work(2, Some(2)).await;
    assert_eq!(worker_a.opened.as_ref().unwrap().consumer, "pod-a");
    tokio::time::sleep(Duration::from_millis(300)).await;
    replica_a.kill9();
    let stranded = pending_ids(&inspect, Some("pod-a")).await;
    assert!(
        stranded.len() >= 5,
        "the killed replica left entries pending: {stranded:?}"
    );

    let mut worker_b = Worker::open(&b, open()).await;
    work_until_settled(&mut worker_b, &inspect, N, Duration::from_secs(30)).await;
    assert_eq!(worker_b.opened.as_ref().unwrap().consumer, "pod-b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, count, left) = state(&inspect).await;
    let claimed: Vec<&String> = stranded
        .iter()
        .filter(|id| {
            worker_b
                .delivered
                .get(&value_of_id(id))
                .is_some_and(|(_, c)| *c >= 2)
        })
        .collect();
    println!(
        "second replica: {N} entries, {} stranded on pod-a, {} of them claimed by pod-b, \
         {count} side effects ({} twice)",
        stranded.len(),
        claimed.len(),
        count - N
    );
    assert_eq!((seen, left), (N, 0));
    assert_eq!(
        claimed.len(),
        stranded.len(),
        "every entry stranded on the killed replica is claimed and delivered again"
    );
    assert!(pending_ids(&inspect, Some("pod-a")).await.is_empty());
    drop(replica_b);
}

// ---------------------------------------------------------------------------------------------
// 3. A client that vanishes without closing its stream.

/// A TCP proxy that can turn into a black hole: it stops forwarding in both directions but
/// keeps every socket open (no FIN, no RST), as a cut network does.
struct Proxy {
    addr: String,
    hole: CancellationToken,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hole = CancellationToken::new();
        let cut = hole.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(&target).await else {
                    continue;
                };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(pipe(in_read, out_write, cut.clone()));
                tokio::spawn(pipe(out_read, in_write, cut.clone()));
            }
        });
        Self { addr, hole }
    }

    fn black_hole(&self) {
        self.hole.cancel();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hole: CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            () = hole.cancelled() => break,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        if hole.is_cancelled() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // The black hole: hold both sockets open, forward nothing, until the test ends.
    std::future::pending::<()>().await;
    drop((from, to));
}

/// A client that vanished mid-window without closing: it acked half of a read, but the
/// network went silent (a black hole) before its outcomes arrived; another client of the same
/// group then worked until every entry was settled. The black hole and both clients are held
/// until the run is dropped.
struct Vanished {
    _redis: RedisServer,
    sidecar: SidecarProcess,
    _proxy: Proxy,
    _vanishing: Worker,
    /// The client that settled everything; its subscription stays open.
    _other: Worker,
    listen: String,
    metrics: String,
    min_idle: Option<Duration>,
    /// The read the vanished client held when the network went silent.
    cut_off: proto::Read,
    /// The cut-off deliveries the other client got again.
    came_back: usize,
    /// Entries seen, side effects that ran, entries left pending.
    seen: usize,
    count: usize,
    left: u64,
}

const VANISHED_ENTRIES: usize = 30;

impl Vanished {
    async fn run() -> Vanished {
        const N: usize = VANISHED_ENTRIES;
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        produce(&inspect, 0..N, 0).await;
        let (listen, metrics) = (listen_addr(), listen_addr());
        let sidecar = SidecarProcess::serve(
            &redis.url(),
            &listen,
            &[
                "--reclaim-interval",
                "200ms",
                "--metrics-listen",
                &metrics,
                "--client-keepalive",
                "1s",
            ],
        );
        let proxy = Proxy::start(listen.clone()).await;
        let min_idle = Some(Duration::from_secs(1));

        let mut vanishing = Worker::open(
            &proxy.addr,
            stream_open(KEY, "g", "c-a", 10)
                .with_max_in_flight(10)
                .with_min_idle(min_idle),
        )
        .await;
        let first = vanishing.next_read().await;
        vanishing.ack(&first.deliveries).await;
        let report = vanishing.report_for(first.read_id, STEP).await.unwrap();
        assert!(report.ok, "{report:?}");
        // Mid-window: a read handed out, then the network goes silent. Its outcomes go nowhere.
        let cut_off = vanishing.next_read().await;
        proxy.black_hole();
        let half = cut_off.deliveries.len() / 2;
        vanishing.ack(&cut_off.deliveries[..half]).await;

        let mut other = Worker::open(
            &listen,
            stream_open(KEY, "g", "c-b", 10)
                .with_max_in_flight(10)
                .with_min_idle(min_idle),
        )
        .await;
        work_until_settled(&mut other, &inspect, N, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (seen, count, left) = state(&inspect).await;
        let came_back = cut_off
            .deliveries
            .iter()
            .filter(|d| other.delivered.get(&value(d)).is_some_and(|(_, c)| *c >= 2))
            .count();
        println!(
            "vanished client: {} deliveries cut off, {came_back} came back to the other client, \
             {seen} of {N} seen, {count} side effects",
            cut_off.deliveries.len()
        );
        Vanished {
            _redis: redis,
            sidecar,
            _proxy: proxy,
            _vanishing: vanishing,
            _other: other,
            listen,
            metrics,
            min_idle,
            cut_off,
            came_back,
            seen,
            count,
            left,
        }
    }
}

/// The deliveries a vanished client held come back to another client, and the outcomes that
/// never arrived ran nothing: each side effect ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_of_a_client_that_vanished_without_closing_come_back_to_another_client() {
    let run = Vanished::run().await;
    assert_eq!((run.seen, run.left), (VANISHED_ENTRIES, 0));
    assert_eq!(run.came_back, run.cut_off.deliveries.len());
    assert_eq!(
        run.count, VANISHED_ENTRIES,
        "the cut-off outcomes never arrived: each side effect ran once"
    );
    drop(run.sidecar);
}

/// The keepalive PING to a vanished client goes unanswered: the sidecar closes its
/// subscription and frees its consumer name (only the other client's stays open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_of_a_client_that_vanished_is_closed_and_its_name_freed() {
    let run = Vanished::run().await;
    let mut still_open = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let view: serde_json::Value =
            serde_json::from_str(&ok_body(&run.metrics, "/subscriptions").await).unwrap();
        still_open = view["subscriptions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["consumer"].as_str().unwrap_or_default().to_owned())
            .collect();
        if !still_open.iter().any(|c| c == "c-a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("vanished client: subscriptions still open: {still_open:?}");
    assert_eq!(
        still_open,
        vec!["c-b".to_string()],
        "the vanished client's subscription was not closed"
    );
    // Its consumer name is free again.
    let mut again = Worker::open(
        &run.listen,
        stream_open(KEY, "g", "c-a", 10)
            .with_max_in_flight(10)
            .with_min_idle(run.min_idle),
    )
    .await;
    let next = again.next(Duration::from_secs(2)).await;
    assert!(
        matches!(next, Next::Idle) && again.opened.is_some(),
        "reopening as the vanished consumer: {next:?}"
    );
    again.close();
    drop(run.sidecar);
}

// ---------------------------------------------------------------------------------------------
// 4. A slow client.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_keeps_the_backlog_in_redis_and_the_sidecar_memory_bounded() {
    const N: usize = 100_000;
    const COUNT: u32 = 10;
    const MAX_IN_FLIGHT: u32 = 20;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let listen = listen_addr();
    let metrics = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--metrics-listen", &metrics]);
    let mut worker = Worker::open(
        &listen,
        stream_open(KEY, "g", "c1", COUNT).with_max_in_flight(MAX_IN_FLIGHT),
    )
    .await;
    produce(&inspect, 0..1, 1000).await;
    let read = worker.next_read().await;
    worker.ack(&read.deliveries).await;
    let baseline = sidecar.rss_kib();

    let producer = {
        let client = redis.client().await;
        tokio::spawn(async move { produce(&client, 1..N, 1000).await })
    };
    let (mut peak, mut max_pending, mut max_outstanding, mut reads) = (baseline, 0, 0, 0);
    while !producer.is_finished() || reads < 40 {
        let read = worker.next_read().await;
        // A slow handler.
        tokio::time::sleep(Duration::from_millis(50)).await;
        worker.ack(&read.deliveries).await;
        reads += 1;
        peak = peak.max(sidecar.rss_kib());
        if reads % 5 == 0 {
            max_pending = max_pending.max(pending(&inspect, KEY, "g").await);
            let view: serde_json::Value =
                serde_json::from_str(&ok_body(&metrics, "/subscriptions").await).unwrap();
            let outstanding = view["subscriptions"][0]["outstanding_deliveries"]
                .as_u64()
                .expect("the subscription's view");
            max_outstanding = max_outstanding.max(outstanding);
        }
    }
    producer.await.unwrap();
    let xlen: usize = inspect.xlen(KEY).await.unwrap();
    let consumed = worker.acked.len();
    worker.close();
    // Reads already on their way when the client closed are abandoned: they stay pending.
    let mut abandoned = 0;
    loop {
        match worker.next(STEP).await {
            Next::Read(read) => abandoned += read.deliveries.len(),
            Next::Ended(None) => break,
            other => panic!("the stream did not end cleanly: {other:?}"),
        }
    }
    let (seen, count, left) = state(&inspect).await;
    println!(
        "slow client: {xlen} entries of 1 KB produced, {consumed} consumed in {reads} reads, \
         max pending {max_pending}, max outstanding {max_outstanding} (count {COUNT}, \
         max_in_flight {MAX_IN_FLIGHT}); sidecar RSS {baseline} KiB before, {peak} KiB at peak, \
         {} KiB after; {left} pending after the close ({abandoned} abandoned on the way)",
        sidecar.rss_kib()
    );
    assert_eq!(xlen, N);
    assert!(
        consumed < N / 2,
        "the backlog stays in Redis: {consumed} consumed"
    );
    assert!(max_outstanding <= u64::from(MAX_IN_FLIGHT));
    // Deliveries waiting for their flush count against the limit beyond one read's worth.
    assert!(
        max_pending <= u64::from(MAX_IN_FLIGHT + COUNT),
        "pending {max_pending}"
    );
    assert!(
        peak < baseline + 48 * 1024,
        "the sidecar's memory grew from {baseline} KiB to {peak} KiB"
    );
    assert_eq!((seen, count), (consumed, consumed));
    assert!(left as usize <= abandoned + COUNT as usize);
    drop(sidecar);
}

// ---------------------------------------------------------------------------------------------
// 5. A stalled Redis.

#[derive(Debug, Clone, Copy)]
enum Stall {
    ClientPause,
    DebugSleep,
}

/// Whether Redis on `port` leaves a PING unanswered for 800 ms: longer than a loaded machine
/// delays one, so a yes means the stall has begun (the flush sent next lands inside it).
fn stalled(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    conn.set_read_timeout(Some(Duration::from_millis(800)))
        .unwrap();
    let _ = conn.write_all(b"PING\r\n");
    let mut buf = [0u8; 16];
    conn.read(&mut buf).is_err()
}

async fn stall_mid_run(stall: Stall) {
    const N: usize = 60;
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let port = redis.port();
    let inspect = redis.client().await;
    produce(&inspect, 0..N, 0).await;
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--redis-timeout", "1s"]);
    let mut worker = Worker::open(
        &listen,
        stream_open(KEY, "g", "c1", 10).with_max_in_flight(20),
    )
    .await;
    for _ in 0..2 {
        let read = worker.next_read().await;
        worker.ack(&read.deliveries).await;
    }

    let held = worker.next_read().await;
    let staller = std::thread::spawn(move || match stall {
        // Long enough that the flush sent after the stall was seen (at most 1.3 s into it)
        // still meets it for longer than --redis-timeout.
        Stall::ClientPause => resp::call(port, &["CLIENT", "PAUSE", "5000", "ALL"]),
        Stall::DebugSleep => resp::call(port, &["DEBUG", "SLEEP", "5"]),
    });
    let began = tokio::task::spawn_blocking(move || {
        for _ in 0..10 {
            if stalled(port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })
    .await
    .unwrap();
    assert!(began, "Redis did not stall");
    worker.ack(&held.deliveries).await;
    let report = worker
        .report_for(held.read_id, STEP)
        .await
        .expect("the flush sent into the stall is reported");
    print_report(&format!("{stall:?}"), &report);
    assert!(!report.ok, "{report:?}");
    assert!(
        report.outcome_unknown,
        "a timeout leaves the outcome unknown: {report:?}"
    );
    let logged = sidecar.wait_for("flush failed");
    println!("{stall:?}: the sidecar logged: {logged}");
    let reply = tokio::task::spawn_blocking(move || staller.join().unwrap())
        .await
        .unwrap();
    assert!(reply.is_ok(), "{stall:?}: {reply:?}");

    // Recovery: later reads and flushes work without any help.
    work_until_settled(&mut worker, &inspect, N, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after: Vec<_> = worker
        .reports
        .iter()
        .skip_while(|r| r.read_id != held.read_id)
        .skip(1)
        .collect();
    let (seen, count, left) = state(&inspect).await;
    let health: Vec<String> = sidecar
        .logged_lines()
        .into_iter()
        .filter(|l| {
            l.contains("NOT_SERVING") || l.contains("SERVING") || l.contains("flush failed")
        })
        .collect();
    println!(
        "{stall:?}: {N} entries, {seen} seen, {count} side effects ({} run again after the \
         unknown outcome), {} flushes after the stall ({} failed); log: {health:#?}",
        count - N,
        after.len(),
        after.iter().filter(|r| !r.ok).count()
    );
    assert!(
        after.iter().any(|r| r.ok),
        "flushes work again after the stall"
    );
    assert_eq!((seen, left), (N, 0));
    assert!(count >= N);
    drop(sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_pause_times_the_flush_out_and_the_sidecar_recovers_by_itself() {
    stall_mid_run(Stall::ClientPause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_sleep_times_the_flush_out_and_the_sidecar_recovers_by_itself() {
    stall_mid_run(Stall::DebugSleep).await;
}

// ---------------------------------------------------------------------------------------------
// 6. Graceful shutdown under load.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_flushes_every_acked_entry_and_leaves_the_unacked_pending() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..50, 0).await;
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--shutdown-grace", "3s"]);
    let mut worker = Worker::open(
        &listen,
        stream_open(KEY, "g", "c1", 10).with_max_in_flight(20),
    )
    .await;

    let stop = CancellationToken::new();
    let producer = {
        let client = redis.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut next = 50;
            while !stop.is_cancelled() {
                produce(&client, next..next + 10, 0).await;
                next += 10;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            next
        })
    };
    let mut last_acked = 0;
    while worker.acked.len() < 200 {
        let read = worker.next_read().await;
        worker.ack(&read.deliveries).await;
        last_acked = read.read_id;
    }
    // A read handed out and not settled when SIGTERM comes.
    let mut held = worker.next_read().await.deliveries;
    // The acks sent last have reached the sidecar (their read is flushed), so what it counts as
    // outstanding is what the client holds.
    worker
        .report_for(last_acked, STEP)
        .await
        .expect("the last acked read is flushed");
    sidecar.signal("TERM");
    let draining = loop {
        match worker.next(STEP).await {
            // Handed out before the drain began.
            Next::Read(read) => held.extend(read.deliveries),
            Next::Draining(draining) => break draining,
            other => panic!("expected the draining notice, got {other:?}"),
        }
    };
    assert_eq!(draining.outstanding as usize, held.len());
    // The client settles half of what it holds within the grace; the rest stays unsettled.
    let (settled, unsettled) = held.split_at(held.len() / 2);
    worker.ack(settled).await;
    // No read comes after the notice; flush reports are recorded on the way.
    let status = match worker.next(STEP).await {
        Next::Ended(Some(status)) => status,
        other => panic!("expected the stream to end with a status, got {other:?}"),
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let closed = sidecar.wait_for("subscription closed");
    let exit = sidecar.wait();
    stop.cancel();
    let produced = producer.await.unwrap();

    let acked: HashSet<String> = worker.acked.iter().cloned().collect();
    let seen: HashSet<String> = inspect.smembers("seen").await.unwrap();
    let count: usize = inspect.get("count").await.unwrap();
    let pending: HashSet<String> = pending_ids(&inspect, None)
        .await
        .iter()
        .map(|id| value_of_id(id))
        .collect();
    let failed = worker.reports.iter().filter(|r| !r.ok).count();
    println!(
        "SIGTERM under load: {produced} produced, {} acked ({} within the grace), {} left \
         unsettled, {} pending after the exit, {count} side effects, {failed} failed flushes; \
         {closed}",
        acked.len(),
        settled.len(),
        unsettled.len(),
        pending.len()
    );
    assert!(exit.success(), "{exit:?}");
    assert_eq!(failed, 0);
    assert_eq!(seen, acked, "every acked entry's side effects were flushed");
    assert_eq!(count, acked.len(), "each once");
    assert!(
        pending.is_disjoint(&acked),
        "acked entries were XACKed: {:?}",
        pending.intersection(&acked).collect::<Vec<_>>()
    );
    for d in unsettled {
        let value = value(d);
        assert!(pending.contains(&value), "{value} is still pending");
    }
}

// ---------------------------------------------------------------------------------------------
// Found while writing the tests above: an entry the client acked, whose flush waits for the rest
// of its read, is handed out again.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_acked_while_its_read_is_still_open_is_not_delivered_and_applied_again() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..2, 0).await;
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--reclaim-interval", "100ms"]);
    let min_idle = Duration::from_millis(300);
    let open = proto::Open {
        mode: Mode::Atomic as i32,
        ..stream_open(KEY, "g", "c1", 2)
            .with_max_in_flight(4)
            .with_min_idle(Some(min_idle))
    };
    let mut worker = Worker::open(&listen, open).await;
    let read = worker.next_read().await;
    assert_eq!(read.deliveries.len(), 2);
    // e0 is acked at once; e1 takes its time (longer than min_idle: it may be claimed and
    // handled twice, as docs/design.md warns for `min_idle`). e0's flush waits for e1.
    worker.ack(&read.deliveries[..1]).await;
    let deadline = tokio::time::Instant::now() + 5 * min_idle;
    while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        // Whatever comes meanwhile is handled as a client would.
        if let Next::Read(again) = worker.next(left).await {
            worker.ack(&again.deliveries).await;
        }
    }
    worker.ack(&read.deliveries[1..]).await;
    worker.report_for(read.read_id, STEP).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let applied: HashMap<String, i64> = inspect.hgetall("applied").await.unwrap();
    let (seen, count, left) = state(&inspect).await;
    println!(
        "acked, then claimed while its read was open: e0 delivered {:?} times (times, highest \
         delivery count), applied {:?}; e1 delivered {:?}; {seen} seen, {count} side effects, \
         {left} pending",
        worker.delivered["e0"],
        applied.get("e0"),
        worker.delivered["e1"]
    );
    assert_eq!((seen, left), (2, 0));
    assert_eq!(
        worker.delivered["e0"].0, 1,
        "e0 was acked by this very subscription and is only waiting for its flush: handing it out \
         again makes its side effects run twice"
    );
    assert_eq!(applied["e0"], 1, "an acked entry's side effects ran twice");
    drop(sidecar);
}

// ---------------------------------------------------------------------------------------------
// Found while writing the tests above: acked deliveries whose read is not complete do not count
// against the in-flight limit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_list_crash_loses_no_more_than_the_in_flight_limit_when_reads_are_half_settled() {
    const N: usize = 100;
    const COUNT: u32 = 10;
    const MAX_IN_FLIGHT: u32 = 10;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    for n in 0..N {
        let _: i64 = inspect.lpush("tasks", format!("v{n}")).await.unwrap();
    }
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &[]);
    let open = proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: "tasks".into(),
        })),
        count: COUNT,
        max_in_flight: MAX_IN_FLIGHT,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    };
    let mut worker = Worker::open(&listen, open).await;
    // A client that handles deliveries concurrently, with one slow delivery in every read: it
    // acks all but the last of each read at once.
    let mut handed_out = 0;
    while let Next::Read(read) = worker.next(Duration::from_secs(1)).await {
        handed_out += read.deliveries.len();
        let (done, _slow) = read.deliveries.split_at(read.deliveries.len() - 1);
        worker.ack(done).await;
    }
    sidecar.kill9();
    let left: usize = inspect.llen("tasks").await.unwrap();
    let applied: usize = inspect.scard("seen").await.unwrap();
    let lost = N - left - applied;
    println!(
        "simple list, half-settled reads, SIGKILL: {handed_out} handed out, {} acked, {applied} \
         applied, {left} left in the list: {lost} lost (count {COUNT}, max_in_flight \
         {MAX_IN_FLIGHT})",
        worker.acked.len()
    );
    assert!(
        lost <= (MAX_IN_FLIGHT + COUNT) as usize,
        "a crash lost {lost} entries: more than the in-flight limit (plus one read) allows"
    );
}
