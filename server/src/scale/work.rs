//! The work waiting per stream group and list, sampled on the backlog gauges' interval: the
//! stream groups' lag, reclaimable pending entries and due delayed entries, a list's length
//! and due delayed entries (how each is asked of Redis: `crate::redis::sample::work_of`). The
//! work-waiting gauge is their sum; `window_sidecar_work_lag_counted` = 1 says a group's lag
//! was counted by the sidecar because Redis did not report it.
//!
//! Several sidecars (and the keeper) sample the same key: aggregate with `max`, not `sum`.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::scale::{ScaleMetrics, WorkLabels};
use crate::metrics::{GroupLabels, KeyLabels};
use crate::redis::sample::{self, Work};
use crate::session::Shared;

/// Samples every watched group and list every `every`, until the process ends.
pub async fn run(shared: Arc<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for ((kind, key, group), watched) in shared.metrics.scale.snapshot() {
            match sample::work_of(shared.redis.pool(), &watched.form, watched.min_idle).await {
                Ok(work) => record(&shared.metrics.scale, kind, key, group, work),
                Err(err) => tracing::debug!(key, error = %err, "sampling the work waiting failed"),
            }
        }
    }
}

fn record(metrics: &ScaleMetrics, form: &'static str, key: String, group: String, work: Work) {
    metrics
        .work_waiting
        .get_or_create(&WorkLabels {
            form,
            key: key.clone(),
            group: group.clone(),
        })
        .set(work.total());
    metrics
        .delay_set_due
        .get_or_create(&KeyLabels { key: key.clone() })
        .set(work.due);
    if form == "stream" {
        let group = GroupLabels { key, group };
        metrics
            .work_lag_counted
            .get_or_create(&group)
            .set(i64::from(work.counted));
        metrics
            .oldest_pending_age
            .get_or_create(&group)
            .set(work.oldest_pending_secs);
    }
}
