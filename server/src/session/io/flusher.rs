//! The flusher: a subscription's flushes, in the order reads completed, over the pool; the
//! flushes that queued while one was under way go together in one pipeline. It records each
//! flush's figures and log line, and hands back what its plan held and what Redis answered.

use std::sync::Arc;

use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::Span;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{Flushed, UNKNOWN_FLUSH_BARRIER};
use crate::domain::Mode;
use crate::engine::{FlushId, FlushResult, PlanCounts, RequeueRefused};
use crate::metrics::{FlushLabels, FormLabels, ModeLabels, RefusalLabels, RoundTripLabels};
use crate::redis::Redis;
use crate::redis::flush::{self, FlushConnection, FlushPlan};
use crate::redis::stream;
use crate::session::observe;
use crate::session::shared::Shared;
use crate::telemetry::LogIds;
use crate::window::ReadId;

/// A flush handed to the flusher.
pub(in crate::session) struct FlushJob {
    pub flush: FlushId,
    /// The read it settles (0 for dead letters unread) and its kept segments, for its log line.
    pub read_id: ReadId,
    pub segments_kept: usize,
    pub plan: FlushPlan,
    pub span: Option<BoxedSpan>,
}

/// The most queued flushes one pipeline carries (each at most a read's worth of segments).
const MAX_FLUSHES_PER_ROUND_TRIP: usize = 16;

/// Runs flushes one after another, in the order they were handed over (the order reads
/// completed). Flushes that queued while one was under way go together, in order, in the next
/// pipeline: one round trip for all of them, so a flusher that falls behind catches up rather
/// than queueing further. The queue is bounded by the in-flight limit: deliveries waiting for
/// their flush count against it.
pub(in crate::session) async fn flush_loop(
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
            let read_ahead = read_ahead.map(stream::read_ahead_reply);
            let counts = PlanCounts {
                commands: job.plan.side_effects,
                settles: job.plan.settles,
                dead_lettered: job.plan.dead_lettered,
            };
            log(&job, &counts, &result);
            let FlushJob { flush, span, .. } = job;
            let exemplar = crate::metrics::exemplar::of_span(span.as_ref());
            duration.observe(elapsed, exemplar, None);
            let outcome = if result.ok() { "ok" } else { "failed" };
            metrics
                .flushes
                .get_or_create(&FlushLabels {
                    form,
                    mode: mode.as_str(),
                    result: outcome,
                })
                .inc();
            let dead_lettered = counts
                .dead_lettered
                .saturating_sub(result.skipped_dead_letters);
            if result.ok() && dead_lettered > 0 {
                metrics
                    .scale
                    .dead_letters
                    .get_or_create(&labels)
                    .inc_by(dead_lettered as u64);
            }
            report_refusals(metrics, &subscription, &result.requeue_refused);
            if !result.side_effect_failures.is_empty() {
                side_effect_failures.inc_by(result.side_effect_failures.len() as u64);
            }
            if result.skipped > 0 {
                skipped.inc_by(result.skipped as u64);
                warn!(
                    entries = result.skipped,
                    retries = observe::ids(result.left_to_others.iter().map(|id| &id[..])),
                    "entries left to the consumer that claimed them: this one held them past min_idle without extending them (Redis out of reach?); not requeued or settled here"
                );
            }
            metrics
                .flush_commands
                .get_or_create(&labels)
                .observe(counts.commands as f64);
            metrics
                .flush_settles
                .get_or_create(&labels)
                .observe(counts.settles as f64);
            if let Some(span) = span {
                observe::end_flush_span(span, &result);
            }
            if result.unknown {
                unknown.push(flush);
            }
            let message = Flushed::Report(flush, Box::new((counts, result)), read_ahead);
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

/// A flush's log line, with the ids of its span if it has one: `flushed` at debug, `flush
/// failed` at warn with what failed.
fn log(job: &FlushJob, counts: &PlanCounts, result: &FlushResult) {
    let context = job.span.as_ref().map(|span| span.span_context().clone());
    let ids = LogIds::of(context.as_ref());
    let (trace_id, span_id) = (ids.trace_id.as_deref(), ids.span_id.as_deref());
    debug!(
        trace_id,
        span_id,
        read_id = job.read_id,
        kept = job.segments_kept,
        settles = counts.settles,
        ok = result.ok(),
        "flushed"
    );
    if result.ok() {
        return;
    }
    // Pipeline mode settles an entry whose side effect Redis refused: the report says so, but
    // a client that is leaving may never read it, so the log names them too.
    let effects_refused = observe::ids(
        result
            .side_effect_failures
            .iter()
            .filter(|failure| failure.settled)
            .map(|failure| &failure.entry_id[..]),
    );
    warn!(
        trace_id,
        span_id,
        read_id = job.read_id,
        commands = counts.commands,
        settles = counts.settles,
        failed = result.failed,
        settle_failed = result.settle_failed,
        outcome_unknown = result.unknown,
        error = result.first_error.as_deref().unwrap_or(""),
        effects_refused,
        "flush failed"
    );
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
