//! The soak: the real binary, loopback only, under a steady load of 54 subscriptions of
//! every form (42 stream consumers, 6 reliable-list and 4 simple-list consumers, a pub/sub
//! channel and a pattern) with their producers, for `--secs` seconds (default 150, or
//! `SOAK_SECS`; `--quick`: 20). Five of
//! the subscriptions close and reopen every 15 s. Every ~10 s it prints the sidecar's RSS,
//! threads and file descriptors, the Redis connection count (`CLIENT LIST`, `INFO clients`),
//! the subscriptions open and the deliveries per second.
//!
//! It checks, with generous bounds and never on timing:
//! * RSS at the end of the load is at most 1.5x (+ 8 MiB) what it was at the end of the first
//!   minute, and the sidecar's Redis connections then are the same (± the churning
//!   subscriptions) and never more than one per subscription plus the pool;
//! * once every subscription closed: the admin view is empty, the open-subscription gauges are
//!   0, no per-subscription series is left and the backlog gauges of the keys served read 0;
//!   the sidecar is back to the Redis connections, file descriptors and threads it had before
//!   the first subscription opened, and for 12 s sends Redis nothing but its health `PING` and
//!   the read-only sampling of the backlog and the work waiting (a reader or promoter task left
//!   running would);
//! * every produced entry was settled exactly once: acked (its side effects ran once, counted
//!   in Redis) or dropped (its side effects never ran); retried ones came back and were acked;
//!   nothing is pending, waiting in a list or a processing list, delayed, or left in the
//!   delivery-count bookkeeping; no flush failed, nothing was rejected.
//!
//! Each check prints a line (`ok: …` or `FAILED: …`), and the run ends with `N passed, N
//! failed`; it exits 1 when a check failed (a run that could not finish, a deadline passed or
//! a task panicked, is one failed check). The binary it runs is `WINDOW_SIDECAR_BIN`, or
//! `--sidecar-bin`, else the one `cargo build -p window-sidecar` makes.
//!
//! `cargo run --release -p window-sidecar-soak -- --quick` (CI), `cargo run --release -p
//! window-sidecar-soak` (the full 150 s), `-- --secs 600` for longer.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use fred::prelude::*;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::subscribe_response::Kind as Response;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::{
    Launch, RedisServer, SidecarProcess, Subscription, connect_within, duration, free_port,
    metric_sum, ok_body, pending, series, sidecar_bin,
};

/// Stream keys; two consumers (`c0`, `c1`) of group `g` each.
const STREAM_KEYS: usize = 21;
/// Reliable lists; two consumers each.
const RELIABLE_KEYS: usize = 3;
/// Simple lists; one consumer each.
const SIMPLE_KEYS: usize = 4;
/// Subscriptions in all (the 2 are pub/sub: a channel and a pattern).
const SUBSCRIPTIONS: usize = 2 * STREAM_KEYS + 2 * RELIABLE_KEYS + SIMPLE_KEYS + 2;
/// Subscriptions that close and reopen every `CHURN_EVERY` (3 streams, 1 reliable list, 1
/// simple list).
const CHURNERS: usize = 5;
const CHURN_EVERY: Duration = Duration::from_secs(15);
/// Producers write `PER_TICK` entries every `TICK` per key or channel: 8/s each, about 240/s in
/// all (plus the retried copies).
const TICK: Duration = Duration::from_millis(250);
const PER_TICK: usize = 2;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// BLOCK of every subscription: a closed subscription's read under way ends within it.
const BLOCK: Duration = Duration::from_secs(1);
/// Stream `min_idle`: entries a closing subscription's last read took after it closed are
/// claimed by the group after this.
const MIN_IDLE: Duration = Duration::from_secs(10);
const RETRY_AFTER: Duration = Duration::from_millis(300);
/// How long any poll may wait for a state it expects (never a timing assertion: a deadline
/// only turns a hang into a failure with the state printed).
const DEADLINE: Duration = Duration::from_secs(120);
/// How long the idle sidecar is watched for commands after every subscription closed: more
/// than two of its 5 s gauge samples, its promote and reclaim intervals and health checks.
const IDLE_LOOK: Duration = Duration::from_secs(12);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Form {
    Stream,
    Reliable,
    Simple,
    PubSub,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Stream => "stream",
            Form::Reliable => "reliable_list",
            Form::Simple => "simple_list",
            Form::PubSub => "pubsub",
        }
    }
}

/// A key (or pub/sub channel or pattern), its producer and what its consumers did.
struct Target {
    /// The key, channel or pattern subscribed to; also names the side-effect keys.
    name: String,
    form: Form,
    /// Where producers write: the key, or the channel (for a pattern, one it matches).
    produce_to: String,
    /// A stream whose producer uses the sidecar's `Publish` rather than `XADD`.
    via_publish: bool,
    tally: Tally,
}

impl Target {
    fn seen_key(&self) -> String {
        format!("soak:fx:{}:seen", self.name)
    }
    fn acked_key(&self) -> String {
        format!("soak:fx:{}:acked", self.name)
    }
    /// Incremented by the segments of dropped and retried deliveries: must never run.
    fn never_key(&self) -> String {
        format!("soak:fx:{}:never", self.name)
    }
}

#[derive(Default)]
struct Tally {
    produced: AtomicU64,
    delivered: AtomicU64,
    acks: AtomicU64,
    drops: AtomicU64,
    retries: AtomicU64,
    retry_afters: AtomicU64,
    /// Pub/sub messages the sidecar reported lost (`Read.lost`).
    lost: AtomicU64,
    /// Deliveries received after the client half-closed (left to the sidecar to abandon).
    abandoned: AtomicU64,
    failed_flushes: AtomicU64,
    rejections: AtomicU64,
    /// A token acked twice, or both acked and dropped.
    duplicates: AtomicU64,
    settled: Mutex<Settled>,
}

#[derive(Default)]
struct Settled {
    /// Tokens that got a drop, retry or retry_after once: acked when they come again.
    deferred: HashSet<String>,
    acked: HashSet<String>,
    dropped: HashSet<String>,
}

/// What all subscription tasks share.
#[derive(Default)]
struct Global {
    opened: AtomicU64,
    reopened: AtomicU64,
    already_exists: AtomicU64,
    /// Streams that ended or failed when the client did not ask for it.
    unexpected: AtomicU64,
}

struct Sub {
    label: String,
    target: Arc<Target>,
    open: proto::Open,
    /// When it first closes and reopens (then every `CHURN_EVERY`).
    churn: Option<Duration>,
}

fn open_request(source: proto::open::Source, mode: proto::Mode) -> proto::Open {
    proto::Open {
        source: Some(source),
        count: 16,
        max_in_flight: 32,
        block: Some(duration(BLOCK)),
        mode: mode as i32,
        ..Default::default()
    }
}

/// The targets and the subscriptions reading them.
fn plan() -> (Vec<Arc<Target>>, Vec<Sub>) {
    let mut plan = Plan::default();
    plan.streams();
    plan.reliable_lists();
    plan.simple_lists();
    plan.pubsub();
    let Plan { targets, subs } = plan;
    assert_eq!(subs.len(), SUBSCRIPTIONS);
    assert_eq!(subs.iter().filter(|s| s.churn.is_some()).count(), CHURNERS);
    (targets, subs)
}

