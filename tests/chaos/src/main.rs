//! The fault campaign: producers publish through the sidecars, workers consume with queued
//! side effects and random outcomes, and a nemesis kills, pauses and restarts what production
//! loses (sidecars, workers, Redis connections, Redis itself) at random moments. At the end the
//! whole history is checked against what Redis holds ([`history::check`]): nothing lost,
//! nothing done twice that the README does not allow.
//!
//!   cargo run --release -p window-sidecar-chaos -- --quick              CI: fixed seeds + one
//!   cargo run --release -p window-sidecar-chaos -- --minutes 60         an hour, both modes
//!   cargo run --release -p window-sidecar-chaos -- --seed 42 --mode atomic --minutes 2
//!
//! A run prints its seed first; the same seed replays the same decisions and faults (the
//! moments they land on still depend on the machine's timing).

mod history;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use fred::prelude::*;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tonic::transport::Channel;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, Mode, OutcomeKind};
use window_sidecar_harness::{
    RedisServer, SidecarProcess, Subscription, command, duration, free_port, outcome, retry_after,
    stream_open, try_publish,
};

use history::{Decision, EndState, Event, Promise, Stamped};

const STREAM: &str = "chaos:orders";
const GROUP: &str = "chaos";
const DEAD: &str = "chaos:dead";
const KEPT: &str = "chaos:kept";
const DISCARDED: &str = "chaos:discarded";
const MAX_DELIVERIES: u32 = 5;
/// Below the slow handler's time: a slow ack races another consumer's reclaim.
/// Above every fault's length (a pause, a sidecar down), so that only slow handling passes it.
const MIN_IDLE: Duration = Duration::from_secs(4);
const SLOW: Duration = Duration::from_millis(4_500);

#[derive(Parser, Debug, Clone)]
#[command(about = "Random faults against sidecars, workers and Redis, and a history checker")]
struct Args {
    /// The seed of decisions and faults (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long each run injects faults.
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// pipeline, atomic or both.
    #[arg(long, default_value = "both")]
    mode: String,
    /// The CI configuration: two fixed seeds and one random one, 25 s of faults each, modes
    /// alternating.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 2)]
    sidecars: usize,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Entries each of the two producers publishes per second.
    #[arg(long, default_value_t = 40)]
    rate: u64,
}

/// What every task appends to.
struct Log {
    started: Instant,
    events: Mutex<Vec<Stamped>>,
}

impl Log {
    fn push(&self, event: Event) {
        let at_ms = self.started.elapsed().as_millis() as u64;
        self.events.lock().push(Stamped { at_ms, event });
    }
}

/// The sidecars, by index: each on its own port, restarted on it after a kill.
struct Sidecars {
    redis_url: String,
    ports: Vec<u16>,
    running: Mutex<Vec<Option<SidecarProcess>>>,
}

impl Sidecars {
    fn start(redis_url: &str, count: usize) -> Self {
        let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let sidecars = Self {
            redis_url: redis_url.to_owned(),
            ports,
            running: Mutex::new((0..count).map(|_| None).collect()),
        };
        for i in 0..count {
            sidecars.restart(i);
        }
        sidecars
    }

    fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    fn restart(&self, i: usize) {
        let listen = self.addr(i);
        let process = SidecarProcess::serve(
            &self.redis_url,
            &listen,
            &[
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
            ],
        );
        self.running.lock()[i] = Some(process);
    }

    /// Takes sidecar `i` out (SIGKILL, or SIGTERM and its drain), then starts it again.
    fn bounce(&self, i: usize, graceful: bool, down_for: Duration) {
        let taken = self.running.lock()[i].take();
        if let Some(mut process) = taken {
            if graceful {
                process.terminate();
            } else {
                process.kill9();
            }
        }
        std::thread::sleep(down_for);
        self.restart(i);
    }
}

