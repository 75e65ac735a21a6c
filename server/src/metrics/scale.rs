//! The series scaling and alerting read: the work-waiting gauge that an autoscaler scales on
//! (lag + reclaimable pending + due delayed entries, per stream group and list) and the series
//! the alert rules read (Redis readiness, start time, dead letters, refused consumer names, the
//! age of the oldest pending entry, what the keeper promoted). The sampler that sets the work
//! gauges is `crate::session::sampler`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::labels::{FormLabels, GroupLabels, KeyLabels};

/// Labels of the work-waiting gauge: `form` is `stream` (with its group) or `list` (group
/// empty).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkLabels {
    pub form: &'static str,
    pub key: String,
    pub group: String,
}

/// The series of this module, registered with the others.
#[derive(Debug, Default)]
pub struct ScaleMetrics {
    pub work_waiting: Family<WorkLabels, Gauge>,
    pub work_lag_counted: Family<GroupLabels, Gauge>,
    pub oldest_pending_age: Family<GroupLabels, Gauge>,
    pub delay_set_due: Family<KeyLabels, Gauge>,
    pub redis_ready: Gauge,
    pub start_time: Gauge,
    pub dead_letters: Family<FormLabels, Counter>,
    pub consumer_refusals: Counter,
    pub promoted: Family<FormLabels, Counter>,
}

impl ScaleMetrics {
    /// Registers every series (under the registry's prefix, `window_sidecar`).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "work_waiting_entries",
            "Work waiting per stream group and list: entries not yet read (lag), pending entries idle longer than min_idle (reclaimable) and delayed entries already due; scale workers on this",
            self.work_waiting.clone(),
        );
        r.register(
            "work_lag_counted",
            "1 while Redis does not report a group's lag and the work waiting counts the unread entries itself (capped at 10000), 0 while it uses the reported lag",
            self.work_lag_counted.clone(),
        );
        r.register_with_unit(
            "oldest_pending_age",
            "Age of a group's oldest pending entry (from its id: since it was added), 0 when none is pending",
            Unit::Seconds,
            self.oldest_pending_age.clone(),
        );
        r.register(
            "delay_set_due_entries",
            "Entries of a delay set whose retry_after has passed and that wait to be promoted",
            self.delay_set_due.clone(),
        );
        r.register(
            "redis_ready",
            "1 while Redis answers the sidecar's health check, 0 while it does not (readiness)",
            self.redis_ready.clone(),
        );
        r.register_with_unit(
            "start_time",
            "When this sidecar process started, in Unix seconds",
            Unit::Seconds,
            self.start_time.clone(),
        );
        r.register(
            "dead_letters",
            "Entries moved to a dead-letter key (past max_deliveries), by flushes that succeeded",
            self.dead_letters.clone(),
        );
        r.register(
            "consumer_refusals",
            "Subscriptions refused because another subscription holds their consumer name",
            self.consumer_refusals.clone(),
        );
        r.register(
            "promoted_entries",
            "Delayed entries a keeper (--keep) made deliverable again: moved back to their list (or stream, for copies an earlier version wrote), or a stream group's due entries whose consumer is gone",
            self.promoted.clone(),
        );
    }
}
