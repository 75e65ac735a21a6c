//! The fault campaign: producers publish through the sidecars, workers consume with queued
//! side effects and random outcomes, and a nemesis kills, pauses, cuts and restarts what
//! production loses (sidecars, workers, their TCP connections, Redis connections, Redis itself,
//! a cluster primary, a slot's owner) at random moments, and has Redis refuse the sidecars'
//! writes for a moment ([`refusal`]: out of memory, an ACL, a key's type, scripts flushed,
//! writes paused). At the end the whole history is checked against what Redis holds
//! ([`history::check`]): nothing lost, nothing done twice that the README does not allow.
//! Streams run under retention by acknowledgement, with a second
//! group the campaign reads itself behind the workers (no entry may leave before both groups
//! have it, and that group sees every published entry exactly once: the workers' retries and
//! redrives stay in their own group), and the nemesis also redrives dead letters through the
//! dead-letter service.
//! Stream and reliable-list workers open ordered subscriptions (`Open.ordering_key`, few keys
//! that collide), by default every other worker, and the checker holds each ordered
//! subscription stream to per-key order ([`history`]'s `order`).
//!
//!   cargo run --release -p window-sidecar-chaos -- --quick              CI: fixed seeds + one
//!   cargo run --release -p window-sidecar-chaos -- --minutes 60         an hour, every form
//!   cargo run --release -p window-sidecar-chaos -- --seed 42 --form stream --mode atomic --cluster
//!
//! A run prints its seed first; the same seed replays the same decisions and faults (the
//! moments they land on still depend on the machine's timing).

mod admin;
mod form;
mod history;
mod proxy;
mod refusal;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use fred::prelude::*;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tonic::transport::Channel;
use window_sidecar::proto::dead_letter_service_client::DeadLetterServiceClient;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::{
    RedisCluster, RedisServer, SidecarProcess, Subscription, command, free_port, outcome,
    retry_after, slot_of, try_http_get, url_with_auth,
};

use admin::{SubscriptionState, at_rest, describe_subscriptions};
use form::{AUDIT_GROUP, AUDIT_READER, DISCARDED, Fields, Form, KEPT, MAX_DELIVERIES};
use history::{Decision, EndState, Event, Promise, Stamped};
use proxy::Proxy;
use refusal::Refusal;

const SLOW: Duration = Duration::from_millis(4_500);

#[derive(Parser, Debug, Clone)]
#[command(about = "Random faults against sidecars, workers and Redis, and a history checker")]
struct Args {
    /// The seed of decisions and faults (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long the campaign injects faults, in all (split evenly between its runs).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// pipeline, atomic or both.
    #[arg(long, default_value = "both")]
    mode: String,
    /// One form (default: every form in turn; streams also on a cluster).
    #[arg(long, value_enum)]
    form: Option<Form>,
    /// Against a 3-primary Redis Cluster with a replica each (streams only).
    #[arg(long)]
    cluster: bool,
    /// The CI configuration: fixed seeds and one random one, 25 s of faults each.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 2)]
    sidecars: usize,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Entries each of the two producers publishes per second.
    #[arg(long, default_value_t = 40)]
    rate: u64,
    /// No nemesis: the same load and checks without faults (a baseline).
    #[arg(long)]
    no_faults: bool,
    /// Which stream and reliable-list workers order by key: every other one (both kinds of
    /// subscription share the group or list), all or none.
    #[arg(long, value_enum, default_value = "mixed")]
    ordered: Ordered,
}

/// Which workers open ordered subscriptions (where the form can be ordered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Ordered {
    /// The even-numbered workers.
    Mixed,
    All,
    None,
}

impl Ordered {
    fn worker(self, id: u32) -> bool {
        match self {
            Ordered::Mixed => id.is_multiple_of(2),
            Ordered::All => true,
            Ordered::None => false,
        }
    }
}

/// One run of the campaign.
#[derive(Clone, Copy, Debug)]
struct Run {
    seed: u64,
    form: Form,
    atomic: bool,
    cluster: bool,
    faults_for: Duration,
    ordered: Ordered,
}

/// What every task appends to.
struct Log {
    started: Instant,
    events: Mutex<Vec<Stamped>>,
}

impl Log {
    fn push(&self, event: Event) {
        let at_ms = self.now_ms();
        self.events.lock().push(Stamped { at_ms, event });
    }

    /// Milliseconds since the campaign started.
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Logs `event` at `at_ms`, a moment that has passed: after the events logged by then.
    fn push_at(&self, at_ms: u64, event: Event) {
        let mut events = self.events.lock();
        let at = events
            .iter()
            .rposition(|s| s.at_ms <= at_ms)
            .map_or(0, |i| i + 1);
        events.insert(at, Stamped { at_ms, event });
    }
}

/// The Redis the run is against.
enum Backend {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    fn url(&self) -> String {
        match self {
            Backend::Single(redis) => redis.url(),
            Backend::Cluster(cluster) => cluster.url(),
        }
    }

    /// The port of the node that owns the campaign's keys.
    fn primary(&self) -> u16 {
        match self {
            Backend::Single(redis) => redis.port(),
            Backend::Cluster(cluster) => cluster.primary_for_slot(slot_of(form::STREAM)),
        }
    }

    /// The ports of every primary (the single node's own).
    fn primaries(&self) -> Vec<u16> {
        match self {
            Backend::Single(redis) => vec![redis.port()],
            Backend::Cluster(cluster) => cluster.primaries(),
        }
    }
}

/// The sidecars, by index: each on its own port, restarted on it after a kill, and each behind
/// a proxy that the workers go through.
struct Sidecars {
    redis_url: String,
    cluster: bool,
    /// The stream runs under retention by acknowledgement.
    retain: bool,
    ports: Vec<u16>,
    /// Each sidecar's `--metrics-listen` port: its admin view of open subscriptions.
    admin_ports: Vec<u16>,
    proxies: Vec<Proxy>,
    running: Mutex<Vec<Option<SidecarProcess>>>,
}