/// One worker's loop: subscribe through some sidecar, decide each delivery at random, go again
/// when the stream ends, until `stop`; after `settle`, ack everything.
async fn work(
    id: u32,
    atomic: bool,
    sidecars: Arc<Sidecars>,
    log: Arc<Log>,
    seed: u64,
    stop: Arc<AtomicBool>,
    settle: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let consumer = format!("w{id}");
    let mut attempt = 0usize;
    while !stop.load(Ordering::Relaxed) {
        attempt += 1;
        let addr = sidecars.addr((id as usize + attempt) % sidecars.ports.len());
        let mut open = stream_open(STREAM, GROUP, &consumer, 8);
        if let Some(proto::open::Source::Stream(s)) = &mut open.source {
            s.min_idle = Some(duration(MIN_IDLE));
        }
        open.max_deliveries = MAX_DELIVERIES;
        open.dead_letter = Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream(DEAD.into())),
        });
        if atomic {
            open.mode = Mode::Atomic as i32;
        }
        let Some(mut sub) = subscribe(&addr, open).await else {
            // The sidecar is down, the consumer's lease is still held (its sidecar died), or
            // the sidecar is draining: try again, elsewhere.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut after_slow = false;
        'stream: while !stop.load(Ordering::Relaxed) {
            let Some(Ok(Some(message))) = sub.message_within(Duration::from_secs(5)).await else {
                break 'stream;
            };
            let Some(Kind::Read(read)) = message.kind else {
                continue;
            };
            for d in &read.deliveries {
                log.push(Event::Delivered {
                    worker: id,
                    entry: d.entry_id.clone(),
                    count: d.delivery_count,
                });
            }
            // A read flushes once all its deliveries have outcomes: one slow delivery keeps
            // every ack of its read unsettled past min_idle, so they are all slow acks.
            let mut decisions: Vec<Decision> = read
                .deliveries
                .iter()
                .map(|_| {
                    if settle.load(Ordering::Relaxed) {
                        Decision::Ack
                    } else {
                        pick(&mut rng)
                    }
                })
                .collect();
            // The read after a slow one waited in the stream while the worker slept: it too is
            // handled past min_idle (at most two reads are out: max_in_flight is twice count).
            let slow_read = decisions.contains(&Decision::SlowAck);
            if slow_read || after_slow {
                for (d, delivery) in decisions.iter_mut().zip(&read.deliveries) {
                    if slow_read && *d == Decision::Ack {
                        *d = Decision::SlowAck;
                    }
                    log.push(Event::Late {
                        entry: delivery.entry_id.clone(),
                    });
                }
            }
            after_slow = slow_read;
            let mut late = false;
            for (i, (d, decision)) in read.deliveries.iter().zip(decisions).enumerate() {
                let effect = |hash: &str| command(d.slot, "HINCRBY", &[hash, &d.entry_id, "1"]);
                let (commands, outcome) = match decision {
                    Decision::Ack => (vec![effect(KEPT)], outcome(d.slot, OutcomeKind::Ack)),
                    Decision::SlowAck => {
                        if !late {
                            tokio::time::sleep(SLOW).await;
                            late = true;
                        }
                        (vec![effect(KEPT)], outcome(d.slot, OutcomeKind::Ack))
                    }
                    Decision::Drop => (vec![effect(DISCARDED)], outcome(d.slot, OutcomeKind::Drop)),
                    Decision::Retry => {
                        (vec![effect(DISCARDED)], outcome(d.slot, OutcomeKind::Retry))
                    }
                    Decision::RetryAfter => {
                        let delay = Duration::from_millis(rng.random_range(100..600));
                        (vec![effect(DISCARDED)], retry_after(d.slot, delay))
                    }
                    Decision::Abandon => {
                        for rest in &read.deliveries[i..] {
                            log.push(Event::Decided {
                                worker: id,
                                entry: rest.entry_id.clone(),
                                decision: Decision::Abandon,
                            });
                        }
                        // Dropping the stream, not a clean close: the client went away.
                        break 'stream;
                    }
                };
                log.push(Event::Decided {
                    worker: id,
                    entry: d.entry_id.clone(),
                    decision,
                });
                let batch = proto::Batch {
                    commands,
                    outcomes: vec![outcome],
                    ..Default::default()
                };
                if !sub
                    .try_send_kind(proto::subscribe_request::Kind::Batch(batch))
                    .await
                {
                    break 'stream;
                }
            }
        }
        drop(sub);
    }
}

/// A gRPC client of the sidecar at `addr`, or None when it does not answer within a second.
async fn client(addr: &str) -> Option<WindowServiceClient<Channel>> {
    let connect = WindowServiceClient::connect(format!("http://{addr}"));
    tokio::time::timeout(Duration::from_secs(1), connect)
        .await
        .ok()?
        .ok()
}

