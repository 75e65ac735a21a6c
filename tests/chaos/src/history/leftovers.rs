//! What Redis still holds at the end: nothing unsettled (and, when something is, where each
//! entry sits and what happened to it), nothing trimmed before every group read it, and no
//! more than the trim leaves once every group acknowledged everything.

use std::collections::BTreeMap;

use super::end::{EndState, Place};
use super::event::{Event, Stamped};
use super::verdict::{Anomaly, anomaly};

/// Retention by acknowledgement: nothing leaves the stream before every group read it, and
/// once every group acknowledged everything, the trim leaves at most one entry.
pub(super) fn retention(end: &EndState) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = end
        .unread_by_every_group
        .iter()
        .map(|n| {
            anomaly(
                None,
                format!("published entry {n} left the stream before every group had read it"),
            )
        })
        .collect();
    if let Some(left) = end.retained_after_settling.filter(|left| *left > 1) {
        anomalies.push(anomaly(
            None,
            format!("retention kept {left} entries once every group had acknowledged everything"),
        ));
    }
    anomalies
}

/// Nothing pending in the group or left in the delay set at the end.
pub(super) fn nothing_left(history: &[Stamped], end: &EndState) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    if end.pending != 0 {
        anomalies.push(anomaly(
            None,
            format!(
                "{} entries still pending at the end{}",
                end.pending,
                where_held(history, end)
            ),
        ));
    }
    anomalies
}

/// How many of the entries still held sit where, then one line per entry: where, and its last
/// events (deliveries and decisions), so that a pending anomaly says what happened to each.
fn where_held(history: &[Stamped], end: &EndState) -> String {
    /// The events shown per entry, the last ones.
    const EVENTS: usize = 6;
    if end.held.is_empty() {
        return " (where: not found when the end state was read)".to_owned();
    }
    let mut places: BTreeMap<&str, usize> = BTreeMap::new();
    for held in &end.held {
        let kind = match held.place {
            Place::List { .. } => "on the list",
            Place::Delayed { .. } => "in the delay set",
            Place::Processing { .. } => "on a processing list",
            Place::Pending { .. } => "pending in the group",
            Place::Unread => "unread",
        };
        *places.entry(kind).or_default() += 1;
    }
    let counts: Vec<String> = places.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut out = format!(" ({})", counts.join(", "));
    for held in &end.held {
        let r = &held.entry;
        let events: Vec<String> = history
            .iter()
            .filter_map(|s| {
                let (worker, entry, what) = match &s.event {
                    Event::Delivered {
                        worker,
                        entry,
                        count,
                    } => (worker, entry, format!("delivered #{count}")),
                    Event::Decided {
                        worker,
                        entry,
                        decision,
                    } => (worker, entry, format!("{decision:?}")),
                    _ => return None,
                };
                (entry == r).then(|| format!("{} ms w{worker} {what}", s.at_ms))
            })
            .collect();
        let last = &events[events.len().saturating_sub(EVENTS)..];
        let events = if last.is_empty() {
            "never delivered".to_owned()
        } else {
            last.join(", ")
        };
        out.push_str(&format!(
            "\n       {}: {}; {events}",
            held.entry, held.place
        ));
    }
    out
}
