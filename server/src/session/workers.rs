//! The tasks that do a subscription's I/O beside it: the reader (blocking reads on the
//! subscription's own connection), the flusher (flushes in order over the pool, those that
//! queued going together in one round trip), an ordered stream's read lane (its reads under a
//! backlog, in order on one connection) and the promoter of due retry_after entries.

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::future::Either;
use opentelemetry::global::BoxedSpan;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::observe;
use super::{FlushReport, Shared};
use crate::domain::{Mode, ReadBatch};
use crate::engine::FlushId;
use crate::metrics::{FlushLabels, FormLabels, ModeLabels, RefusalLabels, RoundTripLabels};
use crate::redis::flush::{self, FlushConnection, FlushPlan, RequeueRefused};
use crate::redis::form::{Form, Reader};
use crate::redis::stream;
use crate::redis::{Redis, RedisError};

/// A read the engine asked for.
pub(super) struct ReadRequest {
    pub count: u32,
    pub block: Duration,
    pub reread: bool,
    pub recover: bool,
}

/// Serves read requests on the subscription's dedicated connection, in order, until the
/// subscription drops its sender; then closes the connection.
pub(super) async fn read_loop(
    mut reader: Reader,
    mut requests: mpsc::Receiver<ReadRequest>,
    results: mpsc::Sender<Result<ReadBatch, RedisError>>,
) {
    while let Some(r) = requests.recv().await {
        let batch = reader.read(r.count, r.block, r.reread, r.recover).await;
        if results.send(batch).await.is_err() {
            break;
        }
    }
    reader.close().await;
}

/// A flush handed to the flusher.
pub(super) struct FlushJob {
    pub flush: FlushId,
    pub report: FlushReport,
    pub plan: FlushPlan,
    pub span: Option<BoxedSpan>,
}

/// A read the engine asked of an ordered stream's read lane (a plan of only a read).
pub(super) struct LaneRead {
    pub flush: FlushId,
    pub plan: FlushPlan,
}

/// What a read that rode at the end of a flush, or went on the read lane, read; `Err` with
/// whether no reply came.
pub(super) type ReadAhead = Result<ReadBatch, (RedisError, bool)>;

/// What the flusher tells its subscription.
pub(super) enum Flushed {
    /// A flush is done, with its report (boxed: a report is several times the size of the
    /// other messages) and what its read-ahead read.
    Report(FlushId, Box<FlushReport>, Option<ReadAhead>),
    /// A read on the read lane is done. `unknown`: no reply came; it stays able to run until
    /// [`Flushed::Settled`].
    Read(FlushId, ReadAhead, bool),
    /// A flush reported with an unknown outcome can no longer run (see
    /// [`FlushConnection::settle_unknown`]).
    Settled(FlushId),
}

/// How long a flush with an unknown outcome waits for its connection to come back, so that
/// nothing of it can still run after its entries are read again.
const UNKNOWN_FLUSH_BARRIER: Duration = Duration::from_secs(60);

/// The most queued flushes one pipeline carries (each at most a read's worth of segments).
const MAX_FLUSHES_PER_ROUND_TRIP: usize = 16;