/// Opens a subscription; None unless the sidecar answers `opened` within 5 s.
async fn subscribe(addr: &str, open: proto::Open) -> Option<Subscription> {
    let mut client = client(addr).await?;
    let mut sub = Subscription::start(&mut client, proto::subscribe_request::Kind::Open(open))
        .await
        .ok()?;
    match sub.message_within(Duration::from_secs(5)).await {
        Some(Ok(Some(proto::SubscribeResponse {
            kind: Some(Kind::Opened(_)),
        }))) => Some(sub),
        _ => None,
    }
}

/// A delivery's fate: mostly acks, every other outcome often enough to meet every fault.
fn pick(rng: &mut StdRng) -> Decision {
    match rng.random_range(0..100) {
        0..60 => Decision::Ack,
        60..64 => Decision::SlowAck,
        64..72 => Decision::Drop,
        72..82 => Decision::Retry,
        82..92 => Decision::RetryAfter,
        _ => Decision::Abandon,
    }
}

/// Publishes numbered entries through the sidecars until `stop`, retrying an unanswered
/// Publish on another sidecar (an unanswered one may have been written: each written entry is
/// a root of its own).
async fn produce(
    id: usize,
    rate: u64,
    sidecars: Arc<Sidecars>,
    stop: Arc<AtomicBool>,
    n: Arc<AtomicU64>,
) {
    let every = Duration::from_micros(1_000_000 / rate.max(1));
    let mut tick = tokio::time::interval(every);
    let mut target = id;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let number = n.fetch_add(1, Ordering::Relaxed);
        loop {
            let addr = sidecars.addr(target % sidecars.ports.len());
            if let Some(mut client) = client(&addr).await {
                let published = tokio::time::timeout(
                    Duration::from_secs(3),
                    try_publish(&mut client, STREAM, number as usize),
                )
                .await;
                if matches!(published, Ok(Ok(_))) {
                    break;
                }
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            target += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The faults, one every 1 to 3 s until `stop`.
#[allow(clippy::too_many_arguments)]
async fn nemesis(
    seed: u64,
    redis: Arc<Mutex<RedisServer>>,
    sidecars: Arc<Sidecars>,
    workers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    respawn: impl Fn(u32) -> tokio::task::JoinHandle<()>,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    admin: Client,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6e656d65);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let sidecar = rng.random_range(0..sidecars.ports.len());
        let down_for = Duration::from_millis(rng.random_range(200..1_500));
        match rng.random_range(0..100) {
            0..25 => {
                log.push(Event::Fault(format!("sigkill sidecar-{sidecar}")));
                let s = Arc::clone(&sidecars);
                tokio::task::spawn_blocking(move || s.bounce(sidecar, false, down_for))
                    .await
                    .expect("bounce");
            }
            25..40 => {
                log.push(Event::Fault(format!("sigterm sidecar-{sidecar}")));
                let s = Arc::clone(&sidecars);
                tokio::task::spawn_blocking(move || s.bounce(sidecar, true, down_for))
                    .await
                    .expect("bounce");
            }
            40..60 => {
                let mut handles = workers.lock();
                let w = rng.random_range(0..handles.len());
                log.push(Event::Fault(format!("kill worker-{w}")));
                handles[w].abort();
                handles[w] = respawn(w as u32);
            }
            60..75 => {
                log.push(Event::Fault("client-kill normal".into()));
                let _: Result<Value, _> = admin
                    .custom(
                        fred::cmd!("CLIENT"),
                        vec!["KILL", "TYPE", "normal", "SKIPME", "yes"],
                    )
                    .await;
            }
            75..90 => {
                let ms = rng.random_range(200..1_500u64);
                log.push(Event::Fault(format!("client-pause {ms}ms")));
                let _: Result<Value, _> = admin
                    .custom(
                        fred::cmd!("CLIENT"),
                        vec!["PAUSE".to_owned(), ms.to_string()],
                    )
                    .await;
            }
            _ => {
                log.push(Event::Fault("redis-restart (SIGKILL, AOF)".into()));
                let r = Arc::clone(&redis);
                tokio::task::spawn_blocking(move || {
                    let mut redis = r.lock();
                    redis.kill();
                    std::thread::sleep(down_for);
                    redis.restart();
                })
                .await
                .expect("restart");
            }
        }
    }
}

/// Whether Redis holds nothing pending, nothing delayed and nothing unread by the group.
async fn settled(redis: &Client) -> bool {
    let pending: Option<u64> = redis
        .custom::<Value, _>(fred::cmd!("XPENDING"), vec![STREAM, GROUP])
        .await
        .ok()
        .and_then(|v| match v {
            Value::Array(items) => items.first().and_then(Value::as_u64),
            _ => None,
        });
    let delayed: Option<u64> = redis
        .zcard(format!("{{{STREAM}}}:window:delayed"))
        .await
        .ok();
    let lag = redis
        .custom::<Value, _>(fred::cmd!("XINFO"), vec!["GROUPS", STREAM])
        .await
        .ok()
        .and_then(|groups| lag_of(&groups));
    pending == Some(0) && delayed == Some(0) && lag == Some(0)
}

/// The state checked at the end.
async fn end_state(redis: &Client) -> EndState {
    let entries: Vec<(String, std::collections::HashMap<String, String>)> =
        redis.xrange(STREAM, "-", "+", None).await.expect("XRANGE");
    let dead: Vec<(String, std::collections::HashMap<String, String>)> = redis
        .xrange(DEAD, "-", "+", None)
        .await
        .expect("XRANGE dead");
    let kept: std::collections::HashMap<String, i64> =
        redis.hgetall(KEPT).await.expect("HGETALL kept");
    let discarded: std::collections::HashMap<String, i64> =
        redis.hgetall(DISCARDED).await.expect("HGETALL discarded");
    let pending: Value = redis
        .custom(fred::cmd!("XPENDING"), vec![STREAM, GROUP])
        .await
        .expect("XPENDING");
    let pending = match pending {
        Value::Array(items) => items.first().and_then(Value::as_u64).unwrap_or(0),
        _ => 0,
    };
    let delayed: u64 = redis
        .zcard(format!("{{{STREAM}}}:window:delayed"))
        .await
        .expect("ZCARD");
    let mut end = EndState {
        entries: entries
            .into_iter()
            .map(|(id, fields)| (id, fields.get("h:x-window-original-id").cloned()))
            .collect(),
        kept_effects: kept,
        discarded_effects: discarded,
        dead_letters: dead
            .into_iter()
            .map(|(_, fields)| {
                (
                    fields
                        .get("h:x-window-original-id")
                        .cloned()
                        .unwrap_or_default(),
                    fields
                        .get("h:x-window-deliveries")
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0),
                )
            })
            .collect(),
        pending,
        delayed,
    };
    // Effects are counted per delivered entry; the checker counts them per root.
    let roots = end.roots_of();
    let by_root = |effects: std::collections::HashMap<String, i64>| {
        let mut per_root = std::collections::HashMap::new();
        for (entry, n) in effects {
            let root = roots.get(&entry).cloned().unwrap_or(entry);
            *per_root.entry(root).or_insert(0) += n;
        }
        per_root
    };
    end.kept_effects = by_root(std::mem::take(&mut end.kept_effects));
    end.discarded_effects = by_root(std::mem::take(&mut end.discarded_effects));
    end
}