impl Sidecars {
    async fn start(redis_url: &str, count: usize, cluster: bool, retain: bool) -> Arc<Self> {
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
        });
        let s = Arc::clone(&sidecars);
        tokio::task::spawn_blocking(move || (0..count).for_each(|i| s.restart(i)))
            .await
            .expect("sidecars");
        sidecars
    }

    /// Sidecar `i`'s own address (producers use it).
    fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i % self.ports.len()])
    }

    /// Sidecar `i` through its proxy (workers use it).
    fn proxied(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.proxies[i % self.proxies.len()].port)
    }

    fn restart(&self, i: usize) {
        let listen = self.addr(i);
        let admin = format!("127.0.0.1:{}", self.admin_ports[i]);
        let mut args = vec![
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
    async fn subscriptions(&self) -> Vec<Option<Vec<SubscriptionState>>> {
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
    async fn metrics(&self) -> Vec<String> {
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

/// What a worker shares with the run.
struct Shared {
    run: Run,
    sidecars: Arc<Sidecars>,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    settle: Arc<AtomicBool>,
    /// Numbers the workers' subscription streams across the run.
    streams: AtomicU32,
    waits: Waits,
}

/// Reads that waited for their worker past [`LATE_AFTER`].
#[derive(Default)]
struct Waits {
    late: AtomicU64,
    /// Of those, the ones that did not follow a slow read at once: there were more than two
    /// reads out.
    further_back: AtomicU64,
    longest_ms: AtomicU64,
    /// Reads right after a slow one that did not wait that long (they came as it ended).
    prompt_after_slow: AtomicU64,
}

impl Waits {
    /// Counts a read that `waited` for its worker, `late` or not, right `after_slow` or not.
    fn note(&self, waited: Duration, late: bool, after_slow: bool) {
        if late {
            self.late.fetch_add(1, Ordering::Relaxed);
            if !after_slow {
                self.further_back.fetch_add(1, Ordering::Relaxed);
            }
            self.longest_ms
                .fetch_max(waited.as_millis() as u64, Ordering::Relaxed);
        } else if after_slow {
            self.prompt_after_slow.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One worker's loop: subscribe through some sidecar, decide each delivery at random, go again
/// when the stream ends, until `stop`; after `settle`, ack everything.
async fn work(id: u32, shared: Arc<Shared>) {
    let Run { form, atomic, .. } = shared.run;
    let mut rng = StdRng::seed_from_u64(shared.run.seed.wrapping_add(u64::from(id) * 7919));
    let consumer = format!("w{id}");
    let ordered = form.can_order() && shared.run.ordered.worker(id);
    let mut attempt = 0usize;
    while !shared.stop.load(Ordering::Relaxed) {
        attempt += 1;
        let addr = shared.sidecars.proxied(id as usize + attempt);
        let Some(mut sub) = subscribe(&addr, form.open(&consumer, atomic, ordered)).await else {
            // The sidecar is down, the consumer's lease is still held (its sidecar died), or
            // the sidecar is draining: try again, elsewhere.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let stream = shared.streams.fetch_add(1, Ordering::Relaxed);
        serve(id, &shared, &mut sub, (stream, ordered), &mut rng).await;
        drop(sub);
    }
}

/// Answers the reads of one subscription stream (numbered `stream`, `ordered` by key or not)
/// until `stop`, the stream ends or breaks, or the worker abandons a read (it drops the stream
/// then, as a client that went away).
async fn serve(
    id: u32,
    shared: &Shared,
    sub: &mut Subscription,
    (stream, ordered): (u32, bool),
    rng: &mut StdRng,
) {
    let log = &shared.log;
    let mut waiting = Waiting::new();
    let mut after_slow = false;
    // The acked entries by slot, for a report that says Redis refused their side effects.
    let mut kept: HashMap<u64, String> = HashMap::new();
    // A flush report is logged as it comes, also while the worker sleeps on a slow ack: a
    // worker that then abandons its read or stops would otherwise never log the reports it
    // took meanwhile, and the checker would miss what they said (a side effect Redis refused).
    let note_report = |report: &proto::FlushReport, kept: &HashMap<u64, String>| {
        log.push(Event::Flushed {
            worker: id,
            stream,
            read_id: report.read_id,
            ok: report.ok,
        });
        if let Some(event) = refused(id, stream, report, kept) {
            log.push(event);
        }
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let (came, message) = match waiting.pop_front() {
            Some(message) => message,
            None => match sub.message_within(Duration::from_secs(5)).await {
                Some(Ok(Some(message))) => (Instant::now(), Some(message)),
                _ => return,
            },
        };
        let Some(message) = message else { return };
        let read = match message.kind {
            Some(Kind::Read(read)) => read,
            Some(Kind::Flush(report)) => {
                note_report(&report, &kept);
                continue;
            }
            _ => continue,
        };
        log.push(Event::Read {
            worker: id,
            stream,
            read_id: read.read_id,
        });
        if let Some(report) = &read.flushed {
            note_report(report, &kept);
        }
        for d in &read.deliveries {
            log_delivery(id, shared, (stream, ordered), read.read_id, d);
        }
        let decisions = decide(shared, &read, rng, (came.elapsed(), &mut after_slow));
        kept.extend(
            read.deliveries
                .iter()
                .zip(&decisions)
                .take_while(|(_, decision)| **decision != Decision::Abandon)
                .filter(|(_, decision)| decision.keeps())
                .map(|(d, _)| (d.slot, shared.run.form.identity(d))),
        );
        let mut on_report = |report: &proto::FlushReport| note_report(report, &kept);
        let receiving = (&mut *sub, &mut waiting, &mut on_report as OnReport<'_>);
        if !answer(id, shared, receiving, &read, decisions, rng).await {
            return;
        }
    }
}

/// The event of a failed flush report (None for one that succeeded): the class of its error,
/// each refused requeue's, and the acked entries (from `kept`, by slot) whose side effect
/// Redis refused while their settle stood (`side_effect_failures` marked `settled`: pipeline
/// mode, where Redis has no rollback).
fn refused(
    worker: u32,
    stream: u32,
    report: &proto::FlushReport,
    kept: &HashMap<u64, String>,
) -> Option<Event> {
    let requeues: Vec<String> = report
        .requeue_refused
        .iter()
        .map(|r| refusal::reason(&r.error).to_owned())
        .collect();
    let kept_unwritten = report
        .side_effect_failures
        .iter()
        .filter(|f| f.settled)
        .filter_map(|f| kept.get(&f.slot).cloned())
        .collect();
    (!report.ok).then(|| Event::Refused {
        worker,
        stream,
        read_id: report.read_id,
        error: refusal::reason(&report.error).to_owned(),
        requeues,
        kept_unwritten,
    })
}

/// What came in on a subscription stream while its worker slept on a slow ack, in order, each
/// with when it came; `None`: the stream ended or broke there. Flush reports are not in it:
/// they were handed over as they came.
type Waiting = VecDeque<(Instant, Option<proto::SubscribeResponse>)>;

/// Where a worker's flush reports go as they come.
type OnReport<'a> = &'a mut (dyn FnMut(&proto::FlushReport) + Send);

/// Sleeps `time`, taking each message off the stream as it comes meanwhile (as a client whose
/// handler runs beside its receiving does), so that how long a read then waits for its worker
/// is known. Flush reports, alone or in a read, go to `on_report` at once.
async fn sleep_receiving(
    sub: &mut Subscription,
    time: Duration,
    waiting: &mut Waiting,
    on_report: OnReport<'_>,
) {
    let until = Instant::now() + time;
    while let Some(received) = sub
        .message_within(until.saturating_duration_since(Instant::now()))
        .await
    {
        let mut message = received.ok().flatten();
        match message.as_mut().and_then(|m| m.kind.as_mut()) {
            Some(Kind::Flush(report)) => {
                on_report(report);
                continue;
            }
            Some(Kind::Read(read)) => {
                if let Some(report) = read.flushed.take() {
                    on_report(&report);
                }
            }
            _ => {}
        }
        let ended = message.is_none();
        waiting.push_back((Instant::now(), message));
        if ended {
            tokio::time::sleep_until(until).await;
            return;
        }
    }
}

/// Logs a delivery, and on an ordered stream its key and read (after it: the checkers that
/// follow a worker's reads see the `Delivered` first).
fn log_delivery(
    id: u32,
    shared: &Shared,
    (stream, ordered): (u32, bool),
    read_id: u64,
    d: &proto::Delivery,
) {
    let form = shared.run.form;
    let entry = form.identity(d);
    shared.log.push(Event::Delivered {
        worker: id,
        entry: entry.clone(),
        count: d.delivery_count,
    });
    if let Some(key) = form.ordering_key(d).filter(|_| ordered) {
        shared.log.push(Event::InOrder {
            worker: id,
            stream,
            read_id,
            entry,
            key,
            count: d.delivery_count,
        });
    }
}

/// How long a read may wait for its worker before it counts as handled past min_idle. Its
/// entries may have been idle for a while already when it came (one that waited in the
/// sidecar for its key is made idle again every third of min_idle), and their flush follows
/// the worker's answer.
const LATE_AFTER: Duration = Duration::from_millis(form::MIN_IDLE.as_millis() as u64 / 2);

/// Each delivery's decision: at random, or an ack once the run settles. A read flushes once
/// all its deliveries have outcomes: one slow delivery keeps every ack of its read unsettled
/// past min_idle, so they are all slow acks. A read that `waited` for its worker past
/// [`LATE_AFTER`] (it came while the worker slept on a slow ack: reads may be partial, so
/// there may be several) is handled late too. Either is logged late.
fn decide(
    shared: &Shared,
    read: &proto::Read,
    rng: &mut StdRng,
    (waited, after_slow): (Duration, &mut bool),
) -> Vec<Decision> {
    let mut decisions: Vec<Decision> = read
        .deliveries
        .iter()
        .map(|_| {
            if shared.settle.load(Ordering::Relaxed) {
                Decision::Ack
            } else {
                pick(rng)
            }
        })
        .collect();
    let slow_read = decisions.contains(&Decision::SlowAck);
    let late_for_wait = waited >= LATE_AFTER;
    shared.waits.note(waited, late_for_wait, *after_slow);
    *after_slow = slow_read;
    if slow_read || late_for_wait {
        for (d, delivery) in decisions.iter_mut().zip(&read.deliveries) {
            if slow_read && *d == Decision::Ack {
                *d = Decision::SlowAck;
            }
            shared.log.push(Event::Late {
                entry: shared.run.form.identity(delivery),
            });
        }
    }
    decisions
}

/// Sends each delivery's side effect and outcome, one batch per delivery, logging each
/// decision; the first slow ack sleeps past min_idle (taking what comes meanwhile into
/// `waiting`). Returns false when the worker abandons the read (the rest of it is logged abandoned) or the stream stopped taking requests.
async fn answer(
    id: u32,
    shared: &Shared,
    (sub, waiting, on_report): (&mut Subscription, &mut Waiting, OnReport<'_>),
    read: &proto::Read,
    decisions: Vec<Decision>,
    rng: &mut StdRng,
) -> bool {
    let (log, form) = (&shared.log, shared.run.form);
    let mut late = false;
    for (i, (d, decision)) in read.deliveries.iter().zip(decisions).enumerate() {
        let entry = form.identity(d);
        let effect = |hash: &str| command(d.slot, "HINCRBY", &[hash, &entry, "1"]);
        // A retry_after's delay, logged after its decision.
        let mut delayed = None;
        let (commands, outcome) = match decision {
            Decision::Ack => (vec![effect(KEPT)], outcome(d.slot, OutcomeKind::Ack)),
            Decision::SlowAck => {
                if !late {
                    sleep_receiving(sub, SLOW, waiting, on_report).await;
                    late = true;
                }
                (vec![effect(KEPT)], outcome(d.slot, OutcomeKind::Ack))
            }
            Decision::Drop => (vec![effect(DISCARDED)], outcome(d.slot, OutcomeKind::Drop)),
            Decision::Retry => (vec![effect(DISCARDED)], outcome(d.slot, OutcomeKind::Retry)),
            Decision::RetryAfter => {
                let delay = Duration::from_millis(rng.random_range(100..600));
                delayed = Some(delay);
                (vec![effect(DISCARDED)], retry_after(d.slot, delay))
            }
            Decision::Abandon => {
                for rest in &read.deliveries[i..] {
                    log.push(Event::Decided {
                        worker: id,
                        entry: form.identity(rest),
                        decision: Decision::Abandon,
                    });
                }
                // Dropping the stream, not a clean close: the client went away.
                return false;
            }
        };
        log.push(Event::Decided {
            worker: id,
            entry: entry.clone(),
            decision,
        });
        if let Some(delay) = delayed {
            log.push(Event::Delayed {
                worker: id,
                entry,
                delay_ms: delay.as_millis() as u64,
            });
        }
        let batch = proto::Batch {
            commands,
            outcomes: vec![outcome],
            ..Default::default()
        };
        if !sub
            .try_send_kind(proto::subscribe_request::Kind::Batch(batch))
            .await
        {
            return false;
        }
    }
    true
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

/// Publishes numbered entries through the sidecars until `stop`, going on to another sidecar
/// when one does not answer. Each attempt takes a new number: an unanswered publish may have
/// been written, and no two written entries share a number. Records the numbers Redis
/// certainly has.
async fn produce(
    id: usize,
    form: Form,
    rate: u64,
    sidecars: Arc<Sidecars>,
    stop: Arc<AtomicBool>,
    n: Arc<AtomicU64>,
    published: Arc<Mutex<BTreeSet<u64>>>,
) {
    let every = Duration::from_micros(1_000_000 / rate.max(1));
    let mut tick = tokio::time::interval(every);
    let mut target = id;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        loop {
            let number = n.fetch_add(1, Ordering::Relaxed);
            if let Some(mut client) = client(&sidecars.addr(target)).await {
                let answered =
                    tokio::time::timeout(Duration::from_secs(3), form.publish(&mut client, number))
                        .await;
                if let Ok(Ok(certain)) = answered {
                    if certain {
                        published.lock().insert(number);
                    }
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

/// A connection to one Redis node (for CLIENT KILL and CLIENT PAUSE, which act on a node).
async fn node_client(port: u16) -> Option<Client> {
    let config = Config::from_url(&format!("redis://127.0.0.1:{port}")).ok()?;
    let client = Builder::from_config(config).build().ok()?;
    tokio::time::timeout(Duration::from_secs(2), client.init())
        .await
        .ok()?
        .ok()?;
    Some(client)
}

/// The faults, one every 1 to 3 s until `stop`.
async fn nemesis(
    shared: Arc<Shared>,
    redis: Arc<Mutex<Backend>>,
    workers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    respawn: impl Fn(u32) -> tokio::task::JoinHandle<()>,
) {
    let Shared {
        sidecars,
        log,
        stop,
        ..
    } = &*shared;
    let cluster = shared.run.cluster;
    let mut rng = StdRng::seed_from_u64(shared.run.seed ^ 0x6e656d65);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let sidecar = rng.random_range(0..sidecars.ports.len());
        let down_for = Duration::from_millis(rng.random_range(200..1_500));
        match rng.random_range(0..130) {
            0..20 => bounce_sidecar(sidecars, log, sidecar, false, down_for).await,
            20..32 => bounce_sidecar(sidecars, log, sidecar, true, down_for).await,
            32..48 => {
                let mut handles = workers.lock();
                let w = rng.random_range(0..handles.len());
                log.push(Event::Fault(format!("kill worker-{w}")));
                handles[w].abort();
                handles[w] = respawn(w as u32);
            }
            48..60 => {
                let cut = sidecars.proxies[sidecar].cut();
                log.push(Event::Fault(format!(
                    "tcp-cut sidecar-{sidecar} ({cut} connections)"
                )));
            }
            60..72 => client_kill(&redis, log).await,
            72..84 => {
                let ms = rng.random_range(200..1_500u64);
                client_pause(&redis, log, ms).await;
            }
            84..90 if shared.run.form == Form::Stream => {
                redrive(&sidecars.addr(sidecar), log).await;
            }
            84..92 if cluster => slot_migrate(&redis, log, &mut rng).await,
            // Redis refusing the sidecars' writes for a moment.
            100..130 => {
                let refusal = match rng.random_range(100..130) {
                    100..106 => Refusal::Oom,
                    106..109 => Refusal::AclWrites,
                    109..112 => Refusal::AclScripts,
                    // Pub/sub has no dead letter.
                    112..115 if shared.run.form != Form::Pubsub => Refusal::WrongTypeDead,
                    112..118 => Refusal::WrongTypeDelayed,
                    118..123 => Refusal::ScriptFlush,
                    _ => Refusal::PauseWrite,
                };
                refuse(&redis, log, shared.run.form, refusal, &mut rng).await;
            }
            _ if cluster => primary_kill(&redis, log).await,
            _ => redis_restart(&redis, log, down_for).await,
        }
    }
}

/// Takes sidecar `i` out for `down_for` (SIGTERM and its drain when `graceful`, else SIGKILL)
/// and starts it again.
async fn bounce_sidecar(
    sidecars: &Arc<Sidecars>,
    log: &Log,
    i: usize,
    graceful: bool,
    down_for: Duration,
) {
    let signal = if graceful { "sigterm" } else { "sigkill" };
    log.push(Event::Fault(format!("{signal} sidecar-{i}")));
    let s = Arc::clone(sidecars);
    tokio::task::spawn_blocking(move || s.bounce(i, graceful, down_for))
        .await
        .expect("bounce");
}

/// Has Redis refuse the sidecars' writes for a moment (a refusal on every primary; a key's
/// wrong type on the node that holds it), then undoes it. Logged with its moments, so that the
/// flush reports it touched are counted.
async fn refuse(
    redis: &Arc<Mutex<Backend>>,
    log: &Log,
    form: Form,
    refusal: Refusal,
    rng: &mut StdRng,
) {
    let (primaries, owner) = {
        let redis = redis.lock();
        (redis.primaries(), redis.primary())
    };
    let (key, ports) = match refusal {
        Refusal::WrongTypeDead => (form::DEAD.to_owned(), vec![owner]),
        Refusal::WrongTypeDelayed => (form.delayed_key(), vec![owner]),
        _ => (String::new(), primaries),
    };
    let aside = format!("{key}:aside");
    // Shorter than a consumer lease (2 s) where the sidecars' own bookkeeping is refused too
    // (out of memory, scripts taken away): a lease lost to a refusal would let two sidecars
    // serve one consumer, which no client can tell from a double delivery. A key's type stops
    // only requeue writes, so it may last longer.
    let lasts = Duration::from_millis(match refusal {
        Refusal::WrongTypeDead | Refusal::WrongTypeDelayed => rng.random_range(1_000..3_000),
        Refusal::ScriptFlush => 1_000,
        _ => rng.random_range(500..1_800),
    });
    let name = refusal.name();
    if let Err(e) = refusal::inject(refusal, &ports, (&key, &aside), lasts).await {
        log.push(Event::Fault(format!(
            "refusal-failed {name} on {ports:?}: {e}"
        )));
        return;
    }
    let what = if key.is_empty() {
        format!("{ports:?}")
    } else {
        format!("{key} on {ports:?}")
    };
    log.push(Event::Fault(format!(
        "{name} {what} for {} ms",
        lasts.as_millis()
    )));
    tokio::time::sleep(lasts).await;
    if let Err(e) = refusal::undo(refusal, &ports, (&key, &aside)).await {
        println!("   the nemesis could not undo {name} on {ports:?}: {e}");
        log.push(Event::Fault(format!(
            "undo-failed {name} on {ports:?}: {e}"
        )));
    }
    log.push(Event::Undone(name.to_owned()));
}

/// Kills every normal client connection of the node that owns the campaign's keys.
async fn client_kill(redis: &Arc<Mutex<Backend>>, log: &Log) {
    let port = redis.lock().primary();
    log.push(Event::Fault(format!("client-kill normal on {port}")));
    if let Some(node) = node_client(port).await {
        let _: Result<Value, _> = node
            .custom(
                fred::cmd!("CLIENT"),
                vec!["KILL", "TYPE", "normal", "SKIPME", "yes"],
            )
            .await;
        let _ = node.quit().await;
    }
}

/// Pauses the clients of the node that owns the campaign's keys for `ms`.
async fn client_pause(redis: &Arc<Mutex<Backend>>, log: &Log, ms: u64) {
    let port = redis.lock().primary();
    log.push(Event::Fault(format!("client-pause {ms}ms on {port}")));
    if let Some(node) = node_client(port).await {
        let _: Result<Value, _> = node
            .custom(
                fred::cmd!("CLIENT"),
                vec!["PAUSE".to_owned(), ms.to_string()],
            )
            .await;
        let _ = node.quit().await;
    }
}

/// Migrates the stream's slot to another primary, picked at random (a cluster run).
async fn slot_migrate(redis: &Arc<Mutex<Backend>>, log: &Log, rng: &mut StdRng) {
    let slot = slot_of(form::STREAM);
    let r = Arc::clone(redis);
    let to = {
        let redis = r.lock();
        let Backend::Cluster(c) = &*redis else {
            unreachable!("a cluster run")
        };
        let owner = c.primary_for_slot(slot);
        let others: Vec<u16> = c.primaries().into_iter().filter(|p| *p != owner).collect();
        others[rng.random_range(0..others.len())]
    };
    log.push(Event::Fault(format!("slot-migrate {slot} to {to}")));
    tokio::task::spawn_blocking(move || {
        let redis = r.lock();
        let Backend::Cluster(c) = &*redis else {
            unreachable!("a cluster run")
        };
        c.migrate_slot(slot, to);
    })
    .await
    .expect("migrate");
}

/// Kills the stream's primary, waits for its replica to take over, and restarts it (a cluster
/// run).
async fn primary_kill(redis: &Arc<Mutex<Backend>>, log: &Log) {
    let slot = slot_of(form::STREAM);
    let r = Arc::clone(redis);
    let old = r.lock().primary();
    log.push(Event::Fault(format!(
        "primary-kill {old} (replica takes over)"
    )));
    tokio::task::spawn_blocking(move || {
        let mut redis = r.lock();
        let Backend::Cluster(c) = &mut *redis else {
            unreachable!("a cluster run")
        };
        c.kill(old);
        c.wait_for_failover(slot, old, Duration::from_secs(30));
        c.restart(old);
        // A user made with ACL SETUSER does not survive a restart.
        refusal::create_user(old)
    })
    .await
    .expect("failover")
    .unwrap_or_else(|e| panic!("the sidecars' user on the restarted {old}: {e}"));
}

/// SIGKILLs the single node and restarts it from its AOF after `down_for`.
async fn redis_restart(redis: &Arc<Mutex<Backend>>, log: &Log, down_for: Duration) {
    log.push(Event::Fault("redis-restart (SIGKILL, AOF)".into()));
    let r = Arc::clone(redis);
    tokio::task::spawn_blocking(move || {
        let mut redis = r.lock();
        let Backend::Single(redis) = &mut *redis else {
            unreachable!("a single-node run")
        };
        redis.kill();
        std::thread::sleep(down_for);
        redis.restart();
    })
    .await
    .expect("restart");
}

/// Redrives the dead letters (up to 100) through the dead-letter service of the sidecar at
/// `addr`, and records what it said it did: each with the entry it is a dead letter of (from a
/// listing first) and its deliveries, logged at the moment the redrive was sent (its entry may
/// come back before the answer).
async fn redrive(addr: &str, log: &Log) {
    let connect = DeadLetterServiceClient::connect(format!("http://{addr}"));
    let Ok(Ok(mut client)) = tokio::time::timeout(Duration::from_secs(1), connect).await else {
        log.push(Event::Fault(format!("redrive (no sidecar at {addr})")));
        return;
    };
    let target = Some(proto::DeadLetterTarget {
        kind: Some(proto::dead_letter_target::Kind::Stream(form::DEAD.into())),
    });
    let list = client.list_dead_letters(proto::ListDeadLettersRequest {
        target: target.clone(),
        selection: None,
        limit: 100,
    });
    let listed = match tokio::time::timeout(Duration::from_secs(5), list).await {
        Ok(Ok(response)) => response.into_inner().dead_letters,
        Ok(Err(status)) => {
            log.push(Event::Fault(format!(
                "redrive: listing failed: {}",
                status.code()
            )));
            return;
        }
        Err(_) => {
            log.push(Event::Fault("redrive: listing timed out".into()));
            return;
        }
    };
    if listed.is_empty() {
        return;
    }
    let letters: HashMap<String, (String, u32)> = listed
        .iter()
        .map(|d| (d.id.clone(), (dead_letter_origin(d), d.deliveries)))
        .collect();
    let request = proto::RedriveDeadLettersRequest {
        target,
        selection: Some(proto::DeadLetterSelection {
            ids: listed.into_iter().map(|d| d.id).collect(),
            ..Default::default()
        }),
        limit: 100,
        ..Default::default()
    };
    let sent_ms = log.now_ms();
    let call = client.redrive_dead_letters(request);
    match tokio::time::timeout(Duration::from_secs(5), call).await {
        Ok(Ok(response)) => {
            let redriven: Vec<_> = response
                .into_inner()
                .redriven
                .into_iter()
                .filter(|r| r.skipped.is_empty())
                .collect();
            log.push(Event::Fault(format!(
                "redrive {} dead letters",
                redriven.len()
            )));
            for r in redriven {
                let (origin, deliveries) = letters.get(&r.id).cloned().unwrap_or_default();
                log.push_at(
                    sent_ms,
                    Event::Redriven {
                        dead: r.id,
                        origin,
                        deliveries,
                        copy: r.new_id,
                    },
                );
            }
        }
        // A redrive that failed half-way moved some: the end state still shows every copy.
        Ok(Err(status)) => log.push(Event::Fault(format!("redrive failed: {}", status.code()))),
        Err(_) => log.push(Event::Fault("redrive timed out".into())),
    }
}

/// The entry a listed dead letter is a dead letter of (its `x-window-original-id`).
fn dead_letter_origin(dead: &proto::DeadLetterEntry) -> String {
    let name = form::ORIGINAL_ID.trim_start_matches("h:");
    dead.headers
        .iter()
        .chain(&dead.fields)
        .find(|h| h.name == name || h.name == form::ORIGINAL_ID)
        .map(|h| String::from_utf8_lossy(&h.value).into_owned())
        .unwrap_or_default()
}

/// The audit group's reader: it reads every entry of the stream behind the workers (a few
/// every half second while the run goes on), records and logs it and acknowledges it (logged
/// when Redis counted every entry acknowledged); once `drain` is set it reads the rest and
/// ends. Its own pending entries first: a read whose reply or ack a fault took stays pending on
/// its consumer.
async fn audit(
    redis: Client,
    drain: Arc<AtomicBool>,
    record: Arc<Mutex<Vec<(String, Fields)>>>,
    log: Arc<Log>,
) {
    loop {
        let draining = drain.load(Ordering::Relaxed);
        let count = if draining { 500 } else { 10 };
        let mut read = 0;
        for from in ["0", ">"] {
            let reply: Result<Value, _> = redis
                .xreadgroup(
                    AUDIT_GROUP,
                    AUDIT_READER,
                    Some(count),
                    None,
                    false,
                    form::STREAM,
                    from,
                )
                .await;
            let Ok(reply) = reply else { break };
            let entries = stream_entries(reply);
            read += entries.len();
            if entries.is_empty() {
                continue;
            }
            for (id, fields) in &entries {
                log.push(Event::Audited {
                    entry: id.clone(),
                    own: from == "0",
                    copy: form::copied(fields),
                });
            }
            let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
            record.lock().extend(entries);
            let acked: Result<u64, _> = redis.xack(form::STREAM, AUDIT_GROUP, ids.clone()).await;
            if acked.is_ok_and(|n| n == ids.len() as u64) {
                log.push(Event::AuditAcked { entries: ids });
            }
        }
        if draining && read == 0 {
            return;
        }
        let pause = if draining { 50 } else { 500 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The entries of an XREADGROUP reply, with their fields (none for an entry deleted while
/// pending).
fn stream_entries(reply: Value) -> Vec<(String, Fields)> {
    let mut out = Vec::new();
    let Value::Array(streams) = reply else {
        return out;
    };
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = pair.pop() else {
            continue;
        };
        for entry in entries {
            let Value::Array(parts) = entry else { continue };
            let mut parts = parts.into_iter();
            let Some(id) = parts.next().and_then(|v| v.as_string()) else {
                continue;
            };
            let mut fields = Fields::new();
            if let Some(Value::Array(flat)) = parts.next() {
                for pair in flat.chunks(2) {
                    if let [k, v] = pair
                        && let (Some(k), Some(v)) = (k.as_string(), v.as_string())
                    {
                        fields.insert(k, v);
                    }
                }
            }
            out.push((id, fields));
        }
    }
    out
}

/// The stream's length once both groups have acknowledged everything and the trim has had
/// time to run; None when a group's position is unknown to Redis (the trim waits then, as
/// documented).
async fn retained(redis: &Client) -> Option<u64> {
    let groups: Value = redis
        .custom(fred::cmd!("XINFO"), vec!["GROUPS", form::STREAM])
        .await
        .ok()?;
    let Value::Array(groups) = groups else {
        return None;
    };
    let lag_known = groups.iter().all(|g| match g {
        Value::Array(f) => f
            .chunks(2)
            .any(|kv| kv[0].as_str().as_deref() == Some("lag") && !kv[1].is_null()),
        _ => false,
    });
    if !lag_known {
        println!("   retention: a group's position is unknown to Redis; the trim waits");
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let len: u64 = redis.xlen(form::STREAM).await.ok()?;
        if len <= 1 || Instant::now() > deadline {
            return Some(len);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How the quiesce ended.
#[derive(Clone, Copy, Debug)]
struct Quiesce {
    /// Quiet: nothing unsettled in Redis and nothing held by a sidecar, for 2 s.
    quiet: bool,
    took: Duration,
    /// At the last look: entries unsettled in Redis (None: Redis did not answer) and
    /// deliveries outstanding at the sidecars (None: one did not answer).
    unsettled: Option<u64>,
    outstanding: Option<u64>,
}

impl std::fmt::Display for Quiesce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let took = self.took.as_secs_f64();
        if self.quiet {
            return write!(f, "quiet after {took:.1} s");
        }
        let known = |n: Option<u64>| n.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        write!(
            f,
            "NOT quiet after {took:.1} s: {} unsettled in Redis, {} deliveries outstanding at \
             the sidecars",
            known(self.unsettled),
            known(self.outstanding)
        )
    }
}

/// Waits (90 s at most) until, for 2 s, Redis has nothing unsettled and no sidecar holds
/// anything of a subscription.
async fn quiesce(form: Form, admin: &Client, sidecars: &Sidecars) -> Quiesce {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    let mut quiet_since = None;
    let mut last = Quiesce {
        quiet: false,
        took: Duration::ZERO,
        unsettled: None,
        outstanding: None,
    };
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let subscriptions = sidecars.subscriptions().await;
        last.unsettled = form.unsettled(admin).await;
        last.outstanding = subscriptions
            .iter()
            .map(|s| {
                s.as_ref()
                    .map(|s| s.iter().map(|s| s.outstanding).sum::<u64>())
            })
            .sum();
        last.took = started.elapsed();
        if at_rest(last.unsettled, &subscriptions) {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                last.quiet = true;
                return last;
            }
        } else {
            quiet_since = None;
        }
    }
    last
}

/// One run: one form, one mode, one seed. Returns the number of anomalies.
async fn run(args: &Args, run: Run) -> usize {
    let Run {
        form,
        cluster,
        faults_for,
        ..
    } = run;
    println!(
        "== run: seed {}, {}, {}, {}, {faults_for:?} of faults{}",
        run.seed,
        form.name(),
        mode(run),
        topology(run),
        if form.can_order() {
            format!(", ordered workers: {:?}", run.ordered).to_lowercase()
        } else {
            String::new()
        }
    );
    let backend = start_backend(cluster).await;
    let url = backend.url();
    let admin = match &backend {
        Backend::Single(_) => window_sidecar_harness::connect(&url).await,
        Backend::Cluster(c) => c.client().await,
    };
    let redis = Arc::new(Mutex::new(backend));
    let retain = form == Form::Stream;
    if retain {
        // Both groups before the first publish: retention trims what every group of the
        // stream has acknowledged, and a group made later by the workers' first `open` would
        // find the entries the audit group acknowledged meanwhile gone.
        for group in [AUDIT_GROUP, form::GROUP] {
            let _: Result<(), _> = admin.xgroup_create(form::STREAM, group, "0", true).await;
        }
    }
    // The sidecars as a user of their own: the nemesis takes rights from it, never from the
    // campaign's clients.
    let sidecar_url = url_with_auth(&url, Some(refusal::SIDECAR_USER), refusal::SIDECAR_PASSWORD);
    let sidecars = Sidecars::start(&sidecar_url, args.sidecars, cluster, retain).await;
    let campaign = Campaign::start(args, run, &admin, &sidecars, &redis).await;

    tokio::time::sleep(faults_for).await;
    let ended = campaign.wind_down(form, &admin, &sidecars).await;
    let end = end_state(form, &admin, &ended).await;
    let promise = Promise {
        exactly_once: run.atomic && form.at_least_once(),
        max_deliveries: form.max_deliveries().unwrap_or(u32::MAX),
        at_most_once: !form.at_least_once(),
        by_payload: form != Form::Stream,
    };
    let (anomalies, figures) = history::check(&ended.history, &end, promise);
    report(run, &ended, &end, promise, &figures, &anomalies);
    let _ = admin.quit().await;
    drop(ended.campaign);
    drop(sidecars);
    anomalies.len()
}

fn mode(run: Run) -> &'static str {
    if run.atomic { "atomic" } else { "pipeline" }
}

fn topology(run: Run) -> &'static str {
    if run.cluster {
        "cluster"
    } else {
        "single node"
    }
}

/// A cluster of three primaries with a replica each, or one node that writes its AOF on every
/// command (a restart then loses nothing acknowledged); either with the sidecars' own user.
async fn start_backend(cluster: bool) -> Backend {
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

/// The tasks of a run under way: the workers, the producers, the nemesis and (under
/// retention) the audit group's reader, and what they record into.
struct Campaign {
    shared: Arc<Shared>,
    workers: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    workers_stop: Arc<AtomicBool>,
    /// Stops the producers.
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    nemesis_stop: Arc<AtomicBool>,
    nemesis: tokio::task::JoinHandle<()>,
    /// The numbers Redis certainly has.
    published: Arc<Mutex<BTreeSet<u64>>>,
    auditor: Option<tokio::task::JoinHandle<()>>,
    audit_drain: Arc<AtomicBool>,
    audited: Arc<Mutex<Vec<(String, Fields)>>>,
}

/// What a run left once it wound down: its history, what was published and audited, and the
/// sidecars' subscriptions at the end of the quiesce and once the workers stopped.
struct Ended {
    history: Vec<Stamped>,
    published: BTreeSet<u64>,
    audited: Vec<(String, Fields)>,
    retained_after_settling: Option<u64>,
    quiesce: Quiesce,
    at_quiet: Vec<Option<Vec<SubscriptionState>>>,
    after_stop: Vec<Option<Vec<SubscriptionState>>>,
    /// Fetches of parked entries the sidecars up at the quiesce made.
    parked_fetches: u64,
    /// What the sidecars up at the quiesce counted of refusals since they last started.
    refusals_counted: refusal::Counted,
    /// Dropped (with the sidecars it holds) once the run is reported.
    campaign: Campaign,
}

impl Campaign {
    async fn start(
        args: &Args,
        run: Run,
        admin: &Client,
        sidecars: &Arc<Sidecars>,
        redis: &Arc<Mutex<Backend>>,
    ) -> Campaign {
        let form = run.form;
        let log = Arc::new(Log {
            started: Instant::now(),
            events: Mutex::new(Vec::new()),
        });
        let audited = Arc::new(Mutex::new(Vec::new()));
        let audit_drain = Arc::new(AtomicBool::new(false));
        let auditor = (form == Form::Stream).then(|| {
            tokio::spawn(audit(
                admin.clone(),
                Arc::clone(&audit_drain),
                Arc::clone(&audited),
                Arc::clone(&log),
            ))
        });
        let workers_stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            run,
            sidecars: Arc::clone(sidecars),
            log,
            stop: Arc::clone(&workers_stop),
            settle: Arc::new(AtomicBool::new(false)),
            streams: AtomicU32::new(0),
            waits: Waits::default(),
        });
        // Pub/sub has one worker: every subscriber of a channel gets every message.
        let worker_count = if form == Form::Pubsub {
            1
        } else {
            args.workers
        };
        let spawn_worker = {
            let shared = Arc::clone(&shared);
            move |id: u32| tokio::spawn(work(id, Arc::clone(&shared)))
        };
        let workers = Arc::new(Mutex::new(
            (0..worker_count as u32)
                .map(&spawn_worker)
                .collect::<Vec<_>>(),
        ));
        // Producers and the nemesis stop first; the workers go on to settle what is left.
        let stop = Arc::new(AtomicBool::new(false));
        let numbers = Arc::new(AtomicU64::new(0));
        let published = Arc::new(Mutex::new(BTreeSet::new()));
        if form == Form::Pubsub {
            // Messages published before the worker listens reach nobody.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let producers: Vec<_> = (0..2)
            .map(|id| {
                tokio::spawn(produce(
                    id,
                    form,
                    args.rate,
                    Arc::clone(sidecars),
                    Arc::clone(&stop),
                    Arc::clone(&numbers),
                    Arc::clone(&published),
                ))
            })
            .collect();
        let nemesis_stop = Arc::new(AtomicBool::new(args.no_faults));
        let nemesis_shared = Arc::new(Shared {
            run,
            sidecars: Arc::clone(sidecars),
            log: Arc::clone(&shared.log),
            stop: Arc::clone(&nemesis_stop),
            settle: Arc::clone(&shared.settle),
            streams: AtomicU32::new(0),
            waits: Waits::default(),
        });
        let nemesis = tokio::spawn(nemesis(
            nemesis_shared,
            Arc::clone(redis),
            Arc::clone(&workers),
            spawn_worker.clone(),
        ));
        Campaign {
            shared,
            workers,
            workers_stop,
            stop,
            producers,
            nemesis_stop,
            nemesis,
            published,
            auditor,
            audit_drain,
            audited,
        }
    }

    /// Producers and the nemesis stop; the workers settle what is left until the run is quiet
    /// (then the audit group reads the rest), then stop, and their subscriptions close.
    async fn wind_down(mut self, form: Form, admin: &Client, sidecars: &Sidecars) -> Ended {
        self.stop.store(true, Ordering::Relaxed);
        self.nemesis_stop.store(true, Ordering::Relaxed);
        (&mut self.nemesis).await.expect("nemesis");
        for p in self.producers.drain(..) {
            p.await.expect("producer");
        }
        // Quiesce: everything still out is acked, until for 2 s Redis has nothing unsettled
        // and no sidecar holds a delivery without an outcome, an ack not yet flushed or a
        // flush. Redis alone is not enough: a simple list's popped entries exist only in their
        // sidecar until settled, and go back to the list when their worker leaves (a slow ack
        // when the quiesce began, a worker that left while its sidecar's blocking read was
        // under way).
        self.shared.log.push(Event::Settling);
        self.shared.settle.store(true, Ordering::Relaxed);
        let quiesce = quiesce(form, admin, sidecars).await;
        let at_quiet = sidecars.subscriptions().await;
        let metrics = sidecars.metrics().await;
        let parked_fetches = parked_fetches(&metrics);
        let mut refusals_counted = refusal::Counted::default();
        for body in &metrics {
            refusals_counted.add(body);
        }
        // The audit group reads the rest while the workers' subscriptions are still open: the
        // trim runs beside them.
        let mut retained_after_settling = None;
        if let Some(auditor) = self.auditor.take() {
            self.audit_drain.store(true, Ordering::Relaxed);
            if tokio::time::timeout(Duration::from_secs(60), auditor)
                .await
                .is_err()
            {
                println!("   the audit group did not catch up within 60 s");
            }
            retained_after_settling = retained(admin).await;
        }
        self.workers_stop.store(true, Ordering::Relaxed);
        for w in self.workers.lock().drain(..) {
            w.abort();
        }
        let after_stop = subscriptions_closed(sidecars).await;
        let history = std::mem::take(&mut *self.shared.log.events.lock());
        let published = std::mem::take(&mut *self.published.lock());
        let audited = std::mem::take(&mut *self.audited.lock());
        Ended {
            history,
            published,
            audited,
            retained_after_settling,
            quiesce,
            at_quiet,
            after_stop,
            parked_fetches,
            refusals_counted,
            campaign: self,
        }
    }
}

/// Fetches of entries parked for their ordering key, summed over the sidecars' `/metrics`:
/// that the campaign ran through parking at all.
fn parked_fetches(metrics: &[String]) -> u64 {
    const SERIES: &str = "window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"fetch\"} ";
    metrics
        .iter()
        .flat_map(|body| body.lines())
        .filter_map(|line| line.strip_prefix(SERIES)?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Waits (15 s at most) for the workers' subscriptions to close, so that what they still held
/// goes back before Redis is read; returns the sidecars' subscriptions then.
async fn subscriptions_closed(sidecars: &Sidecars) -> Vec<Option<Vec<SubscriptionState>>> {
    let closed_by = Instant::now() + Duration::from_secs(15);
    let mut after_stop = sidecars.subscriptions().await;
    while Instant::now() < closed_by
        && after_stop
            .iter()
            .any(|s| s.as_ref().is_none_or(|s| !s.is_empty()))
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after_stop = sidecars.subscriptions().await;
    }
    after_stop
}

/// What Redis holds at the end, with the retention measured; for forms known by payload, every
/// value delivered is a root too.
async fn end_state(form: Form, admin: &Client, ended: &Ended) -> EndState {
    let mut end = form
        .end_state(admin, &ended.published, &ended.audited)
        .await;
    end.retained_after_settling = ended.retained_after_settling;
    if form != Form::Stream {
        form::add_delivered_roots(
            &mut end,
            ended.history.iter().filter_map(|s| match &s.event {
                Event::Delivered { entry, .. } => Some(entry.clone()),
                _ => None,
            }),
        );
    }
    end
}

/// Prints the run's figures and each anomaly with the events around it; when entries were left
/// pending or the run never went quiet, every sidecar's subscriptions.
fn report(
    run: Run,
    ended: &Ended,
    end: &EndState,
    promise: Promise,
    figures: &history::Figures,
    anomalies: &[history::Anomaly],
) {
    println!(
        "   {} entries, {} deliveries, {} flush reports, decisions {:?}, dead letters {}, \
         redriven {} ({} back into their group), duplicate side effects {}, publishes written \
         twice {}{}",
        figures.roots,
        figures.deliveries,
        figures.flushes,
        figures.decisions,
        figures.dead_letters,
        figures.redriven,
        figures.redriven_in_place,
        figures.duplicate_effects,
        figures.duplicate_publishes,
        if promise.at_most_once {
            format!(
                ", lost in flight (at most once) {}",
                figures.lost_at_most_once
            )
        } else {
            String::new()
        }
    );
    if run.form == Form::Stream {
        let audit = &figures.audit;
        println!(
            "   audit group: {} entries in {} reads ({} again from its own pending before an ack \
             was confirmed, {} again after a failover), {} fresh entries written by redrives",
            audit.entries,
            audit.reads,
            audit.own_rereads,
            audit.after_failover,
            audit.redrive_copies
        );
    }
    if figures.ordered_streams > 0 {
        println!(
            "   per-key order checked on {} ordered subscription streams, {} deliveries",
            figures.ordered_streams, figures.ordered_deliveries
        );
    }
    if ended.parked_fetches > 0 {
        println!(
            "   fetches of entries parked for their ordering key (sidecars up at the quiesce): {}",
            ended.parked_fetches
        );
    }
    let waits = &ended.campaign.shared.waits;
    println!(
        "   reads handled late for waiting on their worker: {} ({} not right after a slow \
         read; the longest wait {} ms); right after a slow read but not late: {}",
        waits.late.load(Ordering::Relaxed),
        waits.further_back.load(Ordering::Relaxed),
        waits.longest_ms.load(Ordering::Relaxed),
        waits.prompt_after_slow.load(Ordering::Relaxed)
    );
    println!("   faults {:?}", figures.faults);
    report_refusals(ended, figures);
    println!("   quiesce: {}", ended.quiesce);
    for anomaly in anomalies {
        println!(
            "ANOMALY (seed {}, {}, {}, {}): {anomaly}",
            run.seed,
            run.form.name(),
            mode(run),
            topology(run)
        );
        if let Some(root) = &anomaly.root {
            for event in history::around(&ended.history, root, 2_000) {
                println!("     {:>7} ms  {:?}", event.at_ms, event.event);
            }
            let window = (form::MIN_IDLE + SLOW).as_millis() as u64;
            let before = history::workers_before(&ended.history, root, window);
            if !before.is_empty() {
                println!("     its workers before each delivery (read, slow acks):");
                for event in before {
                    println!("     {:>7} ms  {:?}", event.at_ms, event.event);
                }
            }
        }
    }
    // What held the entries still pending: every sidecar's subscriptions.
    if end.pending != 0 || !ended.quiesce.quiet {
        println!("   subscriptions open at the end of the quiesce:");
        for line in describe_subscriptions(&ended.at_quiet) {
            println!("     {line}");
        }
        println!("   subscriptions open once the workers stopped (15 s at most):");
        for line in describe_subscriptions(&ended.after_stop) {
            println!("     {line}");
        }
    }
}

/// The refusals the nemesis injected, by kind, with the flush reports they touched (received
/// from each one's start until a moment after its undo); the requeues refused by reason over
/// the run, from the reports; and what the sidecars up at the quiesce counted since they last
/// started (a killed sidecar's counters are gone with it).
fn report_refusals(ended: &Ended, figures: &history::Figures) {
    let injected: Vec<String> = figures
        .refusals
        .iter()
        .map(|(kind, touched)| format!("{kind} {touched}"))
        .collect();
    println!(
        "   refusals injected: {}",
        if injected.is_empty() {
            "none".to_owned()
        } else {
            injected.join("; ")
        }
    );
    let by_reason = |counts: Vec<(&String, u64)>| {
        if counts.is_empty() {
            return "none".to_owned();
        }
        counts
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "   requeues refused (entries, by reason, in the workers' flush reports): {}; acked \
         entries settled without their side effect (Redis refused it, reported): {}",
        by_reason(
            figures
                .requeue_refused
                .iter()
                .map(|(r, n)| (r, *n as u64))
                .collect()
        ),
        figures.effects_refused
    );
    let counted = &ended.refusals_counted;
    println!(
        "   the sidecars' counters at the quiesce (each since it last started): \
         window_sidecar_requeue_refused_total {}, window_sidecar_flushes_total{{result=\"failed\"}} {}",
        by_reason(
            counted
                .requeue_refused
                .iter()
                .map(|(r, n)| (r, *n))
                .collect()
        ),
        counted.flushes_failed
    );
}

/// The runs of a campaign: every form and mode, streams also on a cluster, or what the flags
/// pick.
fn plan(args: &Args, random: u64) -> Vec<Run> {
    let run = |seed, form, atomic, cluster, faults_for| Run {
        seed,
        form,
        atomic,
        cluster,
        faults_for,
        ordered: args.ordered,
    };
    if args.quick {
        let each = Duration::from_secs(25);
        let forms = [Form::ReliableList, Form::SimpleList, Form::Pubsub];
        return vec![
            run(1, Form::Stream, false, false, each),
            run(2, Form::Stream, true, false, each),
            run(3, Form::Stream, true, true, each),
            run(4, Form::ReliableList, false, false, each),
            run(
                random,
                forms[(random % 3) as usize],
                random % 2 == 1,
                false,
                each,
            ),
        ];
    }
    let modes: Vec<bool> = match args.mode.as_str() {
        "pipeline" => vec![false],
        "atomic" => vec![true],
        _ => vec![false, true],
    };
    let mut runs = Vec::new();
    let forms = match args.form {
        Some(form) => vec![form],
        None => vec![
            Form::Stream,
            Form::ReliableList,
            Form::SimpleList,
            Form::Pubsub,
        ],
    };
    for form in forms {
        for &atomic in &modes {
            let topologies: Vec<bool> = if args.cluster {
                vec![true]
            } else if args.form.is_none() && form == Form::Stream {
                vec![false, true]
            } else {
                vec![false]
            };
            for cluster in topologies {
                runs.push(run(random, form, atomic, cluster, Duration::ZERO));
            }
        }
    }
    let each = Duration::from_secs_f64(args.minutes * 60.0 / runs.len() as f64);
    for r in &mut runs {
        r.faults_for = each;
    }
    runs
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.cluster && args.form.is_some_and(|f| f != Form::Stream) {
        eprintln!("--cluster runs streams only");
        return std::process::ExitCode::from(2);
    }
    let random = args.seed.unwrap_or_else(|| rand::rng().random());
    let runs = plan(&args, random);
    println!(
        "window-sidecar chaos: seed {random}, {} runs, max_deliveries {MAX_DELIVERIES}",
        runs.len()
    );
    let mut failed = 0;
    for r in &runs {
        if run(&args, *r).await > 0 {
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
