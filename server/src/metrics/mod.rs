//! The sidecar's Prometheus metrics: one registry, typed families, text exposition. Names and
//! units follow Prometheus conventions (`_total` counters, `_seconds` durations).
//!
//! Round trips per read is `window_sidecar_redis_round_trips_total /
//! window_sidecar_reads_total`; a read-ahead (a read at the end of a flush's pipeline) is a
//! read without a round trip of its own.

pub(crate) mod exemplar;
mod labels;
pub(crate) mod scale;

pub(crate) use labels::{
    FlushLabels, FormLabels, GroupLabels, KeyLabels, ModeLabels, OutcomeLabels, ReasonLabels,
    RefusalLabels, RoundTripLabels, SubscriptionLabels,
};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// 10 ms to about three minutes: a hand-over waits for a drain or a lease's lifetime.
fn handover_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

fn size_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// Every metric the sidecar exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub subscriptions_open: Family<FormLabels, Gauge>,
    pub reads: Family<FormLabels, Counter>,
    pub read_aheads: Family<FormLabels, Counter>,
    pub deliveries: Family<FormLabels, Counter>,
    pub redeliveries: Family<FormLabels, Counter>,
    pub reclaimed: Family<FormLabels, Counter>,
    pub settles_skipped: Family<FormLabels, Counter>,
    pub requeue_refused: Family<RefusalLabels, Counter>,
    pub side_effect_failures: Family<ModeLabels, Counter>,
    pub outcomes: Family<OutcomeLabels, Counter>,
    pub rejections: Family<ReasonLabels, Counter>,
    pub flushes: Family<FlushLabels, Counter>,
    pub flush_commands: Family<FormLabels, Histogram, fn() -> Histogram>,
    pub flush_settles: Family<FormLabels, Histogram, fn() -> Histogram>,
    pub flush_duration: Family<ModeLabels, LatencyWithExemplars, fn() -> LatencyWithExemplars>,
    pub round_trips: Family<RoundTripLabels, Counter>,
    pub outstanding: Family<SubscriptionLabels, Gauge>,
    pub waiting_for_key: Family<SubscriptionLabels, Gauge>,
    pub delay_set_entries: Family<KeyLabels, Gauge>,
    pub group_pending: Family<GroupLabels, Gauge>,
    /// Partitions of a partitioned stream this sidecar reads now, and those it waits for (a
    /// hand-over in: the previous owner draining, or its lease running out).
    pub partitions_read: Family<GroupLabels, Gauge>,
    pub partitions_waiting: Family<GroupLabels, Gauge>,
    pub partition_handover: Family<GroupLabels, Histogram, fn() -> Histogram>,
    pub group_lag: Family<GroupLabels, Gauge>,
    pub list_entries: Family<KeyLabels, Gauge>,
    pub list_processing: Family<KeyLabels, Gauge>,
    pub published: Counter,
    pub retention_trimmed: Family<KeyLabels, Counter>,
    pub retention_blocked: Family<GroupLabels, Gauge>,
    pub retention_failures: Family<KeyLabels, Counter>,
    /// Work waiting, keeper and alerting series ([`scale`]).
    pub scale: scale::ScaleMetrics,
    pub read_duration: Family<FormLabels, LatencyWithExemplars, fn() -> LatencyWithExemplars>,
}

