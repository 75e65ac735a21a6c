//! Where entries come from and how they become dead letters: every entry delivered, redriven or
//! dead-lettered is in the stream; an entry is dead-lettered only at the cap, once per copy and
//! generation; a dead letter is redriven at most once.

use std::collections::BTreeMap;

use super::end::EndState;
use super::event::{Event, Stamped};
use super::facts::Facts;
use super::verdict::{Anomaly, Promise, anomaly};

/// Lineage: every entry delivered, redriven or dead-lettered is in the stream.
pub(super) fn lineage(history: &[Stamped], end: &EndState, facts: &Facts) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = history
        .iter()
        .filter_map(|s| match &s.event {
            Event::Delivered { worker, entry, .. } if facts.root(entry).is_none() => Some(anomaly(
                None,
                format!("worker {worker} got {entry}, which is not in the stream"),
            )),
            Event::Redriven { dead, origin, .. } if s.event.in_place_redrive().is_some() => {
                facts.root(origin).is_none().then(|| {
                    anomaly(
                        None,
                        format!(
                            "dead letter {dead} was redriven back into its group as {origin}, \
                             which is not in the stream"
                        ),
                    )
                })
            }
            Event::Redriven { dead, copy, .. } if facts.root(copy).is_none() => Some(anomaly(
                None,
                format!("dead letter {dead} was redriven as {copy}, which no group read"),
            )),
            _ => None,
        })
        .collect();
    anomalies.extend(
        end.dead_letters
            .iter()
            .filter(|(copied_from, _)| facts.root(copied_from).is_none())
            .map(|(copied_from, _)| {
                anomaly(
                    None,
                    format!("a dead letter of {copied_from}, which is not in the stream"),
                )
            }),
    );
    anomalies
}

/// Generations: each dead letter is redriven at most once (the service said so once; a
/// fresh entry was written once).
pub(super) fn generations(history: &[Stamped], end: &EndState) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = end
        .redriven_twice
        .iter()
        .map(|(r, times)| {
            anomaly(
                Some(r.clone()),
                format!("its dead letter was redriven twice (generation {times})"),
            )
        })
        .collect();
    let mut redriven: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    for stamped in history {
        if let Event::Redriven { dead, origin, .. } = &stamped.event {
            redriven.entry(dead).or_insert((origin, 0)).1 += 1;
        }
    }
    anomalies.extend(
        redriven
            .into_iter()
            .filter(|(_, (_, times))| *times > 1)
            .map(|(dead, (origin, times))| {
                anomaly(
                    Some(origin.to_owned()),
                    format!("its dead letter {dead} was redriven {times} times"),
                )
            }),
    );
    anomalies
}

/// An entry is dead-lettered only once it reached `max_deliveries`.
pub(super) fn dead_letters_at_the_cap(
    end: &EndState,
    facts: &Facts,
    promise: Promise,
) -> Vec<Anomaly> {
    end.dead_letters
        .iter()
        .chain(&facts.redriven_dead)
        .filter(|(_, count)| *count < promise.max_deliveries)
        .filter_map(|(copied_from, count)| {
            Some(anomaly(
                Some(facts.root(copied_from)?),
                format!(
                    "dead-lettered after {count} deliveries, below max_deliveries {}",
                    promise.max_deliveries
                ),
            ))
        })
        .collect()
}

/// One dead letter per copy and generation (a redrive puts an entry back into its group),
/// unless handled past min_idle.
pub(super) fn one_dead_letter_per_generation(facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let dead_letters = facts.dead_letters(r);
            let allowed = facts.copies(r, promise) * facts.generations(r);
            (dead_letters as i64 > allowed && !facts.slow(r)).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("dead-lettered {dead_letters} times"),
                )
            })
        })
        .collect()
}
