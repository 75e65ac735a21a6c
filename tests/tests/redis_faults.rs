//! Redis failing under the real binary mid-run. Killed and restarted from its AOF: in pipeline
//! mode each failed flush is reported once and no entry is lost; in atomic mode no acked side
//! effect runs twice, also while reads ride on flushes, and an entry just delivered again from
//! pending stays its consumer's. Stalled past `--redis-timeout` (`CLIENT PAUSE`, `DEBUG
//! SLEEP`): the flush times out with its outcome unknown and the sidecar recovers by itself; a
//! call whose own deadline passes meanwhile ends `DEADLINE_EXCEEDED`.
//! Each test ends by counting entries and side effects in Redis
//! (`window_sidecar_harness::faults`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar::proto::{self, Mode};
use window_sidecar_harness::faults::{KEY, produce, state, work_until_settled};
use window_sidecar_harness::{
    Next, OpenExt, RedisServer, STEP, SidecarProcess, Worker, connect, listen_addr, ok_body, resp,
    stream_open, value,
};

/// Entries whose side effects ran more than once, with how often.
async fn applied_twice(inspect: &Client) -> Vec<(String, i64)> {
    let applied: HashMap<String, i64> = inspect.hgetall("applied").await.unwrap();
    let mut twice: Vec<_> = applied.into_iter().filter(|(_, n)| *n > 1).collect();
    twice.sort();
    twice
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
// Redis killed and restarted in the middle of a stream run.

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
// A stalled Redis.

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

/// A call whose deadline (`grpc-timeout`) passes while the sidecar waits for a stalled Redis
/// ends `DEADLINE_EXCEEDED`, the status every gRPC library reports as its timeout; never
/// tonic's own `CANCELLED` ("Timeout expired"), which a client whose deadline passes at the
/// same moment would report instead, by whichever answer came first. The tonic client sends
/// the deadline and enforces none of its own, so what it gets is the sidecar's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_past_its_deadline_ends_deadline_exceeded() {
    let redis = RedisServer::start();
    let sidecar =
        window_sidecar_harness::Sidecar::start(&redis.url(), &["--redis-timeout", "10s"]).await;
    let mut client = window_sidecar_harness::connect_client(&sidecar.addr.to_string()).await;
    // The first publish opens the connections; the stall is for the ones after it.
    window_sidecar_harness::publish(&mut client, KEY, window_sidecar_harness::numbered(1)).await;
    resp::call(redis.port(), &["CLIENT", "PAUSE", "4000", "WRITE"]).expect("CLIENT PAUSE");
    for deadline in [200, 300, 500] {
        let mut request = tonic::Request::new(proto::PublishRequest {
            stream: KEY.into(),
            entries: vec![proto::PublishEntry {
                fields: vec![proto::Field {
                    name: "n".into(),
                    value: "1".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
        request.set_timeout(Duration::from_millis(deadline));
        let status = client
            .publish(request)
            .await
            .expect_err("no answer from a paused Redis within the deadline");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(
            status.message().contains("grpc-timeout")
                && status.message().contains("--redis-timeout"),
            "{status:?}"
        );
    }
}
