//! Delivery counts: within 1 to `max_deliveries`, and never going back for one worker within a
//! generation (across Redis restarts and failovers too).

use super::event::{Event, Stamped};
use super::facts::Facts;
use super::verdict::{Anomaly, Promise, anomaly};

/// Every delivery's count is 1 to `max_deliveries`.
pub(super) fn counts_within_the_cap(
    history: &[Stamped],
    facts: &Facts,
    promise: Promise,
) -> Vec<Anomaly> {
    history
        .iter()
        .filter_map(|s| match &s.event {
            Event::Delivered { entry, count, .. }
                if *count == 0 || *count > promise.max_deliveries =>
            {
                Some(anomaly(
                    Some(facts.root(entry)?),
                    format!(
                        "delivered with count {count} (allowed 1 to max_deliveries {})",
                        promise.max_deliveries
                    ),
                ))
            }
            _ => None,
        })
        .collect()
}

/// A worker never sees an entry's count go back within a generation (a redrive starts it
/// again).
pub(super) fn counts_never_go_back(facts: &Facts) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for ((worker, entry, _), seen) in &facts.seen {
        let backwards = seen.windows(2).any(|w| w[1].1 < w[0].1);
        if backwards {
            let counts: Vec<u32> = seen.iter().map(|(_, c)| *c).collect();
            anomalies.push(anomaly(
                facts.root(entry),
                format!("worker {worker} saw {entry}'s count go backwards: {counts:?}"),
            ));
        }
    }
    anomalies
}