/// The targets and subscriptions planned so far, a form at a time.
#[derive(Default)]
struct Plan {
    targets: Vec<Arc<Target>>,
    subs: Vec<Sub>,
}

impl Plan {
    fn target(
        &mut self,
        name: String,
        form: Form,
        produce_to: String,
        via_publish: bool,
    ) -> Arc<Target> {
        let target = Arc::new(Target {
            name,
            form,
            produce_to,
            via_publish,
            tally: Tally::default(),
        });
        self.targets.push(Arc::clone(&target));
        target
    }

    /// Two consumers per stream; every other stream's producer uses `Publish`, every fifth
    /// stream is read in atomic mode, and the first consumer of the first three churns.
    fn streams(&mut self) {
        for i in 0..STREAM_KEYS {
            let key = format!("soak:stream:{i}");
            let t = self.target(key.clone(), Form::Stream, key.clone(), i % 2 == 1);
            let mode = if i % 5 == 4 {
                proto::Mode::Atomic
            } else {
                proto::Mode::Pipeline
            };
            for c in 0..2 {
                let source = proto::open::Source::Stream(proto::StreamSource {
                    key: key.clone(),
                    group: "g".into(),
                    consumer: format!("c{c}"),
                    start_id: "0".into(),
                    min_idle: Some(duration(MIN_IDLE)),
                });
                self.subs.push(Sub {
                    label: format!("{key}/c{c}"),
                    target: Arc::clone(&t),
                    open: open_request(source, mode),
                    churn: (c == 0 && i < 3).then(|| Duration::from_secs(5 + 3 * i as u64)),
                });
            }
        }
    }

    /// Two consumers per reliable list; the first one of the first list churns.
    fn reliable_lists(&mut self) {
        for i in 0..RELIABLE_KEYS {
            let key = format!("soak:reliable:{i}");
            let t = self.target(key.clone(), Form::Reliable, key.clone(), false);
            for c in 0..2 {
                let source = proto::open::Source::ReliableList(proto::ReliableListSource {
                    key: key.clone(),
                    consumer: format!("c{c}"),
                    dead_after: None,
                });
                self.subs.push(Sub {
                    label: format!("{key}/c{c}"),
                    target: Arc::clone(&t),
                    open: open_request(source, proto::Mode::Pipeline),
                    churn: (c == 0 && i == 0).then(|| Duration::from_secs(7)),
                });
            }
        }
    }

    /// One consumer per simple list; the first list's churns.
    fn simple_lists(&mut self) {
        for i in 0..SIMPLE_KEYS {
            let key = format!("soak:simple:{i}");
            let t = self.target(key.clone(), Form::Simple, key.clone(), false);
            let source =
                proto::open::Source::SimpleList(proto::SimpleListSource { key: key.clone() });
            self.subs.push(Sub {
                label: key.clone(),
                target: t,
                open: open_request(source, proto::Mode::Pipeline),
                churn: (i == 0).then(|| Duration::from_secs(12)),
            });
        }
    }

