//! The campaign's history and its checker, pure: what workers saw and decided, what the
//! nemesis did, and what Redis holds at the end go in; anomalies come out. Nothing here talks
//! to Redis or the sidecar, so every rule is tested on made-up histories.
//!
//! Per-key order on ordered subscriptions is checked in [`order`], and across the workers of a
//! partitioned stream's group in [`across`].
//!
//! A stream entry is known by the id the producer's `XADD` gave it, for its whole life in the
//! workers' group: a `retry` or `retry_after` keeps it pending with that id and delivers it
//! again with a higher count ([`redelivery`]), and a redrive of its dead letter puts it back in
//! that group alone with the same id and its count reset (a *generation* of its own). The audit
//! group, which reads every entry behind the workers, must see each published entry exactly
//! once and nothing else ([`audit`]). Only a redrive that could not re-enter the group (its
//! entry was trimmed) may still write a fresh entry; that one is a root of its own.
//! List values and pub/sub messages are known by their payload.
//!
//! The checker's parts: the history's vocabulary ([`event`]), what Redis holds at the end
//! ([`end`]), what the run promised and what an anomaly is ([`verdict`]), and what one reading
//! of the history says of each entry ([`facts`]); then one part per property: where entries
//! come from and how they become dead letters ([`mod@lineage`]), delivery counts ([`counts`]),
//! reads and their flush reports in order ([`reads`]), side effects once, at most once or at
//! least once ([`effects`]), what is left at the end ([`leftovers`]), retries in place
//! ([`redelivery`]), per-key order ([`order`]), per-key order across a group ([`across`]) and
//! the audit group ([`audit`]); and what a run
//! reports: its [`mod@figures`], the refusals' reach ([`refusals`]) and an anomaly's excerpt of
//! the history ([`excerpt`]).

mod across;
mod audit;
mod counts;
mod effects;
mod end;
mod event;
mod excerpt;
mod facts;
mod figures;
mod leftovers;
mod lineage;
mod order;
mod reads;
mod redelivery;
mod refusals;
mod verdict;

pub(crate) use self::end::{EndState, Held, Place};
pub(crate) use self::event::{Copied, Decision, Event, Said, Stamped};
pub(crate) use self::excerpt::{around, workers_before};
pub(crate) use self::figures::Figures;
pub(crate) use self::verdict::{Anomaly, Promise};

use self::counts::{counts_never_go_back, counts_within_the_cap};
use self::effects::{
    at_least_once, at_most_once, discarded_effects_never_ran, effects_follow_acks,
    once_in_atomic_mode,
};
use self::facts::Facts;
use self::figures::figures;
use self::leftovers::{nothing_left, retention};
use self::lineage::{
    dead_letters_at_the_cap, generations, lineage, one_dead_letter_per_generation,
};
use self::reads::{flushes_follow_reads, reads_in_order};

/// Checks the whole history against the end state: each invariant on its own, in this order,
/// over the facts one reading of the history gathered.
pub(crate) fn check(
    history: &[Stamped],
    end: &EndState,
    promise: Promise,
) -> (Vec<Anomaly>, Figures) {
    let facts = Facts::gather(history, end);
    let mut anomalies = Vec::new();
    anomalies.extend(lineage(history, end, &facts));
    anomalies.extend(counts_within_the_cap(history, &facts, promise));
    anomalies.extend(flushes_follow_reads(history));
    anomalies.extend(reads_in_order(history));
    anomalies.extend(retention(end));
    anomalies.extend(generations(history, end));
    anomalies.extend(counts_never_go_back(&facts));
    anomalies.extend(dead_letters_at_the_cap(end, &facts, promise));
    anomalies.extend(discarded_effects_never_ran(end));
    anomalies.extend(effects_follow_acks(end, &facts));
    anomalies.extend(once_in_atomic_mode(end, &facts, promise));
    anomalies.extend(at_most_once(end, &facts, promise));
    anomalies.extend(one_dead_letter_per_generation(&facts, promise));
    anomalies.extend(at_least_once(end, &facts, promise));
    anomalies.extend(nothing_left(history, end));
    let (out_of_order, checked) = order::check(
        history,
        promise.max_deliveries,
        |entry| facts.root(entry),
        |entry| facts.slow(entry),
        |entry| facts.dead_letters(entry) > 0,
    );
    anomalies.extend(out_of_order);
    let mut across_group = None;
    if promise.across_group {
        let (found, checked) = across::check(
            history,
            promise.max_deliveries,
            |entry| facts.root(entry),
            |entry| facts.dead_letters(entry) > 0,
        );
        anomalies.extend(found);
        across_group = Some(checked);
    }
    // Streams keep a retried entry in place; a list or a channel puts a copy back.
    if !promise.by_payload {
        anomalies.extend(redelivery::check(
            history,
            promise.max_deliveries,
            |entry| facts.slow(entry) || facts.dead_letters(entry) > 0,
        ));
    }
    let (audited, audit) = audit::check(history, end);
    anomalies.extend(audited);
    let mut figures = figures(history, end, &facts, promise);
    figures.ordered_deliveries = checked.deliveries;
    figures.ordered_streams = checked.streams;
    if let Some(checked) = across_group {
        figures.across_deliveries = checked.deliveries;
        figures.across_keys = checked.keys;
    }
    figures.audit = audit;
    (anomalies, figures)
}

#[cfg(test)]
mod tests;
