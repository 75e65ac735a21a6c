//! Deliveries the client is still working on: which extensions reach Redis, and how often.

use std::time::Instant;

use super::action::Action;
use super::state::Engine;
use super::types::{Extension, Item};
use crate::window::{SlotError, SlotId};

impl<E: Item> Engine<E> {
    /// The client is still working on these deliveries: keep other consumers from taking them
    /// (a stream's entries idle again, a reliable list's lease renewed), at most once per
    /// `extend_every` for each, and never settling anything. Returns the slots refused.
    pub fn extend(&mut self, now: Instant, slots: &[SlotId]) -> Vec<SlotError> {
        self.fence(now);
        let mut rejected = Vec::new();
        let mut due = Vec::new();
        for &slot in slots {
            let entry = match self.window.open_entry(slot) {
                Ok(entry) => entry,
                Err(err) => {
                    rejected.push(err);
                    continue;
                }
            };
            let recent = self
                .extended
                .get(&slot)
                .is_some_and(|at| now.saturating_duration_since(*at) < self.config.extend_every);
            if !recent && !due.iter().any(|(s, _)| *s == slot) {
                due.push((slot, entry.clone()));
            }
        }
        let window = &self.window;
        self.extended
            .retain(|slot, _| window.outstanding_entry(*slot).is_some());
        match self.config.kind.extends_by() {
            Some(Extension::Entries) if !due.is_empty() => {
                for (slot, _) in &due {
                    self.extended.insert(*slot, now);
                }
                let entries = due.into_iter().map(|(_, entry)| entry).collect();
                self.actions.push(Action::Extend(entries));
            }
            Some(Extension::Lease) if !due.is_empty() => {
                let recent = self
                    .lease_extended
                    .is_some_and(|at| now.saturating_duration_since(at) < self.config.extend_every);
                if !recent && let Some(lease) = self.lease.as_mut() {
                    self.lease_extended = Some(now);
                    lease.hurry(now);
                }
            }
            _ => {}
        }
        self.advance(now);
        rejected
    }
}
