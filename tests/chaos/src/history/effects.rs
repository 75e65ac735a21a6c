//! Side effects against the decisions: a discarded one never runs, a kept one at most once per
//! ack; atomic mode runs it once per copy (unless handled past `min_idle`); an at-most-once form
//! at most once per copy; an at-least-once form settles every entry (its side effect ran, or it
//! was dropped or dead-lettered).

use super::end::EndState;
use super::facts::{Facts, kept_runs};
use super::verdict::{Anomaly, Promise, anomaly};

/// Side effects: a dropped or retried delivery's never runs.
pub(super) fn discarded_effects_never_ran(end: &EndState) -> Vec<Anomaly> {
    end.discarded_effects
        .iter()
        .filter(|(_, ran)| **ran != 0)
        .map(|(r, ran)| {
            anomaly(
                Some(r.clone()),
                format!("a discarded side effect ran {ran} times (drop, retry, retry_after)"),
            )
        })
        .collect()
}

/// Side effects: a kept one runs at most once per ack.
pub(super) fn effects_follow_acks(end: &EndState, facts: &Facts) -> Vec<Anomaly> {
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let acks = facts.decided(r).iter().filter(|d| d.keeps()).count() as i64;
            let ran = kept_runs(end, r);
            (ran > acks).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("its side effect ran {ran} times for {acks} acks"),
                )
            })
        })
        .collect()
}

/// Atomic mode: a kept side effect runs once per copy, unless handled past min_idle.
pub(super) fn once_in_atomic_mode(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    if !promise.exactly_once {
        return Vec::new();
    }
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let ran = kept_runs(end, r);
            (ran > facts.copies(r, promise) && !facts.slow(r)).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("its side effect ran {ran} times in atomic mode"),
                )
            })
        })
        .collect()
}

/// A simple list or pub/sub: a kept side effect runs at most once per copy.
pub(super) fn at_most_once(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    if !promise.at_most_once {
        return Vec::new();
    }
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let ran = kept_runs(end, r);
            (ran > facts.copies(r, promise)).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("its side effect ran {ran} times, at most once promised"),
                )
            })
        })
        .collect()
}

/// At least once: every entry's side effect ran, or it was dropped or dead-lettered. (At most
/// once forgives the loss: it is a figure.)
pub(super) fn at_least_once(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    if promise.at_most_once {
        return Vec::new();
    }
    facts
        .all_roots
        .iter()
        .filter(|r| facts.unsettled(end, r) && !facts.effect_refused(end, r))
        .map(|r| {
            anomaly(
                Some(r.clone()),
                format!(
                    "lost: neither its side effect ran, nor was it dropped or dead-lettered \
                     (decisions {:?})",
                    facts.decided(r)
                ),
            )
        })
        .collect()
}