/// Runs flushes one after another, in the order they were handed over (the order reads
/// completed). Flushes that queued while one was under way go together, in order, in the next
/// pipeline: one round trip for all of them, so a flusher that falls behind catches up rather
/// than queueing further. The queue is bounded by the in-flight limit: deliveries waiting for
/// their flush count against it.
pub(super) async fn flush_loop(
    redis: Redis,
    shared: Arc<Shared>,
    (form, subscription): (&'static str, String),
    mode: Mode,
    mut jobs: mpsc::UnboundedReceiver<FlushJob>,
    reports: mpsc::UnboundedSender<Flushed>,
) {
    let metrics = &shared.metrics;
    let labels = FormLabels { form };
    let duration = metrics
        .flush_duration
        .get_or_create(&ModeLabels {
            form,
            mode: mode.as_str(),
        })
        .clone();
    let round_trips = |kind| {
        metrics
            .round_trips
            .get_or_create(&RoundTripLabels { form, kind })
            .clone()
    };
    let flush_round_trips = round_trips("flush");
    let side_effect_failures = metrics
        .side_effect_failures
        .get_or_create(&ModeLabels {
            form,
            mode: mode.as_str(),
        })
        .clone();
    let skipped = metrics
        .settles_skipped
        .get_or_create(&FormLabels { form })
        .clone();
    let mut group = Vec::new();
    while jobs.recv_many(&mut group, MAX_FLUSHES_PER_ROUND_TRIP).await > 0 {
        let started = Instant::now();
        let connection = FlushConnection::next(&redis);
        let plans: Vec<&FlushPlan> = group.iter().map(|job| &job.plan).collect();
        let results = connection.execute(&redis, &plans).await;
        let elapsed = started.elapsed().as_secs_f64();
        flush_round_trips.inc();
        let mut unknown = Vec::new();
        for (job, (result, read_ahead)) in group.drain(..).zip(results) {
            let flush = job.flush;
            let read_ahead = read_ahead.map(stream::read_ahead_reply);
            let FlushJob {
                mut report, span, ..
            } = job;
            report.result = result;
            let exemplar = crate::metrics::exemplar::of_span(span.as_ref());
            duration.observe(elapsed, exemplar, None);
            let outcome = if report.result.ok() { "ok" } else { "failed" };
            metrics
                .flushes
                .get_or_create(&FlushLabels {
                    form,
                    mode: mode.as_str(),
                    result: outcome,
                })
                .inc();
            let dead_lettered = report
                .dead_lettered
                .saturating_sub(report.result.skipped_dead_letters);
            if report.result.ok() && dead_lettered > 0 {
                metrics
                    .scale
                    .dead_letters
                    .get_or_create(&labels)
                    .inc_by(dead_lettered as u64);
            }
            report_refusals(metrics, &subscription, &report.result.requeue_refused);
            if !report.result.side_effect_failures.is_empty() {
                side_effect_failures.inc_by(report.result.side_effect_failures.len() as u64);
            }
            if report.result.skipped > 0 {
                skipped.inc_by(report.result.skipped as u64);
                warn!(
                    entries = report.result.skipped,
                    "entries left to the consumer that claimed them: this one held them past min_idle without extending them (Redis out of reach?); not requeued or settled here"
                );
            }
            metrics
                .flush_commands
                .get_or_create(&labels)
                .observe(report.commands as f64);
            metrics
                .flush_settles
                .get_or_create(&labels)
                .observe(report.settles as f64);
            if let Some(span) = span {
                observe::end_flush_span(span, &report.result);
            }
            if report.result.unknown {
                unknown.push(flush);
            }
            let message = Flushed::Report(flush, Box::new(report), read_ahead);
            if reports.send(message).is_err() {
                return;
            }
        }
        if !unknown.is_empty() {
            // Their entries will be read again: first let what fred may still write of them
            // go. Beside the next flushes, which go on (and fail fast while Redis is away).
            let reports = reports.clone();
            tokio::spawn(async move {
                connection.settle_unknown(UNKNOWN_FLUSH_BARRIER).await;
                for flush in unknown {
                    let _ = reports.send(Flushed::Settled(flush));
                }
            });
        }
    }
}

/// Counts and logs the entries whose requeue write Redis refused: an operator's signal that
/// Redis is out of memory, an ACL lacks a write, or a key holds the wrong type, while the
/// entries wait pending for Redis to accept writes again.
fn report_refusals(
    metrics: &crate::metrics::Metrics,
    subscription: &str,
    refused: &[RequeueRefused],
) {
    for refusal in refused {
        let reason = flush::refusal_reason(&refusal.error);
        metrics
            .requeue_refused
            .get_or_create(&RefusalLabels {
                subscription: subscription.to_owned(),
                reason,
            })
            .inc();
    }
    if let Some(first) = refused.first() {
        warn!(
            subscription,
            entries = refused.len(),
            entry_id = %String::from_utf8_lossy(&first.entry_id),
            slot = first.slot,
            error = %first.error,
            "Redis refused to write a retry, delay or dead letter: the entries stay pending and are delivered again once Redis accepts writes"
        );
    }
}

/// Runs an ordered stream's reads under a backlog (plans of only a read), each sent as it
/// comes on the connection of the reads still out, and reports them in the order asked. One
/// connection runs its commands in the order they were written, so the reads take entries in
/// the order asked: what keeps a key's entries in order (see Ordering keys in design.md).
/// With none out, the next goes on the pool's next connection that is up. While Redis runs
/// one read, this task takes the last one's reply apart.
pub(super) async fn read_lane(
    redis: Redis,
    shared: Arc<Shared>,
    form: &'static str,
    mut jobs: mpsc::UnboundedReceiver<LaneRead>,
    reports: mpsc::UnboundedSender<Flushed>,
) {
    let round_trips = shared
        .metrics
        .round_trips
        .get_or_create(&RoundTripLabels { form, kind: "read" })
        .clone();
    // A lost read is settled on the connection it went on.
    let report = |(flush, read, connection): (FlushId, ReadAhead, FlushConnection)| {
        let lost = matches!(read, Err((_, true)));
        if lost {
            let reports = reports.clone();
            tokio::spawn(async move {
                connection.settle_unknown(UNKNOWN_FLUSH_BARRIER).await;
                let _ = reports.send(Flushed::Settled(flush));
            });
        }
        reports.send(Flushed::Read(flush, read, lost)).is_ok()
    };
    let read = |job: LaneRead, connection: &FlushConnection| {
        let (connection, redis) = (connection.clone(), &redis);
        round_trips.inc();
        async move {
            let mut results = connection.execute(redis, &[&job.plan]).await;
            let reply = results.pop().and_then(|(_, read)| read);
            let reply = reply.expect("a plan of only a read answers its read");
            (job.flush, stream::read_ahead_reply(reply), connection)
        }
    };
    let mut connection = FlushConnection::next(&redis);
    let mut out = futures::stream::FuturesOrdered::new();
    loop {
        tokio::select! {
            job = jobs.recv() => {
                let Some(job) = job else { break };
                if out.is_empty() {
                    // No read out to stay behind: the pool's next connection that is up.
                    connection = FlushConnection::next(&redis);
                }
                if !connection.is_connected() {
                    // Reads waiting for the connection to come back could then be written in
                    // either order: until it is, one at a time.
                    while let Some(done) = out.next().await {
                        if !report(done) {
                            return;
                        }
                    }
                    if !report(read(job, &connection).await) {
                        return;
                    }
                    continue;
                }
                // Polled once now, so that fred writes it behind the reads before it.
                let mut started = Box::pin(read(job, &connection));
                match futures::poll!(started.as_mut()) {
                    Poll::Ready(done) => out.push_back(Either::Left(std::future::ready(done))),
                    Poll::Pending => out.push_back(Either::Right(started)),
                }
            }
            Some(done) = out.next(), if !out.is_empty() => {
                if !report(done) {
                    return;
                }
            }
        }
    }
    // The subscription is gone; what it left out still runs, and is still settled if lost.
    while let Some(done) = out.next().await {
        report(done);
    }
}

/// Now, in Unix milliseconds (the unit of the delay set's scores).
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Moves due retry_after entries back, for as long as the subscription runs.
pub(super) async fn promote(redis: Redis, form: Form, every: Duration) {
    const LIMIT: u32 = 256;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            match form.promote_due(&redis, now_ms(), LIMIT).await {
                Ok(n) if n == u64::from(LIMIT) => continue,
                Ok(n) => {
                    if n > 0 {
                        debug!(promoted = n, "retry_after entries are due again");
                    }
                    break;
                }
                Err(err) => {
                    debug!(error = %err, "promoting delayed entries failed; will try again");
                    break;
                }
            }
        }
    }
}
