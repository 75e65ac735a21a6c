//! What an anomaly's report shows of the history: the entry's own events with the faults
//! around them, and what its workers did before each delivery of it.

use std::collections::BTreeSet;

use super::event::{Decision, Event, Stamped};

/// The events about `root` (its deliveries, decisions, redrives and what the audit group read
/// of it) and every fault within `window_ms` of them, for an anomaly's report.
pub(crate) fn around<'a>(history: &'a [Stamped], root: &str, window_ms: u64) -> Vec<&'a Stamped> {
    let own = |s: &Stamped| match &s.event {
        Event::Delivered { entry, .. }
        | Event::Decided { entry, .. }
        | Event::Late { entry }
        | Event::Delayed { entry, .. }
        | Event::Audited { entry, .. } => entry == root,
        Event::Redriven { origin, copy, .. } => origin == root || copy == root,
        Event::AuditAcked { entries } => entries.iter().any(|e| e == root),
        Event::Refused { kept_unwritten, .. } => kept_unwritten.iter().any(|e| e == root),
        Event::Said { entries, .. } => entries.iter().any(|e| e == root),
        Event::Fault(_)
        | Event::Undone(_)
        | Event::Settling
        | Event::Read { .. }
        | Event::Flushed { .. }
        | Event::InOrder { .. }
        | Event::Ended { .. }
        | Event::Came { .. } => false,
    };
    let times: Vec<u64> = history
        .iter()
        .filter(|s| own(s) && !matches!(s.event, Event::Refused { .. } | Event::Said { .. }))
        .map(|s| s.at_ms)
        .collect();
    history
        .iter()
        .filter(|s| {
            own(s)
                || (matches!(
                    s.event,
                    Event::Fault(_) | Event::Undone(_) | Event::Redriven { .. }
                ) && times.iter().any(|t| s.at_ms.abs_diff(*t) <= window_ms))
        })
        .collect()
}

/// For an anomaly's report, what the workers that got `root` did before each delivery of it:
/// the read it came in (and that read's flush reports), and the slow acks the same worker
/// decided within `window_ms` before (a worker asleep past `min_idle` leaves the reads behind
/// that one waiting in its stream). Whether the entry was handled past `min_idle` shows here,
/// where its own events cannot tell.
pub(crate) fn workers_before<'a>(
    history: &'a [Stamped],
    root: &str,
    window_ms: u64,
) -> Vec<&'a Stamped> {
    let mut picked = BTreeSet::new();
    for (i, s) in history.iter().enumerate() {
        let Event::Delivered { worker, entry, .. } = &s.event else {
            continue;
        };
        if entry != root {
            continue;
        }
        let carried_by = history[..i]
            .iter()
            .rposition(|e| matches!(&e.event, Event::Read { worker: w, .. } if w == worker));
        picked.extend(carried_by);
        // The reports of that read: whether its flush failed, and what Redis refused.
        if let Some(Event::Read {
            stream, read_id, ..
        }) = carried_by.map(|at| &history[at].event)
        {
            picked.extend(history.iter().enumerate().skip(i).filter_map(|(j, e)| {
                let (w, st, r) = match &e.event {
                    Event::Flushed {
                        worker,
                        stream,
                        read_id,
                        ..
                    }
                    | Event::Refused {
                        worker,
                        stream,
                        read_id,
                        ..
                    } => (worker, stream, read_id),
                    _ => return None,
                };
                (w == worker && st == stream && r == read_id).then_some(j)
            }));
        }
        picked.extend(
            history[..i]
                .iter()
                .enumerate()
                .filter(|(_, e)| s.at_ms.saturating_sub(e.at_ms) <= window_ms)
                .filter(|(_, e)| {
                    matches!(&e.event, Event::Decided { worker: w, decision: Decision::SlowAck, .. }
                        if w == worker)
                })
                .map(|(j, _)| j),
        );
    }
    picked.into_iter().map(|i| &history[i]).collect()
}