    /// A channel and a pattern (produced to through a channel it matches); neither churns.
    fn pubsub(&mut self) {
        for (name, produce_to, pattern) in [
            ("soak:channel:0", "soak:channel:0", false),
            ("soak:pattern:*", "soak:pattern:x", true),
        ] {
            let t = self.target(name.into(), Form::PubSub, produce_to.into(), false);
            let (channels, patterns) = if pattern {
                (vec![], vec![name.to_owned()])
            } else {
                (vec![name.to_owned()], vec![])
            };
            let source = proto::open::Source::Pubsub(proto::PubSubSource {
                channels,
                patterns,
                ..Default::default()
            });
            self.subs.push(Sub {
                label: name.into(),
                target: t,
                open: open_request(source, proto::Mode::Pipeline),
                churn: None,
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The application: one task per subscription.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Choice {
    Ack,
    Drop,
    Retry,
    RetryAfter,
}

/// A delivery's first outcome, fixed by its token: 80 % ack, 8 % drop, 7 % retry, 5 %
/// retry_after. A token that was deferred once is acked when it comes again.
fn first_choice(token: &str) -> Choice {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in token.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    match h % 100 {
        0..80 => Choice::Ack,
        80..88 => Choice::Drop,
        88..95 => Choice::Retry,
        _ => Choice::RetryAfter,
    }
}

enum End {
    Stop,
    Churn,
    Unexpected,
}

/// Opens the subscription (on a connection of its own); retries while the sidecar still holds
/// the consumer name of the previous stream (`ALREADY_EXISTS`).
async fn open(addr: &str, sub: &Sub, global: &Global) -> Subscription {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut client = connect_within(addr, DEADLINE).await;
        let status = match Subscription::start(&mut client, Request::Open(sub.open.clone())).await {
            Ok(mut stream) => match stream.message_within(DEADLINE).await {
                Some(Ok(Some(proto::SubscribeResponse {
                    kind: Some(Response::Opened(_)),
                }))) => return stream,
                Some(Err(status)) => status,
                other => panic!("{}: expected `opened`, got {other:?}", sub.label),
            },
            Err(status) => status,
        };
        assert_eq!(
            status.code(),
            tonic::Code::AlreadyExists,
            "{}: open failed: {status}",
            sub.label
        );
        assert!(
            Instant::now() < deadline,
            "{}: the consumer name stayed busy: {status}",
            sub.label
        );
        global.already_exists.fetch_add(1, Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one subscription until told to stop: answers every read in one message, closes and
/// reopens now and then when it churns.
async fn subscription(
    addr: String,
    sub: Sub,
    global: Arc<Global>,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = true;
    let mut churn_at = sub.churn.map(|d| tokio::time::Instant::now() + d);
    loop {
        let mut stream = open(&addr, &sub, &global).await;
        if first {
            global.opened.fetch_add(1, Relaxed);
            first = false;
        } else {
            global.reopened.fetch_add(1, Relaxed);
        }
        let end = serve(&sub, &mut stream, &mut stop, churn_at).await;
        drop(stream);
        match end {
            End::Stop => return,
            End::Churn => {
                churn_at = Some(tokio::time::Instant::now() + CHURN_EVERY);
                // Let the closed subscription's read under way (at most BLOCK) end before the
                // same consumer name reads again: a reliable list's entry that read moves after
                // the reopen would wait on the processing list until this consumer reopens
                // again or dies (a new subscription reads its processing list once, at open).
                tokio::select! {
                    () = tokio::time::sleep(3 * BLOCK) => {}
                    () = stopped(&mut stop) => return,
                }
            }
            End::Unexpected => {
                global.unexpected.fetch_add(1, Relaxed);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stopped(&mut stop) => return,
                }
            }
        }
    }
}

async fn serve(
    sub: &Sub,
    stream: &mut Subscription,
    stop: &mut watch::Receiver<bool>,
    churn_at: Option<tokio::time::Instant>,
) -> End {
    let churn = async {
        match churn_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(churn);
    loop {
        tokio::select! {
            // Cancel-safe: the decoder's state lives in the stream.
            message = stream.message_within(DEADLINE) => match message {
                None => {} // quiet: look again
                Some(Ok(Some(message))) => {
                    let Some((batch, sent)) = handle(sub, message, true) else { continue };
                    if !stream.try_send_kind(Request::Batch(batch)).await {
                        eprintln!("{}: the sidecar stopped reading the request stream", sub.label);
                        return End::Unexpected;
                    }
                    sent.commit(&sub.target.tally);
                }
                Some(Ok(None)) => {
                    eprintln!("{}: the stream ended unasked", sub.label);
                    return End::Unexpected;
                }
                Some(Err(status)) => {
                    eprintln!("{}: the stream failed: {status}", sub.label);
                    return End::Unexpected;
                }
            },
            () = stopped(stop) => {
                return if close(sub, stream).await { End::Stop } else { End::Unexpected };
            }
            () = &mut churn => {
                return if close(sub, stream).await { End::Churn } else { End::Unexpected };
            }
        }
    }
}

/// Half-closes the request stream and reads what is left (flush reports of what was settled)
/// until the sidecar ends the stream. Returns whether it ended cleanly.
async fn close(sub: &Sub, stream: &mut Subscription) -> bool {
    stream.close();
    let deadline = Instant::now() + DEADLINE;
    loop {
        match stream
            .message_within(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            Some(Ok(Some(message))) => {
                handle(sub, message, false);
            }
            Some(Ok(None)) => return true,
            Some(Err(status)) => {
                eprintln!("{}: closing, the stream failed: {status}", sub.label);
                return false;
            }
            None => {
                eprintln!("{}: the stream did not end after the half-close", sub.label);
                return false;
            }
        }
    }
}

/// What a batch will record once it was sent.
#[derive(Default)]
struct Pending {
    acked: Vec<String>,
    dropped: Vec<String>,
    retries: u64,
    retry_afters: u64,
}

impl Pending {
    fn commit(self, tally: &Tally) {
        tally.acks.fetch_add(self.acked.len() as u64, Relaxed);
        tally.drops.fetch_add(self.dropped.len() as u64, Relaxed);
        tally.retries.fetch_add(self.retries, Relaxed);
        tally.retry_afters.fetch_add(self.retry_afters, Relaxed);
        let mut settled = tally.settled.lock().expect("not poisoned");
        let mut duplicates = 0;
        for token in self.acked {
            if settled.dropped.contains(&token) || !settled.acked.insert(token) {
                duplicates += 1;
            }
        }
        for token in self.dropped {
            if settled.acked.contains(&token) || !settled.dropped.insert(token) {
                duplicates += 1;
            }
        }
        tally.duplicates.fetch_add(duplicates, Relaxed);
    }
}

/// Accounts for one message; for a read (when `answer`), the batch answering all of it.
fn handle(
    sub: &Sub,
    message: proto::SubscribeResponse,
    answer: bool,
) -> Option<(proto::Batch, Pending)> {
    let tally = &sub.target.tally;
    match message.kind {
        Some(Response::Read(read)) => {
            tally.lost.fetch_add(read.lost, Relaxed);
            tally
                .delivered
                .fetch_add(read.deliveries.len() as u64, Relaxed);
            if !answer {
                tally
                    .abandoned
                    .fetch_add(read.deliveries.len() as u64, Relaxed);
                return None;
            }
            Some(answer_read(sub, &read))
        }
        Some(Response::Flush(report)) => {
            if !report.ok {
                tally.failed_flushes.fetch_add(1, Relaxed);
                eprintln!("{}: flush failed: {report:?}", sub.label);
            }
            None
        }
        Some(Response::Rejections(rejections)) => {
            tally
                .rejections
                .fetch_add(rejections.rejections.len() as u64, Relaxed);
            eprintln!("{}: rejected: {rejections:?}", sub.label);
            None
        }
        other => {
            eprintln!("{}: unexpected message {other:?}", sub.label);
            None
        }
    }
}

/// The batch answering every delivery of a read, each with its choice: a token deferred once
/// is acked when it comes again.
fn answer_read(sub: &Sub, read: &proto::Read) -> (proto::Batch, Pending) {
    let target = &sub.target;
    let mut batch = proto::Batch::default();
    let mut pending = Pending::default();
    let mut settled = target.tally.settled.lock().expect("not poisoned");
    for d in &read.deliveries {
        let token = String::from_utf8_lossy(&d.payload).into_owned();
        assert!(
            token.starts_with(&target.produce_to),
            "{}: a delivery that is not one of ours: {d:?}",
            sub.label
        );
        let choice = if settled.deferred.contains(&token) {
            Choice::Ack
        } else {
            let choice = first_choice(&token);
            if choice != Choice::Ack {
                settled.deferred.insert(token.clone());
            }
            choice
        };
        answer(target, d.slot, token, choice, &mut batch, &mut pending);
    }
    (batch, pending)
}

/// Adds one delivery's outcome and side effects to the batch: an ack's run once, counted; a
/// drop's or retry's segment increments the key that must never change.
fn answer(
    target: &Target,
    slot: u64,
    token: String,
    choice: Choice,
    batch: &mut proto::Batch,
    pending: &mut Pending,
) {
    let command = |name: &str, args: Vec<String>| proto::QueuedCommand {
        slot,
        name: name.into(),
        args: args.into_iter().map(Into::into).collect(),
    };
    let (kind, delay) = match choice {
        Choice::Ack => {
            batch
                .commands
                .push(command("SADD", vec![target.seen_key(), token.clone()]));
            batch
                .commands
                .push(command("INCR", vec![target.acked_key()]));
            pending.acked.push(token);
            (OutcomeKind::Ack, None)
        }
        other => {
            batch
                .commands
                .push(command("INCR", vec![target.never_key()]));
            match other {
                Choice::Drop => {
                    pending.dropped.push(token);
                    (OutcomeKind::Drop, None)
                }
                Choice::Retry => {
                    pending.retries += 1;
                    (OutcomeKind::Retry, None)
                }
                _ => {
                    pending.retry_afters += 1;
                    (OutcomeKind::RetryAfter, Some(duration(RETRY_AFTER)))
                }
            }
        }
    };
    batch.outcomes.push(proto::Outcome {
        slot,
        kind: kind as i32,
        delay,
        ..Default::default()
    });
}

// ---------------------------------------------------------------------------------------------
// Producers: one task per key or channel.
// ---------------------------------------------------------------------------------------------

async fn producer(
    target: Arc<Target>,
    redis: Client,
    addr: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut publish = if target.via_publish {
        Some(connect_within(&addr, DEADLINE).await)
    } else {
        None
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => return,
        }
        let tokens: Vec<String> = (0..PER_TICK)
            .map(|_| {
                n += 1;
                format!("{}#{n}", target.produce_to)
            })
            .collect();
        match (target.form, publish.as_mut()) {
            (Form::Stream, Some(client)) => {
                let ids = client
                    .publish(proto::PublishRequest {
                        stream: target.produce_to.clone(),
                        entries: tokens
                            .iter()
                            .map(|t| proto::PublishEntry {
                                payload: t.clone().into(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .await
                    .expect("Publish")
                    .into_inner()
                    .ids;
                assert_eq!(ids.len(), tokens.len());
            }
            (Form::Stream, None) => {
                for token in &tokens {
                    let _: Value = redis
                        .custom(
                            fred::cmd!("XADD"),
                            vec![target.produce_to.as_str(), "*", "_payload", token.as_str()],
                        )
                        .await
                        .expect("XADD");
                }
            }
            (Form::Reliable | Form::Simple, _) => {
                let mut args = vec![target.produce_to.clone()];
                args.extend(tokens.iter().cloned());
                let _: Value = redis
                    .custom(fred::cmd!("LPUSH"), args)
                    .await
                    .expect("LPUSH");
            }
            (Form::PubSub, _) => {
                for token in &tokens {
                    let heard: i64 = redis
                        .custom(
                            fred::cmd!("PUBLISH"),
                            vec![target.produce_to.as_str(), token.as_str()],
                        )
                        .await
                        .expect("PUBLISH");
                    assert_eq!(heard, 1, "{token}: the sidecar's subscriber is listening");
                }
            }
        }
        target
            .tally
            .produced
            .fetch_add(tokens.len() as u64, Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Observation: /proc, CLIENT LIST, /metrics and /subscriptions.
// ---------------------------------------------------------------------------------------------

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

/// (all connections, the sidecar's) from `CLIENT LIST`.
async fn client_list(inspect: &Client) -> (usize, usize) {
    let list: String = inspect
        .custom(fred::cmd!("CLIENT"), vec!["LIST"])
        .await
        .expect("CLIENT LIST");
    let lines: Vec<&str> = list.lines().filter(|l| !l.trim().is_empty()).collect();
    let unnamed = lines
        .iter()
        .filter(|l| l.split_whitespace().any(|field| field == "name="))
        .count();
    (lines.len(), unnamed)
}

async fn info_field(inspect: &Client, section: fred::types::InfoKind, field: &str) -> u64 {
    let info: String = inspect.info(Some(section)).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO"))
}

fn admin_view_len(json: &str) -> usize {
    let view: serde_json::Value = serde_json::from_str(json).expect("JSON from /subscriptions");
    view["subscriptions"]
        .as_array()
        .expect("a `subscriptions` array")
        .len()
}

/// The sidecar's own figures at rest (before any subscription, after all closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rest {
    redis_connections: usize,
    fds: usize,
    threads: u64,
}

async fn at_rest(sidecar: &SidecarProcess, inspect: &Client) -> Rest {
    Rest {
        redis_connections: client_list(inspect).await.1,
        fds: sidecar.open_fds(),
        threads: sidecar.thread_count(),
    }
}

/// Waits until three looks 300 ms apart agree (the pool connects in the background).
async fn settled_rest(sidecar: &SidecarProcess, inspect: &Client) -> Rest {
    let deadline = Instant::now() + DEADLINE;
    let mut last = at_rest(sidecar, inspect).await;
    let mut same = 0;
    while same < 3 {
        assert!(
            Instant::now() < deadline,
            "the idle sidecar never settled: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = at_rest(sidecar, inspect).await;
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

struct Sample {
    t: f64,
    rss_kib: u64,
    threads: u64,
    fds: usize,
    client_list: usize,
    sidecar_connections: usize,
    connected_clients: u64,
    admin_view: usize,
    open_gauge: f64,
    deliveries: f64,
    rate: f64,
    produced: u64,
}

async fn sample(
    started: Instant,
    previous: Option<&Sample>,
    sidecar: &SidecarProcess,
    inspect: &Client,
    metrics_addr: &str,
    targets: &[Arc<Target>],
) -> Sample {
    let t = started.elapsed().as_secs_f64();
    let metrics = ok_body(metrics_addr, "/metrics").await;
    let view = ok_body(metrics_addr, "/subscriptions").await;
    let (client_list, sidecar_connections) = client_list(inspect).await;
    let deliveries = metric_sum(&metrics, "window_sidecar_deliveries_total", "");
    let rate = match previous {
        Some(p) if t > p.t => (deliveries - p.deliveries) / (t - p.t),
        _ => 0.0,
    };
    Sample {
        t,
        rss_kib: sidecar.rss_kib(),
        threads: sidecar.thread_count(),
        fds: sidecar.open_fds(),
        client_list,
        sidecar_connections,
        connected_clients: info_field(inspect, fred::types::InfoKind::Clients, "connected_clients")
            .await,
        admin_view: admin_view_len(&view),
        open_gauge: metric_sum(&metrics, "window_sidecar_subscriptions_open", ""),
        deliveries,
        rate,
        produced: targets.iter().map(|t| t.tally.produced.load(Relaxed)).sum(),
    }
}

fn print_header() {
    println!(
        "{:>6} {:>9} {:>7} {:>5} {:>11} {:>12} {:>13} {:>10} {:>10} {:>9}",
        "t(s)",
        "rss(KiB)",
        "threads",
        "fds",
        "redis conns",
        "sidecar→redis",
        "subs view/gauge",
        "deliveries",
        "deliv/s",
        "produced"
    );
}

fn print_sample(s: &Sample) {
    println!(
        "{:>6.0} {:>9} {:>7} {:>5} {:>5}/{:<5} {:>12} {:>8}/{:<6} {:>10.0} {:>10.1} {:>9}",
        s.t,
        s.rss_kib,
        s.threads,
        s.fds,
        s.client_list,
        s.connected_clients,
        s.sidecar_connections,
        s.admin_view,
        s.open_gauge,
        s.deliveries,
        s.rate,
        s.produced
    );
}

// ---------------------------------------------------------------------------------------------
// Redis state: has everything produced been settled?
// ---------------------------------------------------------------------------------------------

/// What Redis and the clients say about one target.
#[derive(Debug)]
struct State {
    produced: u64,
    acked: usize,
    dropped: usize,
    lost: u64,
    seen_in_redis: u64,
    /// Pending in the group (streams) or left in the list (lists).
    waiting: u64,
}

impl State {
    fn settled(&self) -> bool {
        self.acked as u64 + self.dropped as u64 + self.lost == self.produced
            && self.seen_in_redis == self.acked as u64
            && self.waiting == 0
    }
}

async fn state(inspect: &Client, target: &Target) -> State {
    let (acked, dropped) = {
        let s = target.tally.settled.lock().expect("not poisoned");
        (s.acked.len(), s.dropped.len())
    };
    let seen_in_redis: u64 = inspect.scard(target.seen_key()).await.expect("SCARD");
    let waiting = match target.form {
        Form::Stream => pending(inspect, &target.name, "g").await,
        Form::Reliable | Form::Simple => inspect.llen(&target.name).await.expect("LLEN"),
        Form::PubSub => 0,
    };
    State {
        produced: target.tally.produced.load(Relaxed),
        acked,
        dropped,
        lost: target.tally.lost.load(Relaxed),
        seen_in_redis,
        waiting,
    }
}

/// Calls per command since the last `CONFIG RESETSTAT`, without the commands this test's
/// inspecting client sends itself (`INFO`, `CONFIG`, `CLIENT`).
async fn commands_run(inspect: &Client) -> BTreeMap<String, u64> {
    let info: String = inspect
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (command, rest) = l.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((command.to_owned(), calls))
        })
        .filter(|(command, _)| {
            // Redis 7 names subcommands `config|resetstat`.
            let name = command.split('|').next().unwrap_or_default();
            !["info", "config", "client"].contains(&name)
        })
        .collect()
}

/// The sidecar's bookkeeping keys (`…:window:…`) that still hold something.
async fn window_keys(inspect: &Client) -> BTreeMap<String, u64> {
    let keys: Vec<String> = inspect
        .custom(fred::cmd!("KEYS"), vec!["*window:*"])
        .await
        .expect("KEYS");
    let mut sizes = BTreeMap::new();
    for key in keys {
        let kind: String = inspect
            .custom(fred::cmd!("TYPE"), vec![key.as_str()])
            .await
            .expect("TYPE");
        let size: u64 = match kind.as_str() {
            "zset" => inspect.zcard(&key).await.expect("ZCARD"),
            "list" => inspect.llen(&key).await.expect("LLEN"),
            "hash" => inspect.hlen(&key).await.expect("HLEN"),
            _ => continue, // heartbeats (strings) and the consumer sets
        };
        sizes.insert(format!("{key} ({kind})"), size);
    }
    sizes
}

// ---------------------------------------------------------------------------------------------
// The soak.
// ---------------------------------------------------------------------------------------------

/// The soak's length; everything else is the same in every configuration.
#[derive(Parser, Debug)]
#[command(
    about = "Fifty-four subscriptions for minutes against the real binary: nothing leaks, every entry settles once."
)]
struct Args {
    /// Seconds of load.
    #[arg(
        long,
        env = "SOAK_SECS",
        default_value_t = 150,
        conflicts_with = "quick"
    )]
    secs: u64,
    /// The short configuration for CI: 20 s of load (under a minute in all).
    #[arg(long)]
    quick: bool,
    /// The sidecar binary (default: `WINDOW_SIDECAR_BIN`, else built by cargo).
    #[arg(long)]
    sidecar_bin: Option<PathBuf>,
}

/// The load of `--quick`: long enough for every churning subscription to close and reopen once
/// and for two samples to compare.
const QUICK_SECS: u64 = 20;

/// What the soak checked: each check prints a line as it is made.
#[derive(Default)]
struct Checks {
    passed: AtomicU64,
    failed: AtomicU64,
}

impl Checks {
    fn check(&self, ok: bool, what: &str, detail: impl FnOnce() -> String) {
        if ok {
            self.passed.fetch_add(1, Relaxed);
            println!("ok: {what}");
        } else {
            self.failed.fetch_add(1, Relaxed);
            println!("FAILED: {what}: {}", detail());
        }
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let secs = if args.quick { QUICK_SECS } else { args.secs };
    let bin = args.sidecar_bin.unwrap_or_else(|| sidecar_bin().to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let checks = Arc::new(Checks::default());
    let soak = soak(Duration::from_secs(secs), bin, Arc::clone(&checks));
    let run = runtime.block_on(async { tokio::spawn(soak).await });
    // A deadline that passed or a task that panicked: the run could not finish.
    checks.check(run.is_ok(), "the soak ran to its end", || {
        "it stopped early (the panic above says why)".into()
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    let (passed, failed) = (checks.passed.load(Relaxed), checks.failed.load(Relaxed));
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

async fn soak(soak: Duration, bin: PathBuf, checks: Arc<Checks>) {
    let wall = Instant::now();
    print_plan(soak);
    let rig = Rig::start(&bin).await;
    let mut load = Load::open(&rig).await;
    let (samples, load_secs) = load.run(&rig, soak).await;
    let phases = load.drain(&rig, load_secs).await;
    let rest = AfterRest::observe(&rig).await;
    report(&rig, &load, &samples, soak, &phases, &rest, wall).await;
    check_under_load(&checks, &rig, &samples, soak);
    check_at_rest(&checks, &rig, &rest);
    check_clients(&checks, &rig, &load).await;
    println!("soak done in {:.0} s", wall.elapsed().as_secs_f64());
    drop(rig);
}

fn print_plan(soak: Duration) {
    println!(
        "soak: {} s of load, {SUBSCRIPTIONS} subscriptions ({CHURNERS} reopening every {} s), {} entries/s produced, samples every {} s",
        soak.as_secs(),
        CHURN_EVERY.as_secs(),
        (STREAM_KEYS + RELIABLE_KEYS + SIMPLE_KEYS + 2) * PER_TICK * 1000
            / TICK.as_millis() as usize,
        SAMPLE_EVERY.as_secs()
    );
}

/// Redis, the sidecar and the soak's own clients, with the sidecar's figures before the first
/// subscription opened. Fields drop in order: the sidecar goes before the Redis it talks to.
struct Rig {
    sidecar: SidecarProcess,
    listen: String,
    metrics_addr: String,
    /// At rest before any subscription.
    baseline: Rest,
    baseline_rss: u64,
    producers_redis: Client,
    /// Named so that `CLIENT LIST` tells the test's connections from the sidecar's.
    inspect: Client,
    _redis: RedisServer,
}

impl Rig {
    /// Starts Redis and the sidecar, and waits until the idle sidecar's figures settle.
    async fn start(bin: &std::path::Path) -> Rig {
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

/// The subscriptions and producers under way, and what they share.
struct Load {
    targets: Vec<Arc<Target>>,
    global: Arc<Global>,
    stop_subs: watch::Sender<bool>,
    sub_tasks: Vec<JoinHandle<()>>,
    stop_producers: watch::Sender<bool>,
    producer_tasks: Vec<JoinHandle<()>>,
}

/// How long each phase after the load took.
struct Phases {
    load_secs: f64,
    settle_secs: f64,
    close_secs: f64,
}

impl Load {
    /// Opens every subscription, then starts the producers (pub/sub hears only what is
    /// published after it subscribed).
    async fn open(rig: &Rig) -> Load {
        let (targets, subs) = plan();
        let global = Arc::new(Global::default());
        let (stop_subs, stop_rx) = watch::channel(false);
        let mut sub_tasks: Vec<JoinHandle<()>> = subs
            .into_iter()
            .map(|sub| {
                tokio::spawn(subscription(
                    rig.listen.clone(),
                    sub,
                    Arc::clone(&global),
                    stop_rx.clone(),
                ))
            })
            .collect();
        let deadline = Instant::now() + DEADLINE;
        while global.opened.load(Relaxed) < SUBSCRIPTIONS as u64 {
            fail_fast(&mut sub_tasks).await;
            assert!(
                Instant::now() < deadline,
                "only {} of {SUBSCRIPTIONS} subscriptions opened",
                global.opened.load(Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (stop_producers, producers_rx) = watch::channel(false);
        let producer_tasks: Vec<JoinHandle<()>> = targets
            .iter()
            .map(|t| {
                tokio::spawn(producer(
                    Arc::clone(t),
                    rig.producers_redis.clone(),
                    rig.listen.clone(),
                    producers_rx.clone(),
                ))
            })
            .collect();
        Load {
            targets,
            global,
            stop_subs,
            sub_tasks,
            stop_producers,
            producer_tasks,
        }
    }

    /// The load for `soak`, sampled every `SAMPLE_EVERY` (and once at its end); a subscription
    /// task's panic ends it early.
    async fn run(&mut self, rig: &Rig, soak: Duration) -> (Vec<Sample>, f64) {
        let started = Instant::now();
        let mut samples: Vec<Sample> = Vec::new();
        print_header();
        loop {
            let s = sample(
                started,
                samples.last(),
                &rig.sidecar,
                &rig.inspect,
                &rig.metrics_addr,
                &self.targets,
            )
            .await;
            print_sample(&s);
            samples.push(s);
            let elapsed = started.elapsed();
            if elapsed >= soak {
                break;
            }
            let next = (SAMPLE_EVERY * samples.len() as u32).min(soak);
            let wake = Instant::now() + next.saturating_sub(elapsed);
            while Instant::now() < wake {
                fail_fast(&mut self.sub_tasks).await;
                tokio::time::sleep(
                    wake.saturating_duration_since(Instant::now())
                        .min(Duration::from_secs(1)),
                )
                .await;
            }
        }
        (samples, started.elapsed().as_secs_f64())
    }

    /// Producers stop; the clients go on until everything produced is settled; then every
    /// subscription closes (half-close, then the stream ends).
    async fn drain(&mut self, rig: &Rig, load_secs: f64) -> Phases {
        self.stop_producers.send(true).expect("producers listen");
        for task in self.producer_tasks.drain(..) {
            task.await.expect("a producer");
        }
        let quiet = Instant::now();
        wait_until_settled(&rig.inspect, &self.targets, &mut self.sub_tasks).await;
        let settle_secs = quiet.elapsed().as_secs_f64();

        let closing = Instant::now();
        self.stop_subs.send(true).expect("subscriptions listen");
        for task in self.sub_tasks.drain(..) {
            task.await.expect("a subscription task");
        }
        Phases {
            load_secs,
            settle_secs,
            close_secs: closing.elapsed().as_secs_f64(),
        }
    }
}

/// The sidecar once every subscription closed: what the metrics and admin view still show,
/// its connections, fds and threads, and what it sends to Redis.
struct AfterRest {
    leftover: Vec<String>,
    rest: Rest,
    idle_commands: BTreeMap<String, u64>,
    rss: u64,
}

impl AfterRest {
    /// Waits (up to `DEADLINE`) for the admin view and gauges to empty and for the sidecar to
    /// be back to its baseline, then watches the commands it sends for `IDLE_LOOK`.
    async fn observe(rig: &Rig) -> AfterRest {
        let deadline = Instant::now() + DEADLINE;
        let leftover = loop {
            let leftover = leftovers(&rig.metrics_addr).await;
            if leftover.is_empty() || Instant::now() >= deadline {
                break leftover;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let deadline = Instant::now() + DEADLINE;
        let rest = loop {
            let now = at_rest(&rig.sidecar, &rig.inspect).await;
            if now == rig.baseline || Instant::now() >= deadline {
                break now;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        // A task left running (a reader or promoter) would go on sending commands: with no
        // subscription open, the sidecar only pings and samples the backlog.
        let _: Value = rig
            .inspect
            .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
            .await
            .expect("CONFIG RESETSTAT");
        tokio::time::sleep(IDLE_LOOK).await;
        let idle_commands = commands_run(&rig.inspect).await;
        AfterRest {
            leftover,
            rest,
            idle_commands,
            rss: rig.sidecar.rss_kib(),
        }
    }
}

/// The sample the end of the load is compared with: the end of the first minute (of the first
/// half, for a soak shorter than 2 minutes).
fn reference(samples: &[Sample], soak: Duration) -> &Sample {
    let reference_at = 60f64.min(soak.as_secs_f64() / 2.0);
    samples
        .iter()
        .find(|s| s.t + 0.5 >= reference_at)
        .expect("a sample after the first minute")
}

/// Prints the run's figures: phases, memory, connections, fds and threads, the idle commands,
/// the subscriptions' ends, the sidecar's counters, the clients' tallies and its warnings.
async fn report(
    rig: &Rig,
    load: &Load,
    samples: &[Sample],
    soak: Duration,
    phases: &Phases,
    after: &AfterRest,
    wall: Instant,
) {
    let (baseline, baseline_rss) = (&rig.baseline, rig.baseline_rss);
    let reference = reference(samples, soak);
    let last = samples.last().expect("samples");
    println!();
    println!(
        "load {:.0} s; settled {:.1} s after the producers stopped; all closed in {:.1} s; wall {:.0} s",
        phases.load_secs,
        phases.settle_secs,
        phases.close_secs,
        wall.elapsed().as_secs_f64()
    );
    println!(
        "RSS KiB: before {baseline_rss}, at {:.0} s (reference) {}, at {:.0} s (last) {} ({:+.1} %), after closing {}; peak {}",
        reference.t,
        reference.rss_kib,
        last.t,
        last.rss_kib,
        (last.rss_kib as f64 / reference.rss_kib as f64 - 1.0) * 100.0,
        after.rss,
        samples.iter().map(|s| s.rss_kib).max().unwrap_or(0)
    );
    println!(
        "sidecar connections to Redis: before {}, reference {}, last {}, max {}, after closing {}",
        baseline.redis_connections,
        reference.sidecar_connections,
        last.sidecar_connections,
        samples
            .iter()
            .map(|s| s.sidecar_connections)
            .max()
            .unwrap_or(0),
        after.rest.redis_connections
    );
    println!(
        "fds: before {}, reference {}, last {}, after closing {}; threads: before {}, last {}, after closing {}",
        baseline.fds,
        reference.fds,
        last.fds,
        after.rest.fds,
        baseline.threads,
        last.threads,
        after.rest.threads
    );
    println!(
        "Redis commands in {} s with no subscription open (ours excluded): {:?}",
        IDLE_LOOK.as_secs(),
        after.idle_commands
    );
    let global = &load.global;
    println!(
        "subscriptions: {} opened, {} reopened, {} ALREADY_EXISTS retries, {} unexpected ends",
        global.opened.load(Relaxed),
        global.reopened.load(Relaxed),
        global.already_exists.load(Relaxed),
        global.unexpected.load(Relaxed)
    );
    print_counters(&ok_body(&rig.metrics_addr, "/metrics").await);
    print_tallies(&load.targets);
    let warnings: Vec<String> = rig
        .sidecar
        .logged_lines()
        .into_iter()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    println!("sidecar warnings and errors: {}", warnings.len());
    for line in warnings.iter().take(20) {
        println!("  {line}");
    }
}

/// Stable under load: memory and Redis connections from the first minute to the last, and
/// never more connections than the pool and one per subscription.
fn check_under_load(checks: &Checks, rig: &Rig, samples: &[Sample], soak: Duration) {
    let reference = reference(samples, soak);
    let last = samples.last().expect("samples");
    checks.check(
        last.rss_kib <= reference.rss_kib * 3 / 2 + 8 * 1024,
        "RSS at the end of the load at most 1.5x (+ 8 MiB) the reference",
        || {
            format!(
                "RSS grew from {} KiB at {:.0} s to {} KiB at {:.0} s",
                reference.rss_kib, reference.t, last.rss_kib, last.t
            )
        },
    );
    checks.check(
        last.sidecar_connections
            .abs_diff(reference.sidecar_connections)
            <= CHURNERS,
        "the sidecar's Redis connections at the end of the load as at the reference (± the churners)",
        || {
            format!(
                "the sidecar's Redis connections went from {} at {:.0} s to {} at {:.0} s",
                reference.sidecar_connections, reference.t, last.sidecar_connections, last.t
            )
        },
    );
    let most = rig.baseline.redis_connections + SUBSCRIPTIONS;
    let too_many: Vec<String> = samples
        .iter()
        .filter(|s| s.sidecar_connections > most)
        .map(|s| format!("{} at {:.0} s", s.sidecar_connections, s.t))
        .collect();
    checks.check(
        too_many.is_empty(),
        "never more sidecar connections to Redis than the pool and one per subscription",
        || format!("sidecar connections to Redis: {too_many:?}, more than {most}"),
    );
}

/// Nothing left once every subscription closed: no series, gauge or view entry, the sidecar
/// back to its connections, fds and threads, and sending Redis only read-only samples.
fn check_at_rest(checks: &Checks, rig: &Rig, after: &AfterRest) {
    let (baseline, rest) = (&rig.baseline, &after.rest);
    let leftover = &after.leftover;
    checks.check(
        leftover.is_empty(),
        "no subscription series, gauge or admin view entry left after every subscription closed",
        || format!("left after every subscription closed: {leftover:#?}"),
    );
    checks.check(
        rest.redis_connections == baseline.redis_connections,
        "the sidecar's Redis connections after every subscription closed as before the first opened",
        || format!("{} after vs {} before", rest.redis_connections, baseline.redis_connections),
    );
    checks.check(
        rest.fds == baseline.fds,
        "the sidecar's file descriptors after every subscription closed as before the first opened",
        || {
            format!(
                "{} after vs {} before; now: {:#?}",
                rest.fds,
                baseline.fds,
                rig.sidecar.fd_targets()
            )
        },
    );
    // Tokio's blocking threads (startup's file and DNS work) retire after 10 s idle, so the
    // baseline may hold some that are gone by the end: a leak is more threads, not fewer.
    checks.check(
        rest.threads <= baseline.threads,
        "the sidecar's threads after every subscription closed at most as before the first opened",
        || format!("{} after vs {} before", rest.threads, baseline.threads),
    );
    // At rest the sidecar pings and samples the backlog and the work waiting of the keys it
    // served, read only: no read, claim, write or script.
    let read_only = [
        "ping",
        "xinfo|groups",
        "llen",
        "smembers",
        "zcard",
        "zcount",
        "xlen",
        "xrange",
        "xpending",
    ];
    let idle_commands = &after.idle_commands;
    checks.check(
        idle_commands
            .keys()
            .all(|c| read_only.contains(&c.as_str())),
        "with no subscription open the sidecar sends only pings and backlog samples",
        || {
            format!(
                "commands the sidecar sent in {} s with no subscription open: {idle_commands:?}",
                IDLE_LOOK.as_secs()
            )
        },
    );
}

/// The clients saw no failure, and every entry was settled exactly once.
async fn check_clients(checks: &Checks, rig: &Rig, load: &Load) {
    let unexpected = load.global.unexpected.load(Relaxed);
    checks.check(unexpected == 0, "no stream ended unasked", || {
        format!("{unexpected} streams ended unasked (see stderr)")
    });
    check_every_entry(&rig.inspect, &load.targets, checks).await;
}

/// Waits until every entry produced has been acked or dropped, its side effects are in Redis
/// and nothing is pending or waiting in a list (clients keep answering meanwhile).
async fn wait_until_settled(
    inspect: &Client,
    targets: &[Arc<Target>],
    sub_tasks: &mut [JoinHandle<()>],
) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        fail_fast(sub_tasks).await;
        let mut open = Vec::new();
        for target in targets {
            let s = state(inspect, target).await;
            if !s.settled() {
                open.push((target.name.clone(), s));
            }
        }
        if open.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not everything produced was settled {} s after the producers stopped: {open:#?}\nsidecar bookkeeping: {:#?}",
            DEADLINE.as_secs(),
            window_keys(inspect).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the metrics and the admin view still show of subscriptions (one look).
async fn leftovers(metrics_addr: &str) -> Vec<String> {
    let metrics = ok_body(metrics_addr, "/metrics").await;
    let view = ok_body(metrics_addr, "/subscriptions").await;
    // A subscription's own series go with it.
    let mut leftover: Vec<String> = series(&metrics, "window_sidecar_outstanding_deliveries")
        .into_iter()
        .map(|(labels, v)| format!("window_sidecar_outstanding_deliveries{{{labels}}} {v}"))
        .collect();
    // The backlog gauges stay for every key served (an alert must see a backlog nobody
    // consumes): with everything settled, each reads 0.
    leftover.extend(
        [
            "window_sidecar_group_pending_entries",
            "window_sidecar_group_lag_entries",
            "window_sidecar_list_entries",
            "window_sidecar_list_processing_entries",
            "window_sidecar_delay_set_entries",
        ]
        .iter()
        .flat_map(|name| {
            let all = series(&metrics, name);
            // One series per key served at most: they do not grow with subscriptions opened.
            let too_many = (all.len() > SUBSCRIPTIONS)
                .then(|| format!("{} series of {name} for {SUBSCRIPTIONS} keys", all.len()));
            all.into_iter()
                .filter(|(_, v)| *v != 0.0)
                .map(move |(labels, v)| format!("{name}{{{labels}}} {v}, not 0"))
                .chain(too_many)
        }),
    );
    let open = metric_sum(&metrics, "window_sidecar_subscriptions_open", "");
    if open != 0.0 {
        leftover.push(format!("window_sidecar_subscriptions_open sums to {open}"));
    }
    let views = admin_view_len(&view);
    if views != 0 {
        leftover.push(format!("/subscriptions lists {views}: {view}"));
    }
    leftover
}

/// Every entry produced was acked (its side effects ran once) or dropped (they never ran),
/// with no failed flush, rejection or double settle; nothing is left pending, in a list, in a
/// processing list or delay set, or in the delivery-count bookkeeping.
async fn check_every_entry(inspect: &Client, targets: &[Arc<Target>], checks: &Checks) {
    let mut breaches = Breaches::default();
    for t in targets {
        breaches.of_clients(t);
        breaches.in_redis(inspect, t).await;
    }
    breaches.check(checks);
    let bookkeeping: BTreeMap<String, u64> = window_keys(inspect)
        .await
        .into_iter()
        .filter(|(_, size)| *size > 0)
        .collect();
    checks.check(
        bookkeeping.is_empty(),
        "no delay set, processing list or delivery count left",
        || format!("{bookkeeping:#?}"),
    );
}

/// For each property of every entry settled exactly once, the targets that break it.
#[derive(Default)]
struct Breaches {
    failed_flushes: Vec<String>,
    rejections: Vec<String>,
    duplicates: Vec<String>,
    unsettled: Vec<String>,
    incr_vs_acks: Vec<String>,
    never_ran: Vec<String>,
    missing_entries: Vec<String>,
    xpending: Vec<String>,
}

impl Breaches {
    /// What the target's clients saw: failed flushes, rejections, tokens settled twice, and
    /// tokens produced that were neither acked nor dropped.
    fn of_clients(&mut self, t: &Target) {
        let tally = &t.tally;
        let flushes = tally.failed_flushes.load(Relaxed);
        if flushes != 0 {
            self.failed_flushes
                .push(format!("{}: {flushes} failed flushes", t.name));
        }
        let rejected = tally.rejections.load(Relaxed);
        if rejected != 0 {
            self.rejections
                .push(format!("{}: {rejected} rejections", t.name));
        }
        let twice = tally.duplicates.load(Relaxed);
        if twice != 0 {
            self.duplicates
                .push(format!("{}: {twice} settled twice", t.name));
        }
        let missing: Vec<String> = {
            let settled = tally.settled.lock().expect("not poisoned");
            (1..=tally.produced.load(Relaxed))
                .map(|n| format!("{}#{n}", t.produce_to))
                .filter(|token| !settled.acked.contains(token) && !settled.dropped.contains(token))
                .collect()
        };
        // Pub/sub is at most once: what the sidecar reported lost is all that may be missing.
        let may_miss = if t.form == Form::PubSub {
            tally.lost.load(Relaxed)
        } else {
            0
        };
        if missing.len() as u64 != may_miss {
            self.missing_entries.push(format!(
                "{}: {} produced and neither acked nor dropped (may miss {may_miss}): {:?}",
                t.name,
                missing.len(),
                &missing[..missing.len().min(10)]
            ));
        }
    }

    /// What Redis holds of the target: every entry settled and seen once, the acked side
    /// effects once per ack, no dropped or retried one run, nothing pending in the group.
    async fn in_redis(&mut self, inspect: &Client, t: &Target) {
        let s = state(inspect, t).await;
        if !s.settled() {
            self.unsettled.push(format!("{}: {s:?}", t.name));
        }
        let acked_counter: Option<u64> = inspect.get(t.acked_key()).await.expect("GET");
        let acks = t.tally.acks.load(Relaxed);
        if acked_counter.unwrap_or(0) != acks {
            self.incr_vs_acks.push(format!(
                "{}: the INCR side effects {acked_counter:?} vs the acks sent {acks}",
                t.name
            ));
        }
        let never: Option<u64> = inspect.get(t.never_key()).await.expect("GET");
        if never.is_some() {
            self.never_ran.push(format!(
                "{}: a dropped or retried segment ran: {never:?}",
                t.name
            ));
        }
        if t.form == Form::Stream {
            let left = pending(inspect, &t.name, "g").await;
            if left != 0 {
                self.xpending.push(format!("{}: XPENDING {left}", t.name));
            }
        }
    }

    /// One check per property, in this order.
    fn check(self, checks: &Checks) {
        for (broken, what) in [
            (self.failed_flushes, "no flush failed"),
            (self.rejections, "nothing was rejected"),
            (self.duplicates, "no entry was settled twice"),
            (
                self.unsettled,
                "every entry produced is settled, seen once in Redis, none waiting",
            ),
            (
                self.incr_vs_acks,
                "the acked side effects ran once per ack sent",
            ),
            (
                self.never_ran,
                "no dropped or retried delivery's side effects ran",
            ),
            (
                self.missing_entries,
                "every entry produced was acked or dropped (pub/sub: or reported lost)",
            ),
            (self.xpending, "nothing is pending in any stream's group"),
        ] {
            checks.check(broken.is_empty(), what, || format!("{broken:#?}"));
        }
    }
}

fn print_counters(metrics: &str) {
    let flushes = |result: &str| -> f64 {
        metric_sum(
            metrics,
            "window_sidecar_flushes_total",
            &format!("result=\"{result}\""),
        )
    };
    println!(
        "sidecar counters: {:.0} reads, {:.0} deliveries ({:.0} redeliveries, {:.0} reclaimed), {:.0} flushes ok, {:.0} failed, {:.0} rejections, {:.0} published",
        metric_sum(metrics, "window_sidecar_reads_total", ""),
        metric_sum(metrics, "window_sidecar_deliveries_total", ""),
        metric_sum(metrics, "window_sidecar_redeliveries_total", ""),
        metric_sum(metrics, "window_sidecar_reclaimed_entries_total", ""),
        flushes("ok"),
        flushes("failed"),
        metric_sum(metrics, "window_sidecar_rejections_total", ""),
        metric_sum(metrics, "window_sidecar_published_entries_total", ""),
    );
}

/// The clients' tallies, by form.
fn print_tallies(targets: &[Arc<Target>]) {
    const COLUMNS: [&str; 11] = [
        "form",
        "produced",
        "delivered",
        "acked",
        "dropped",
        "retried",
        "retry_after",
        "lost",
        "abandoned",
        "failed",
        "dups",
    ];
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(COLUMNS)
            .enumerate()
            .map(|(i, (cell, column))| {
                let width = if i == 0 { 14 } else { column.len().max(9) };
                format!("{cell:>width$}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("{}", line(COLUMNS.iter().map(|c| c.to_string()).collect()));
    let mut by_form: BTreeMap<Form, [u64; 10]> = BTreeMap::new();
    for t in targets {
        let tally = &t.tally;
        let row = by_form.entry(t.form).or_default();
        for (cell, v) in row.iter_mut().zip([
            tally.produced.load(Relaxed),
            tally.delivered.load(Relaxed),
            tally.acks.load(Relaxed),
            tally.drops.load(Relaxed),
            tally.retries.load(Relaxed),
            tally.retry_afters.load(Relaxed),
            tally.lost.load(Relaxed),
            tally.abandoned.load(Relaxed),
            tally.failed_flushes.load(Relaxed),
            tally.duplicates.load(Relaxed),
        ]) {
            *cell += v;
        }
    }
    for (form, row) in by_form {
        let mut cells = vec![form.name().to_owned()];
        cells.extend(row.iter().map(u64::to_string));
        println!("{}", line(cells));
    }
}

/// Resolves once the stop flag is set (the watch guard is not held across an await).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Surfaces a subscription task's panic now rather than when the soak ends.
async fn fail_fast(tasks: &mut [JoinHandle<()>]) {
    for task in tasks.iter_mut() {
        if task.is_finished() {
            // It only returns when told to stop: it panicked.
            task.await.expect("a subscription task");
            panic!("a subscription task ended before it was told to stop");
        }
    }
}
