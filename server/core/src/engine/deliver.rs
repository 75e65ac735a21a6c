//! What a read hands out: entries past the delivery cap go to the dead letter instead of the
//! client, and entries of a re-read this window already holds go back uncounted (handing them
//! out again would put one entry in two places at once).

use std::time::Instant;

use super::action::Action;
use super::counts::{held_ids, past_cap, past_the_cap, split_held};
use super::report::FlushReport;
use super::state::Engine;
use super::types::{Item, Read};

impl<E: Item> Engine<E> {
    /// Hands a read of `count` entries at most to the client, less those it must not get.
    /// Returns the report if it did not ride.
    pub(super) fn deliver(
        &mut self,
        now: Instant,
        read: Read<E>,
        count: u32,
        report: Option<FlushReport>,
        answered: Option<u64>,
    ) -> Option<FlushReport> {
        let Read {
            entries,
            redelivery,
            lost,
            mut delayed,
        } = read;
        self.backlog = !redelivery && entries.len() >= count as usize;
        let mut entries = entries;
        if redelivery && self.config.kind.rereads_by_id() {
            let held = held_ids::<E>(
                self.window
                    .held_entries()
                    .map(Item::id)
                    .chain(self.lanes.waiting_ids()),
                self.flushes.values().map(|f| &f.ids),
                self.settled_during_reads.iter().map(|(_, ids)| ids),
            );
            let (again, fresh) = split_held(entries, &held);
            entries = fresh;
            let (again_delayed, fresh_delayed) = delayed
                .into_iter()
                .partition::<Vec<_>, _>(|(e, _)| held.contains(&e.id()));
            delayed = fresh_delayed;
            self.give_back(again, false);
            // The read's count of these was taken back with it already.
            self.give_back(again_delayed.into_iter().map(|(e, _)| e).collect(), true);
        }
        let (mut dead, alive) = past_cap(entries, self.config.max_deliveries);
        for (entry, wait) in delayed {
            if past_the_cap(&entry, self.config.max_deliveries) {
                dead.push(entry);
            } else {
                // Its retry_after is not due: held uncounted, counted and handed out once it is.
                self.lanes.hold(entry, now + wait, false, now);
            }
        }
        if !dead.is_empty() {
            self.dead_letter(dead);
        }
        let alive = if self.config.ordered {
            // Reader requests from the last re-read's on walk through this consumer's own
            // entries, then read new ones: the first fresh read ends the walk.
            let walk = answered.filter(|n| *n >= self.reread_asked && self.reread_asked > 0);
            if !redelivery && !self.reread_owed && walk.is_some() {
                self.lanes.reread_done(self.reread_asked);
            }
            let walk = walk.filter(|_| redelivery).map(|_| self.reread_asked);
            // A re-read asks no more than its room; a fresh read may have asked more.
            let room = if redelivery {
                usize::MAX
            } else {
                (self.config.max_in_flight as usize).saturating_sub(self.window.held())
            };
            let read = alive.len();
            let admitted = self.lanes.admit(alive, walk, room, now);
            if !redelivery {
                self.size_reads(read, admitted.free);
            }
            self.flush_early(now, admitted.behind);
            admitted.out
        } else {
            alive
        };
        match self.window.open_read(alive.clone()) {
            Some(opened) => {
                if self.config.ordered {
                    self.lanes.handed_out(&alive, opened.first_slot);
                }
                self.actions.push(Action::Deliver {
                    read: opened,
                    entries: alive,
                    redelivery,
                    lost,
                    report,
                });
                None
            }
            None => {
                if lost > 0 {
                    self.actions.push(Action::Lost(lost));
                }
                report
            }
        }
    }
}
