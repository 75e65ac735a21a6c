//! The workers: each subscribes through some sidecar's proxy, logs what it receives, decides
//! each delivery at random (a slow ack sleeps past `min_idle`, taking what comes meanwhile),
//! sends each outcome with its queued side effect, and subscribes again when its stream ends;
//! once the run settles, it acks everything.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::{Subscription, command, outcome, retry_after};

use crate::form::{self, DISCARDED, KEPT};
use crate::history::{Decision, Event};
use crate::log::Log;
use crate::plan::Run;
use crate::refusal;
use crate::world::{Sidecars, client};

/// How long a slow ack handles its delivery: past `form::MIN_IDLE`, so that another consumer
/// may reclaim the entry meanwhile.
pub(crate) const SLOW: Duration = Duration::from_millis(4_500);

/// What a worker shares with the run (the nemesis gets one of its own, with its own `stop`).
pub(crate) struct Shared {
    pub(crate) run: Run,
    pub(crate) sidecars: Arc<Sidecars>,
    pub(crate) log: Arc<Log>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) settle: Arc<AtomicBool>,
    /// Numbers the workers' subscription streams across the run.
    pub(crate) streams: AtomicU32,
    pub(crate) waits: Waits,
}

/// Reads that waited for their worker past [`LATE_AFTER`].
#[derive(Default)]
pub(crate) struct Waits {
    pub(crate) late: AtomicU64,
    /// Of those, the ones that did not follow a slow read at once: there were more than two
    /// reads out.
    pub(crate) further_back: AtomicU64,
    pub(crate) longest_ms: AtomicU64,
    /// Reads right after a slow one that did not wait that long (they came as it ended).
    pub(crate) prompt_after_slow: AtomicU64,
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
pub(crate) async fn work(id: u32, shared: Arc<Shared>) {
    let Run { form, atomic, .. } = shared.run;
    let mut rng = StdRng::seed_from_u64(shared.run.seed.wrapping_add(u64::from(id) * 7919));
    let consumer = consumer(id);
    let ordered = form.ordered(shared.run.ordered, id);
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
        shared.log.push(Event::Ended { worker: id, stream });
    }
}

/// Worker `id`'s consumer name.
fn consumer(id: u32) -> String {
    format!("w{id}")
}

/// The worker whose consumer name this is.
pub(crate) fn of_consumer(name: &str) -> Option<u32> {
    name.strip_prefix('w')?.parse().ok()
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
        // A read that waited while the worker slept was logged as it came.
        let (came, message, heard) = match waiting.pop_front() {
            Some((came, message)) => (came, message, true),
            None => match sub.message_within(Duration::from_secs(5)).await {
                Some(Ok(Some(message))) => (Instant::now(), Some(message), false),
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
        if !heard {
            log_came(id, shared, (stream, ordered), &read);
        }
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
        let mut on_read = |read: &proto::Read| log_came(id, shared, (stream, ordered), read);
        let receiving = (
            &mut *sub,
            &mut waiting,
            &mut on_report as OnReport<'_>,
            &mut on_read as OnRead<'_>,
        );
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

/// Where a worker's reads go as they come (logged then: see [`log_came`]).
type OnRead<'a> = &'a mut (dyn FnMut(&proto::Read) + Send);

/// Sleeps `time`, taking each message off the stream as it comes meanwhile (as a client whose
/// handler runs beside its receiving does), so that how long a read then waits for its worker
/// is known. Flush reports, alone or in a read, go to `on_report` at once, and reads to
/// `on_read`.
async fn sleep_receiving(
    sub: &mut Subscription,
    time: Duration,
    waiting: &mut Waiting,
    (on_report, on_read): (OnReport<'_>, OnRead<'_>),
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
                on_read(read);
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

/// Logs a read on an ordered stream as it came, with its deliveries' keys: the order in which
/// the group's workers were handed a key's entries (a worker asleep on a slow ack handles what
/// came meanwhile later).
fn log_came(id: u32, shared: &Shared, (stream, ordered): (u32, bool), read: &proto::Read) {
    if !ordered {
        return;
    }
    let form = shared.run.form;
    let deliveries = read
        .deliveries
        .iter()
        .filter_map(|d| {
            let key = form.ordering_key(d)?;
            Some((form.identity(d), key, d.delivery_count))
        })
        .collect();
    shared.log.push(Event::Came {
        worker: id,
        stream,
        read_id: read.read_id,
        deliveries,
    });
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
    (sub, waiting, on_report, on_read): (&mut Subscription, &mut Waiting, OnReport<'_>, OnRead<'_>),
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
                    sleep_receiving(sub, SLOW, waiting, (&mut *on_report, &mut *on_read)).await;
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