/// One run: one mode, one seed. Returns the number of anomalies.
async fn run(args: &Args, seed: u64, atomic: bool, fault_time: Duration) -> usize {
    let mode = if atomic { "atomic" } else { "pipeline" };
    println!("== run: seed {seed}, mode {mode}, {fault_time:?} of faults");
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = redis.url();
    let redis = Arc::new(Mutex::new(redis));
    let admin = window_sidecar_harness::connect(&url).await;
    let sidecars = Arc::new(
        tokio::task::spawn_blocking({
            let url = url.clone();
            let count = args.sidecars;
            move || Sidecars::start(&url, count)
        })
        .await
        .expect("sidecars"),
    );
    let log = Arc::new(Log {
        started: Instant::now(),
        events: Mutex::new(Vec::new()),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let settle = Arc::new(AtomicBool::new(false));
    let workers_stop = Arc::new(AtomicBool::new(false));
    let spawn_worker = {
        let (sidecars, log, stop, settle) = (
            Arc::clone(&sidecars),
            Arc::clone(&log),
            Arc::clone(&workers_stop),
            Arc::clone(&settle),
        );
        move |id: u32| {
            tokio::spawn(work(
                id,
                atomic,
                Arc::clone(&sidecars),
                Arc::clone(&log),
                seed.wrapping_add(u64::from(id) * 7919),
                Arc::clone(&stop),
                Arc::clone(&settle),
            ))
        }
    };
    let workers = Arc::new(Mutex::new(
        (0..args.workers as u32)
            .map(&spawn_worker)
            .collect::<Vec<_>>(),
    ));
    let numbers = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..2)
        .map(|id| {
            tokio::spawn(produce(
                id,
                args.rate,
                Arc::clone(&sidecars),
                Arc::clone(&stop),
                Arc::clone(&numbers),
            ))
        })
        .collect();
    let nemesis = tokio::spawn(nemesis(
        seed,
        Arc::clone(&redis),
        Arc::clone(&sidecars),
        Arc::clone(&workers),
        spawn_worker.clone(),
        Arc::clone(&log),
        Arc::clone(&stop),
        admin.clone(),
    ));

    tokio::time::sleep(fault_time).await;
    stop.store(true, Ordering::Relaxed);
    nemesis.await.expect("nemesis");
    for p in producers {
        p.await.expect("producer");
    }
    // Quiesce: everything still out is acked, until Redis has nothing pending or delayed.
    settle.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut quiet_since = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if settled(&admin).await {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                break;
            }
        } else {
            quiet_since = None;
        }
    }
    workers_stop.store(true, Ordering::Relaxed);
    for w in workers.lock().drain(..) {
        w.abort();
    }
    let end = end_state(&admin).await;
    let history = std::mem::take(&mut *log.events.lock());
    let promise = Promise {
        exactly_once: atomic,
        max_deliveries: MAX_DELIVERIES,
    };
    let (anomalies, figures) = history::check(&history, &end, promise);
    println!(
        "   {} entries, {} deliveries, decisions {:?}, dead letters {}, duplicate side effects {}",
        figures.roots,
        figures.deliveries,
        figures.decisions,
        figures.dead_letters,
        figures.duplicate_effects
    );
    println!("   faults {:?}", figures.faults);
    for anomaly in &anomalies {
        println!("ANOMALY (seed {seed}, mode {mode}): {anomaly}");
        if let Some(root) = &anomaly.root {
            for event in history::around(&history, &end, root, 2_000) {
                println!("     {:>7} ms  {:?}", event.at_ms, event.event);
            }
        }
    }
    let _ = admin.quit().await;
    drop(sidecars);
    anomalies.len()
}

