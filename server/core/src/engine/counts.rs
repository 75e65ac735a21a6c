//! Delivery counts, as rules of their own: when an entry has used up its deliveries (a retry
//! of it becomes a dead letter) or was delivered past the cap without an outcome, and which
//! entries of a re-read this window already holds. What a read hands out applies them
//! (`deliver.rs`), and so do the lanes to retries counted once due: beneath both, they name
//! neither.

use std::collections::HashSet;

use super::types::Item;

/// Whether an entry delivered `delivery_count` times has used up its deliveries: a retry of it
/// becomes a dead letter. `max_deliveries` 0 is no cap.
pub fn exhausted(delivery_count: u32, max_deliveries: u32) -> bool {
    max_deliveries > 0 && delivery_count >= max_deliveries
}

/// Whether an entry was delivered more often than allowed without an outcome (a client that
/// crashes on it: straight to the dead letter, not to the client again).
pub(super) fn past_the_cap<E: Item>(entry: &E, max_deliveries: u32) -> bool {
    max_deliveries > 0 && entry.delivery_count() > max_deliveries
}

/// Splits a read into entries [`past_the_cap`] and the rest.
pub(super) fn past_cap<E: Item>(entries: Vec<E>, max_deliveries: u32) -> (Vec<E>, Vec<E>) {
    if max_deliveries == 0 {
        return (Vec::new(), entries);
    }
    entries
        .into_iter()
        .partition(|e| past_the_cap(e, max_deliveries))
}

/// The ids this window holds (outstanding or settled and not yet flushed), flushes, or settled
/// while a read was under way.
pub(super) fn held_ids<'a, E: Item + 'a>(
    held: impl Iterator<Item = E::Id>,
    flushing: impl Iterator<Item = &'a Vec<E::Id>>,
    settled: impl Iterator<Item = &'a Vec<E::Id>>,
) -> HashSet<E::Id> {
    held.chain(flushing.flatten().cloned())
        .chain(settled.flatten().cloned())
        .collect()
}

/// Splits a re-read into the entries held already and the fresh ones.
pub(super) fn split_held<E: Item>(entries: Vec<E>, held: &HashSet<E::Id>) -> (Vec<E>, Vec<E>) {
    entries.into_iter().partition(|e| held.contains(&e.id()))
}