/// A latency histogram whose buckets keep the trace id of their last observation.
pub(crate) type LatencyWithExemplars =
    prometheus_client::metrics::exemplar::HistogramWithExemplars<exemplar::TraceLabels>;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        // window_sidecar_…, so that no series collides with another exporter's window_… in a
        // shared Prometheus.
        let mut registry = Registry::with_prefix("window_sidecar");
        let m = Self {
            subscriptions_open: Family::default(),
            reads: Family::default(),
            read_aheads: Family::default(),
            deliveries: Family::default(),
            redeliveries: Family::default(),
            reclaimed: Family::default(),
            settles_skipped: Family::default(),
            requeue_refused: Family::default(),
            side_effect_failures: Family::default(),
            outcomes: Family::default(),
            rejections: Family::default(),
            flushes: Family::default(),
            flush_commands: Family::new_with_constructor(size_histogram),
            flush_settles: Family::new_with_constructor(size_histogram),
            flush_duration: Family::new_with_constructor(exemplar::latency_histogram),
            round_trips: Family::default(),
            outstanding: Family::default(),
            waiting_for_key: Family::default(),
            delay_set_entries: Family::default(),
            group_pending: Family::default(),
            partitions_read: Family::default(),
            partitions_waiting: Family::default(),
            partition_handover: Family::new_with_constructor(handover_histogram),
            list_entries: Family::default(),
            list_processing: Family::default(),
            group_lag: Family::default(),
            published: Counter::default(),
            retention_trimmed: Family::default(),
            retention_blocked: Family::default(),
            retention_failures: Family::default(),
            scale: Default::default(),
            read_duration: Family::new_with_constructor(exemplar::latency_histogram),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "subscriptions_open",
            "Subscriptions open now",
            m.subscriptions_open.clone(),
        );
        r.register(
            "reads",
            "Reads from Redis that delivered entries",
            m.reads.clone(),
        );
        r.register(
            "read_aheads",
            "Reads sent at the end of a flush's pipeline rather than on a round trip of their own (counted in reads too)",
            m.read_aheads.clone(),
        );
        r.register(
            "deliveries",
            "Deliveries handed to clients",
            m.deliveries.clone(),
        );
        r.register(
            "redeliveries",
            "Deliveries of entries that were delivered before (own pending or claimed)",
            m.redeliveries.clone(),
        );
        r.register(
            "reclaimed_entries",
            "Entries claimed from idle consumers (XAUTOCLAIM)",
            m.reclaimed.clone(),
        );
        r.register(
            "settles_skipped",
            "Entries a flush neither settled nor requeued: another consumer had claimed them",
            m.settles_skipped.clone(),
        );
        r.register(
            "requeue_refused",
            "Entries whose retry, delay or dead letter Redis refused to write (memory, ACL, a key's type): left pending, delivered again",
            m.requeue_refused.clone(),
        );
        r.register(
            "side_effect_failures",
            "Side-effect commands Redis answered with an error when they ran (pipeline mode: their entries settled all the same; atomic mode: left pending)",
            m.side_effect_failures.clone(),
        );
        r.register("outcomes", "Outcomes accepted, by kind", m.outcomes.clone());
        r.register(
            "rejections",
            "Commands and outcomes refused, by reason",
            m.rejections.clone(),
        );
        r.register("flushes", "Flushes sent, by result", m.flushes.clone());
        r.register(
            "flush_commands",
            "Side-effect commands per flush",
            m.flush_commands.clone(),
        );
        r.register(
            "flush_settles",
            "Entries settled per flush",
            m.flush_settles.clone(),
        );
        r.register_with_unit(
            "flush_duration",
            "Time from sending a flush to its last reply",
            Unit::Seconds,
            m.flush_duration.clone(),
        );
        r.register(
            "redis_round_trips",
            "Redis round trips made for subscriptions, by kind",
            m.round_trips.clone(),
        );
        r.register(
            "outstanding_deliveries",
            "Deliveries handed out and not yet settled, per subscription",
            m.outstanding.clone(),
        );
        r.register(
            "waiting_for_key_entries",
            "Entries of an ordered subscription waiting for an earlier entry of their key, or for room",
            m.waiting_for_key.clone(),
        );
        r.register(
            "delay_set_entries",
            "Entries waiting in a delay set for their retry_after",
            m.delay_set_entries.clone(),
        );
        r.register(
            "partitions_read",
            "Partitions of a partitioned stream this sidecar reads now",
            m.partitions_read.clone(),
        );
        r.register(
            "partitions_waiting",
            "Partitions of a partitioned stream that are this sidecar's and wait for their lease: hand-overs under way",
            m.partitions_waiting.clone(),
        );
        r.register_with_unit(
            "partition_handover",
            "From a partition becoming this sidecar's to its reading it (the previous owner drains, or its lease runs out)",
            Unit::Seconds,
            m.partition_handover.clone(),
        );
        r.register(
            "group_pending_entries",
            "Pending entries of a consumer group (XINFO GROUPS)",
            m.group_pending.clone(),
        );
        r.register(
            "group_lag_entries",
            "Entries not yet read by a consumer group (XINFO GROUPS lag)",
            m.group_lag.clone(),
        );
        r.register(
            "list_entries",
            "Entries waiting in a list (LLEN)",
            m.list_entries.clone(),
        );
        r.register(
            "list_processing_entries",
            "Entries of a reliable list held on its consumers' processing lists",
            m.list_processing.clone(),
        );
        r.register(
            "published_entries",
            "Entries appended through Publish",
            m.published.clone(),
        );
        r.register(
            "retention_trimmed_entries",
            "Entries the background trim removed from a stream under retention by acknowledgement",
            m.retention_trimmed.clone(),
        );
        r.register(
            "retention_blocked",
            "1 while a group's position is unknown to Redis (XINFO GROUPS has no lag), so its stream is not trimmed",
            m.retention_blocked.clone(),
        );
        r.register(
            "retention_trim_failures",
            "Trims of a stream under retention by acknowledgement that Redis refused or did not answer (NOPERM, READONLY, an outage); each is tried again at the next interval",
            m.retention_failures.clone(),
        );
        m.scale.register(r);
        r.register_with_unit(
            "read_duration",
            "Time from asking Redis for entries to the reply of a read that delivered",
            Unit::Seconds,
            m.read_duration.clone(),
        );
        // Series that exist from the start read as 0 rather than missing in queries and alerts.
        for reason in crate::window::Reason::ALL {
            m.rejections
                .get_or_create(&ReasonLabels {
                    reason: reason.label(),
                })
                .inc_by(0);
        }
        Self { registry, ..m }
    }

    /// Creates the series of a form and mode at 0, when a subscription of it opens.
    pub fn touch(&self, form: &'static str, mode: &'static str) {
        let f = FormLabels { form };
        for family in [
            &self.reads,
            &self.read_aheads,
            &self.deliveries,
            &self.redeliveries,
            &self.reclaimed,
            &self.settles_skipped,
        ] {
            family.get_or_create(&f).inc_by(0);
        }
        for outcome in ["ack", "drop", "retry", "retry_after", "dead_letter"] {
            self.outcomes
                .get_or_create(&OutcomeLabels { form, outcome })
                .inc_by(0);
        }
        for result in ["ok", "failed"] {
            self.flushes
                .get_or_create(&FlushLabels { form, mode, result })
                .inc_by(0);
        }
        self.side_effect_failures
            .get_or_create(&ModeLabels { form, mode })
            .inc_by(0);
    }

    /// The exposition for a scraper whose `Accept` header is `accept`: with exemplars when it
    /// asks for OpenMetrics, without otherwise.
    pub fn encode_for(&self, accept: Option<&str>) -> String {
        let text = self.encode();
        if exemplar::wants_openmetrics(accept) {
            text
        } else {
            exemplar::without_exemplars(&text)
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_conventional_names() {
        let m = Metrics::new();
        m.deliveries
            .get_or_create(&FormLabels { form: "stream" })
            .inc_by(3);
        m.flush_duration
            .get_or_create(&ModeLabels {
                form: "stream",
                mode: "pipeline",
            })
            .observe(0.002, None, None);
        let text = m.encode();
        assert!(
            text.contains("window_sidecar_deliveries_total{form=\"stream\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("window_sidecar_flush_duration_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE window_sidecar_published_entries counter"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn every_rejection_reason_is_a_series_from_the_start() {
        let text = Metrics::new().encode();
        for label in [
            "unknown_slot",
            "already_settled",
            "invalid_command",
            "forbidden_command",
            "invalid_outcome",
            "incomplete_segment",
            "cross_slot",
            "permission_denied",
            "limit_exceeded",
        ] {
            let series = format!("window_sidecar_rejections_total{{reason=\"{label}\"}} 0");
            assert!(text.contains(&series), "{series} missing from\n{text}");
        }
    }
}
