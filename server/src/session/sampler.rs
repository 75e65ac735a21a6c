//! The backlog gauges and the work-waiting gauge: every stream group and list this sidecar has
//! served, those its configuration names (`--watch`) and those it keeps (`--keep`), in one
//! registry ([`Watched`]), sampled by one job on one timer whether or not a subscription is open
//! on them now. A backlog alert must be able to fire exactly when every consumer is down, so a
//! series stays when its last subscription closes; a group that no longer exists loses its
//! backlog series. What each sample asks of Redis is `crate::redis::sample`'s; here, which
//! series each of its numbers sets.
//!
//! The work waiting is what an autoscaler scales on: a group's lag, its reclaimable pending
//! entries and its due delayed entries (a list's length and due delayed entries);
//! `window_sidecar_work_lag_counted` = 1 says the lag was counted by the sidecar because Redis
//! did not report it. Several sidecars (and the keeper) sample the same key: aggregate with
//! `max`, not `sum`.

use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::domain::Source;
use crate::metrics::scale::{ScaleMetrics, WorkLabels};
use crate::metrics::{GroupLabels, KeyLabels, Metrics};
use crate::redis::Redis;
use crate::redis::form::Form;
use crate::redis::sample::{self, Group, Work};

/// The most keys watched at once: a sidecar whose clients open ever new keys must not grow its
/// sampling without bound (each costs round trips per interval).
const MAX_WATCHED: usize = 10_000;

/// What is sampled, by (form, key, group): the group is empty for a list.
#[derive(Debug, Default)]
pub struct Watched {
    keys: Mutex<BTreeMap<(&'static str, String, String), Watch>>,
}

/// One stream group or list that is sampled.
#[derive(Clone, Debug)]
struct Watch {
    form: Form,
    /// Pending entries idle longer than this count as work (they can be reclaimed).
    min_idle: Duration,
}

impl Watched {
    /// Samples `source` from now on; pub/sub has no backlog in Redis. The first form and
    /// min_idle given for a group or list are the ones it is sampled with.
    pub fn watch(&self, source: &Source, form: &Form) {
        let min_idle = match source {
            Source::Stream(stream) => stream.min_idle,
            Source::List(_) => Duration::ZERO,
            Source::PubSub(_) => return,
        };
        let (key, group, _) = source.describe();
        let id = (source.form(), key, group);
        let mut keys = self.keys.lock();
        if keys.len() >= MAX_WATCHED && !keys.contains_key(&id) {
            tracing::warn!(
                key = id.1,
                "{MAX_WATCHED} keys are watched already: no backlog gauges for this one"
            );
            return;
        }
        keys.entry(id).or_insert_with(|| Watch {
            form: form.clone(),
            min_idle,
        });
    }

    fn snapshot(&self) -> Vec<((&'static str, String, String), Watch)> {
        let keys = self.keys.lock();
        keys.iter().map(|(k, w)| (k.clone(), w.clone())).collect()
    }
}

/// Samples one key's backlog now: a subscription that opens shows its backlog at once, not at
/// the next tick.
pub async fn sample_now(redis: &Redis, metrics: &Metrics, source: &Source, form: &Form) {
    let (key, group, _) = source.describe();
    let backlog = sample::backlog_of(redis.pool(), form).await;
    record_backlog(metrics, key, group, backlog);
}

/// Samples everything `watched` holds every `every`, until the process ends. Given the parts
/// of the shared state it uses rather than all of it: that state holds the [`Watched`].
pub async fn run(watched: &Watched, redis: &Redis, metrics: &Metrics, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for ((form, key, group), watch) in watched.snapshot() {
            let (backlog, work) = sample::sample(redis.pool(), &watch.form, watch.min_idle).await;
            record_backlog(metrics, key.clone(), group.clone(), backlog);
            match work {
                Ok(work) => record_work(&metrics.scale, form, key, group, work),
                Err(err) => tracing::debug!(key, error = %err, "sampling the work waiting failed"),
            }
        }
    }
}

fn record_backlog(metrics: &Metrics, key: String, group: String, sample: sample::Backlog) {
    let group = GroupLabels {
        key: key.clone(),
        group,
    };
    match sample.group {
        Some(Group::Found { pending, lag }) => {
            metrics.group_pending.get_or_create(&group).set(pending);
            if let Some(lag) = lag {
                metrics.group_lag.get_or_create(&group).set(lag);
            } else {
                metrics.group_lag.remove(&group);
            }
        }
        Some(Group::Missing) => {
            metrics.group_pending.remove(&group);
            metrics.group_lag.remove(&group);
        }
        None => {}
    }
    let key = KeyLabels { key };
    if let Some((waiting, held)) = sample.list {
        metrics.list_entries.get_or_create(&key).set(waiting);
        metrics.list_processing.get_or_create(&key).set(held);
    }
    if let Some(depth) = sample.delayed {
        metrics.delay_set_entries.get_or_create(&key).set(depth);
    }
}

fn record_work(metrics: &ScaleMetrics, form: &'static str, key: String, group: String, work: Work) {
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
