//! The backlog gauges: every stream group and list this sidecar has served, and those its
//! configuration names, sampled on one timer whether or not a subscription is open on them now.
//! A backlog alert must be able to fire exactly when every consumer is down, so a series stays
//! when its last subscription closes; a group that no longer exists loses its series.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use std::time::Duration;

use crate::domain::Source;
use crate::metrics::{GroupLabels, KeyLabels, Metrics};
use crate::redis::Redis;
use crate::redis::form::Form;
use crate::redis::sample::{self, Group};

/// The most keys watched at once: a sidecar whose clients open ever new keys must not grow its
/// sampling without bound (each costs a round trip per interval).
const MAX_WATCHED: usize = 10_000;

/// What is sampled, by (form, key, group).
#[derive(Debug, Default)]
pub struct Backlog {
    watched: Mutex<BTreeMap<(&'static str, String, String), Form>>,
}

impl Backlog {
    /// Samples `source` now and from then on. Pub/sub has no backlog in Redis.
    pub fn watch(&self, source: &Source, form: &Form) {
        if matches!(source, Source::PubSub(_)) {
            return;
        }
        let (key, group, _) = source.describe();
        let kind = if matches!(source, Source::Stream(_)) {
            "stream"
        } else {
            "list"
        };
        let mut watched = self.watched.lock();
        if watched.len() >= MAX_WATCHED
            && !watched.contains_key(&(kind, key.clone(), group.clone()))
        {
            tracing::warn!(
                key,
                "{MAX_WATCHED} keys are watched already: no backlog gauges for this one"
            );
            return;
        }
        watched
            .entry((kind, key, group))
            .or_insert_with(|| form.clone());
    }

    fn snapshot(&self) -> Vec<((&'static str, String, String), Form)> {
        let watched = self.watched.lock();
        watched
            .iter()
            .map(|(k, f)| (k.clone(), f.clone()))
            .collect()
    }
}

/// Samples one watched key now: a subscription that opens shows its backlog at once, not at the
/// next tick.
pub async fn sample_now(redis: &Redis, metrics: &Metrics, source: &Source, form: &Form) {
    let (key, group, _) = source.describe();
    let sample = sample::backlog_of(redis.pool(), form).await;
    record(metrics, key, group, sample);
}

/// Samples everything `backlog` watches every `every`, until the process ends. Given the parts
/// of the shared state it uses rather than all of it: that state holds the [`Backlog`].
pub async fn run(backlog: &Backlog, redis: &Redis, metrics: &Metrics, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for ((_, key, group), form) in backlog.snapshot() {
            let sample = sample::backlog_of(redis.pool(), &form).await;
            record(metrics, key, group, sample);
        }
    }
}

fn record(metrics: &Metrics, key: String, group: String, sample: sample::Backlog) {
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
