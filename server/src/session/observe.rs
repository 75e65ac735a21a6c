//! What operators see of a subscription: its admin view, its spans (one per read, one per
//! flush, linked to the producers' and the client's contexts), and the log lines that name
//! the entries a decision of Redis's concerns.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::global::{self, BoxedSpan};
use opentelemetry::trace::{Link, Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use serde::Serialize;
use tracing::warn;

use crate::domain::Entry;
use crate::engine::FlushResult;
use crate::telemetry::{TRACER, parse_traceparent};
use crate::window::{FlushBatch, Outcome, ReadId};

/// One subscription as the admin endpoint shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SubscriptionView {
    pub id: String,
    pub form: &'static str,
    pub key: String,
    pub group: String,
    pub consumer: String,
    pub mode: &'static str,
    pub count: u32,
    pub max_in_flight: u32,
    /// Seconds since the Unix epoch.
    pub opened_at: u64,
    /// Reads asked of Redis and not yet returned (0 or 1).
    pub reads_in_flight: u32,
    /// Reads with deliveries still outstanding.
    pub open_reads: usize,
    pub outstanding_deliveries: usize,
    /// Acked segments waiting for their read's flush.
    pub kept_segments: usize,
    /// Entries read and waiting for an earlier entry of their ordering key, or for room in
    /// the window after a read sized for a hot key.
    pub waiting_for_key: usize,
    pub flushes_in_flight: usize,
    pub draining: bool,
    pub counters: Counters,
    /// Set when the subscription reads one partition of a partitioned stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionView>,
}

/// The partition a subscription reads, and for which replica.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PartitionView {
    /// The partitioned stream, as its subscriptions name it.
    pub stream: String,
    pub partition: u32,
    pub partitions: u32,
    /// The replica reading it: the consumer name its client opened with.
    pub member: String,
    /// The client stream that holds it.
    pub subscription: String,
}

/// A partitioned stream's subscription as the admin endpoint shows it: the replica, the
/// partitions it reads, and the hand-overs under way in and out.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemberView {
    pub id: String,
    pub stream: String,
    pub group: String,
    /// This replica's name (its consumer name).
    pub member: String,
    pub partitions: u32,
    /// The live members at the last renewal, this one among them.
    pub members: Vec<String>,
    /// Partitions read now (each a subscription of its own in `subscriptions`).
    pub reading: Vec<u32>,
    /// Partitions that are this replica's and wait for their lease: a hand-over coming in.
    pub waiting: Vec<Waiting>,
    /// Partitions handed over and draining: a hand-over going out.
    pub leaving: Vec<u32>,
}

/// A partition waiting for its lease, and for how long so far.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Waiting {
    pub partition: u32,
    pub waiting_ms: u64,
}

/// A subscription's counters since it opened.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    pub reads: u64,
    pub deliveries: u64,
    pub redeliveries: u64,
    pub flushes: u64,
    pub failed_flushes: u64,
    pub rejections: u64,
    pub outcomes: BTreeMap<&'static str, u64>,
}

pub(super) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The producer's trace context an entry carries, if any.
pub(super) fn producer_context(entry: &Entry) -> Option<SpanContext> {
    let traceparent = std::str::from_utf8(entry.header("traceparent")?).ok()?;
    let tracestate = entry
        .header("tracestate")
        .and_then(|s| std::str::from_utf8(s).ok());
    parse_traceparent(traceparent, tracestate)
}

/// Attributes every span of a subscription carries.
pub(super) fn subscription_attributes(view: &SubscriptionView) -> Vec<KeyValue> {
    vec![
        KeyValue::new("window.form", view.form),
        KeyValue::new("window.subscription", view.key.clone()),
        KeyValue::new("window.group", view.group.clone()),
        KeyValue::new("window.consumer", view.consumer.clone()),
        KeyValue::new("window.mode", view.mode),
    ]
}

/// One link per span context, in the order of first appearance: the entries of one Publish
/// share its context, and a link repeated per entry says nothing more.
fn distinct_links(contexts: impl IntoIterator<Item = SpanContext>) -> Vec<Link> {
    let mut seen = HashSet::new();
    contexts
        .into_iter()
        .filter(|c| seen.insert((c.trace_id(), c.span_id())))
        .map(Link::with_context)
        .collect()
}

/// Records the span of one read: a new trace (so a trace exists even when producers sent no
/// context) linked once to each producer's context. Returns its context.
pub(super) fn read_span(
    view: &SubscriptionView,
    read_id: ReadId,
    entries: &[Arc<Entry>],
    redelivery: bool,
    started: SystemTime,
) -> SpanContext {
    let tracer = global::tracer(TRACER);
    let links = distinct_links(entries.iter().filter_map(|e| producer_context(e)));
    let mut attributes = subscription_attributes(view);
    attributes.extend([
        KeyValue::new("window.read_id", read_id as i64),
        KeyValue::new("window.deliveries", entries.len() as i64),
        KeyValue::new("window.redelivery", redelivery),
    ]);
    let span = tracer
        .span_builder("window.read")
        .with_kind(SpanKind::Consumer)
        .with_start_time(started)
        .with_links(links)
        .with_attributes(attributes)
        .start_with_context(&tracer, &Context::new());
    let context = span.span_context().clone();
    drop(span); // ends it now
    context
}

