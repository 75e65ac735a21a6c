//! The end of the faults: everything still out is acked until, for 2 s, Redis holds nothing
//! unsettled and no sidecar holds anything of a subscription; then the workers' subscriptions
//! close.

use std::time::Duration;

use fred::prelude::*;
use tokio::time::Instant;

use crate::admin::{SubscriptionState, at_rest};
use crate::form::Form;
use crate::world::Sidecars;

/// How the quiesce ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Quiesce {
    /// Quiet: nothing unsettled in Redis and nothing held by a sidecar, for 2 s.
    pub(crate) quiet: bool,
    took: Duration,
    /// At the last look: entries unsettled in Redis (None: Redis did not answer) and
    /// deliveries outstanding at the sidecars (None: one did not answer).
    unsettled: Option<u64>,
    outstanding: Option<u64>,
}

impl std::fmt::Display for Quiesce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let took = self.took.as_secs_f64();
        if self.quiet {
            return write!(f, "quiet after {took:.1} s");
        }
        let known = |n: Option<u64>| n.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        write!(
            f,
            "NOT quiet after {took:.1} s: {} unsettled in Redis, {} deliveries outstanding at \
             the sidecars",
            known(self.unsettled),
            known(self.outstanding)
        )
    }
}

/// Waits (90 s at most) until, for 2 s, Redis has nothing unsettled and no sidecar holds
/// anything of a subscription.
pub(crate) async fn quiesce(form: Form, admin: &Client, sidecars: &Sidecars) -> Quiesce {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    let mut quiet_since = None;
    let mut last = Quiesce {
        quiet: false,
        took: Duration::ZERO,
        unsettled: None,
        outstanding: None,
    };
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let subscriptions = sidecars.subscriptions().await;
        last.unsettled = form.unsettled(admin).await;
        last.outstanding = subscriptions
            .iter()
            .map(|s| {
                s.as_ref()
                    .map(|s| s.iter().map(|s| s.outstanding).sum::<u64>())
            })
            .sum();
        last.took = started.elapsed();
        if at_rest(last.unsettled, &subscriptions) {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                last.quiet = true;
                return last;
            }
        } else {
            quiet_since = None;
        }
    }
    last
}

/// Waits (15 s at most) for the workers' subscriptions to close, so that what they still held
/// goes back before Redis is read; returns the sidecars' subscriptions then.
pub(crate) async fn subscriptions_closed(
    sidecars: &Sidecars,
) -> Vec<Option<Vec<SubscriptionState>>> {
    let closed_by = Instant::now() + Duration::from_secs(15);
    let mut after_stop = sidecars.subscriptions().await;
    while Instant::now() < closed_by
        && after_stop
            .iter()
            .any(|s| s.as_ref().is_none_or(|s| !s.is_empty()))
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after_stop = sidecars.subscriptions().await;
    }
    after_stop
}