/// The group's lag from XINFO GROUPS (entries not yet read by it).
fn lag_of(groups: &Value) -> Option<u64> {
    let Value::Array(groups) = groups else {
        return None;
    };
    for group in groups {
        let Value::Array(fields) = group else {
            continue;
        };
        let mut name = None;
        let mut lag = None;
        for pair in fields.chunks(2) {
            if let [k, v] = pair {
                match k.as_str().as_deref() {
                    Some("name") => name = v.as_string(),
                    Some("lag") => lag = v.as_u64(),
                    _ => {}
                }
            }
        }
        if name.as_deref() == Some(GROUP) {
            return lag;
        }
    }
    None
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let random = args.seed.unwrap_or_else(|| rand::rng().random());
    let runs: Vec<(u64, bool, Duration)> = if args.quick {
        let each = Duration::from_secs(25);
        vec![
            (1, false, each),
            (2, true, each),
            (random, random % 2 == 1, each),
        ]
    } else {
        let each = Duration::from_secs_f64(args.minutes * 60.0);
        match args.mode.as_str() {
            "pipeline" => vec![(random, false, each)],
            "atomic" => vec![(random, true, each)],
            _ => vec![(random, false, each / 2), (random, true, each / 2)],
        }
    };
    println!("window-sidecar chaos: seed {random}");
    let mut failed = 0;
    for (seed, atomic, time) in &runs {
        if run(&args, *seed, *atomic, *time).await > 0 {
            failed += 1;
        }
    }
    // One check per run: a run passes when its history has no anomaly.
    println!("{} passed, {failed} failed", runs.len() - failed);
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
