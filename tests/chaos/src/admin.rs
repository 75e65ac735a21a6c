//! What the campaign reads of a sidecar's admin view (`/subscriptions` on `--metrics-listen`):
//! the subscriptions open on it and what each still holds. A simple list's popped entries exist
//! only there until they are settled, so the quiesce waits for every sidecar to hold nothing,
//! and a pending anomaly prints who held what.

use std::fmt;

/// One open subscription as a sidecar's admin view shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SubscriptionState {
    pub id: String,
    pub form: String,
    pub consumer: String,
    /// Seconds since the Unix epoch.
    pub opened_at: u64,
    pub reads_in_flight: u64,
    pub open_reads: u64,
    pub outstanding: u64,
    pub kept_segments: u64,
    pub flushes_in_flight: u64,
    pub draining: bool,
    pub deliveries: u64,
}

impl SubscriptionState {
    /// The subscriptions of a `/subscriptions` answer; None when it is not one, or lacks a
    /// figure the quiesce depends on (a renamed field must not read as "holds nothing").
    pub(crate) fn parse(body: &str) -> Option<Vec<Self>> {
        let json: serde_json::Value = serde_json::from_str(body).ok()?;
        json.get("subscriptions")?
            .as_array()?
            .iter()
            .map(|s| {
                let text = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                let number = |k: &str| s[k].as_u64();
                Some(SubscriptionState {
                    id: text("id"),
                    form: text("form"),
                    consumer: text("consumer"),
                    opened_at: number("opened_at").unwrap_or_default(),
                    reads_in_flight: number("reads_in_flight").unwrap_or_default(),
                    open_reads: number("open_reads")?,
                    outstanding: number("outstanding_deliveries")?,
                    kept_segments: number("kept_segments")?,
                    flushes_in_flight: number("flushes_in_flight")?,
                    draining: s["draining"].as_bool().unwrap_or_default(),
                    deliveries: s["counters"]["deliveries"].as_u64().unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Whether it holds anything the sidecar still has to settle or give back: deliveries
    /// without an outcome (a simple list's exist nowhere else), acks not yet flushed, flushes
    /// under way. A read under way is not: a blocking read waits on an empty source.
    pub(crate) fn busy(&self) -> bool {
        self.outstanding > 0
            || self.open_reads > 0
            || self.kept_segments > 0
            || self.flushes_in_flight > 0
    }
}

/// Whether a run is at rest: Redis holds nothing unsettled (`unsettled`, None: it did not
/// answer) and every sidecar answered that none of its subscriptions holds anything. Redis
/// alone is not enough: a simple list's popped entries are in no key until settled, and go
/// back to the list when their worker leaves.
pub(crate) fn at_rest(unsettled: Option<u64>, sidecars: &[Option<Vec<SubscriptionState>>]) -> bool {
    unsettled == Some(0)
        && sidecars.iter().all(|s| {
            s.as_ref()
                .is_some_and(|s| !s.iter().any(SubscriptionState::busy))
        })
}

impl fmt::Display for SubscriptionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let age = now_unix().saturating_sub(self.opened_at);
        let consumer = if self.consumer.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.consumer)
        };
        write!(
            f,
            "{} {}{consumer}, open {age} s: {} outstanding, {} open reads, {} kept segments, \
             {} flushes and {} reads under way, {} delivered{}",
            self.form,
            self.id,
            self.outstanding,
            self.open_reads,
            self.kept_segments,
            self.flushes_in_flight,
            self.reads_in_flight,
            self.deliveries,
            if self.draining { ", draining" } else { "" }
        )
    }
}

/// Seconds since the Unix epoch (the admin view's `opened_at`).
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Every sidecar's subscriptions (by index; None: no usable answer), one line each.
pub(crate) fn describe_subscriptions(all: &[Option<Vec<SubscriptionState>>]) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, subscriptions) in all.iter().enumerate() {
        match subscriptions {
            None => lines.push(format!("sidecar-{i}: no usable answer from its admin view")),
            Some(s) if s.is_empty() => lines.push(format!("sidecar-{i}: none")),
            Some(s) => lines.extend(s.iter().map(|s| format!("sidecar-{i}: {s}"))),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as the sidecar serves it (`SubscriptionView`, serialized).
    const ANSWER: &str = r#"{"subscriptions":[
        {"id":"sub-7","form":"simple_list","key":"{chaos}:jobs","group":"","consumer":"",
         "mode":"atomic","count":8,"max_in_flight":16,"opened_at":0,"reads_in_flight":0,
         "open_reads":2,"outstanding_deliveries":16,"kept_segments":0,"flushes_in_flight":0,
         "draining":false,"counters":{"reads":3,"deliveries":16,"redeliveries":0,"flushes":0,
         "failed_flushes":0,"rejections":0,"outcomes":{}}},
        {"id":"sub-8","form":"simple_list","key":"{chaos}:jobs","group":"","consumer":"",
         "mode":"atomic","count":8,"max_in_flight":16,"opened_at":0,"reads_in_flight":1,
         "open_reads":0,"outstanding_deliveries":0,"kept_segments":0,"flushes_in_flight":0,
         "draining":false,"counters":{"reads":9,"deliveries":1826,"redeliveries":0,
         "flushes":230,"failed_flushes":0,"rejections":0,"outcomes":{"ack":1826}}}]}"#;

    #[test]
    fn a_subscription_with_outstanding_deliveries_is_busy_a_blocking_read_is_not() {
        let all = SubscriptionState::parse(ANSWER).expect("an answer");
        assert_eq!(all.len(), 2);
        assert!(all[0].busy());
        assert_eq!((all[0].outstanding, all[0].open_reads), (16, 2));
        assert!(!all[1].busy(), "{:?}", all[1]);
        assert_eq!(all[1].deliveries, 1826);
        let lines = describe_subscriptions(&[Some(all), None, Some(Vec::new())]);
        assert!(
            lines[0].starts_with("sidecar-0: simple_list sub-7, open ")
                && lines[0].ends_with(
                    ": 16 outstanding, 2 open reads, 0 kept segments, 0 flushes and 0 reads \
                     under way, 16 delivered"
                ),
            "{lines:?}"
        );
        assert_eq!(lines[2], "sidecar-1: no usable answer from its admin view");
        assert_eq!(lines[3], "sidecar-2: none");
    }

    #[test]
    fn a_run_is_at_rest_only_when_no_sidecar_holds_a_delivery_redis_does_not_show() {
        let all = SubscriptionState::parse(ANSWER).expect("an answer");
        let idle = vec![all[1].clone()];
        // A worker sleeps on a slow ack with a full window of a simple list: Redis shows
        // nothing, the sidecar holds 16 deliveries that go back to the list when it leaves.
        assert!(!at_rest(Some(0), &[Some(idle.clone()), Some(all)]));
        assert!(at_rest(Some(0), &[Some(idle.clone()), Some(Vec::new())]));
        assert!(!at_rest(Some(3), &[Some(idle.clone()), Some(Vec::new())]));
        // A sidecar that does not answer may hold anything.
        assert!(!at_rest(Some(0), &[Some(idle), None]));
        assert!(!at_rest(None, &[]));
    }

    #[test]
    fn an_answer_without_a_figure_the_quiesce_reads_is_no_answer() {
        let renamed = ANSWER.replace("outstanding_deliveries", "outstanding");
        assert_eq!(SubscriptionState::parse(&renamed), None);
        assert_eq!(SubscriptionState::parse("not json"), None);
        assert_eq!(
            SubscriptionState::parse(r#"{"subscriptions":[]}"#),
            Some(Vec::new())
        );
    }
}