/// Starts the span of one flush: a child of its read's span, linked once to each producer's
/// context and to each of the client's own contexts of its settled deliveries.
pub(super) fn flush_span(
    view: &SubscriptionView,
    batch: &FlushBatch<Arc<Entry>>,
    read: Option<SpanContext>,
    client: Vec<SpanContext>,
    commands: usize,
) -> BoxedSpan {
    let tracer = global::tracer(TRACER);
    let producers = batch
        .settles
        .iter()
        .filter_map(|s| producer_context(&s.entry));
    let links = distinct_links(producers.chain(client));
    let count = |f: fn(&Outcome) -> bool| batch.count_outcome(f) as i64;
    let mut attributes = subscription_attributes(view);
    attributes.extend([
        KeyValue::new("window.read_id", batch.read_id as i64),
        KeyValue::new("window.deliveries", batch.deliveries as i64),
        KeyValue::new("window.segments.kept", batch.kept.len() as i64),
        KeyValue::new("window.segments.dropped", batch.dropped_segments() as i64),
        KeyValue::new("window.commands", commands as i64),
        KeyValue::new("window.settles", batch.settles.len() as i64),
        KeyValue::new("window.abandoned", batch.abandoned as i64),
        KeyValue::new("window.outcomes.ack", count(|o| *o == Outcome::Ack)),
        KeyValue::new("window.outcomes.drop", count(|o| *o == Outcome::Drop)),
        KeyValue::new("window.outcomes.retry", count(|o| *o == Outcome::Retry)),
        KeyValue::new(
            "window.outcomes.retry_after",
            count(|o| matches!(o, Outcome::RetryAfter(_))),
        ),
        KeyValue::new(
            "window.outcomes.dead_letter",
            count(|o| *o == Outcome::DeadLetter),
        ),
    ]);
    let parent = match read {
        Some(read) => Context::new().with_remote_span_context(read),
        None => Context::new(),
    };
    tracer
        .span_builder("window.flush")
        .with_kind(SpanKind::Client)
        .with_links(links)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent)
}

/// Ends a flush span with what Redis answered.
pub(super) fn end_flush_span(mut span: BoxedSpan, result: &FlushResult) {
    span.set_attribute(KeyValue::new("window.failed", result.failed as i64));
    span.set_attribute(KeyValue::new("window.settle_failed", result.settle_failed));
    if let Some(error) = &result.first_error {
        span.set_attribute(KeyValue::new("error.message", error.clone()));
        span.set_status(Status::error(error.clone()));
    }
    span.end();
}

/// Logs the due retries that a count of their next delivery found no longer this consumer's:
/// another consumer claimed them while this sidecar could not make them idle again (Redis out
/// of reach for `min_idle`). That consumer delivers them; their keys move on here.
pub(super) fn claimed_away(asked: &[Arc<Entry>], found: &[Option<Entry>]) {
    let gone: Vec<&[u8]> = asked
        .iter()
        .zip(found)
        .filter(|(_, found)| found.is_none())
        .map(|(entry, _)| &entry.id[..])
        .collect();
    if gone.is_empty() {
        return;
    }
    warn!(
        count = gone.len(),
        entries = %ids(gone.iter().copied()),
        "due retries claimed by another consumer: it delivers them, and their keys move on here"
    );
}

/// Stream entry ids, comma-separated (a list value has none: it is left out).
pub(super) fn ids<'a>(ids: impl Iterator<Item = &'a [u8]>) -> String {
    ids.filter(|id| !id.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(traceparent: &str) -> SpanContext {
        parse_traceparent(traceparent, None).unwrap()
    }

    #[test]
    fn a_context_is_linked_once_in_the_order_it_first_appears() {
        let a = context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let b = context("00-4bf92f3577b34da6a3ce929d0e0e4736-b9c7c989f97918e1-01");
        let c = context("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
        // The same ids with other flags are the same span.
        let a_unsampled = context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        let links = distinct_links([
            a.clone(),
            a.clone(),
            b.clone(),
            a_unsampled,
            c.clone(),
            b.clone(),
            a.clone(),
        ]);
        let ids: Vec<_> = links
            .iter()
            .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
            .collect();
        let expected: Vec<_> = [a, b, c]
            .iter()
            .map(|c| (c.trace_id(), c.span_id()))
            .collect();
        assert_eq!(ids, expected);
        assert!(distinct_links([]).is_empty());
    }
}
