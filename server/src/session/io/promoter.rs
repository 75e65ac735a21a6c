//! The promoter: moves a subscription's due `retry_after` entries back, on a timer, for as
//! long as the subscription runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::debug;

use crate::redis::Redis;
use crate::redis::form::Form;

/// Now, in Unix milliseconds (the unit of the delay set's scores).
pub(in crate::session) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Moves due retry_after entries back, for as long as the subscription runs.
pub(in crate::session) async fn promote(redis: Redis, form: Form, every: Duration) {
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
