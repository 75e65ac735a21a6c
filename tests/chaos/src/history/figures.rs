//! A checked run's figures: what happened (deliveries, decisions, faults, dead letters,
//! redrives, refusals) and what the promises allowed (duplicates at least once, losses at most
//! once), for the run's report.

use std::collections::BTreeMap;

use super::audit;
use super::end::EndState;
use super::event::{Decision, Event, Said, Stamped};
use super::facts::{Facts, kept_runs};
use super::refusals::{Touched, refusals_touched};
use super::verdict::Promise;

/// Figures of a checked run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub roots: usize,
    pub deliveries: usize,
    pub decisions: BTreeMap<Decision, usize>,
    pub faults: BTreeMap<String, usize>,
    /// Kept side effects that ran more than once for their root (at least once allows them).
    pub duplicate_effects: i64,
    pub dead_letters: usize,
    /// Dead letters by how far their delivery count ran past the highest count a worker saw
    /// of the entry (a worker that saw none: past 0). Redis counts a delivery per read, and a
    /// read nobody got (a sidecar killed holding it) is taken back only by a clean close.
    pub dead_counted_past_seen: BTreeMap<u32, usize>,
    pub flushes: usize,
    /// Entries known by payload that were delivered fresh (count 1) more than once: a publish
    /// written twice.
    pub duplicate_publishes: i64,
    /// At most once: entries neither kept, dropped nor dead-lettered (a crash took them).
    pub lost_at_most_once: usize,
    /// Dead letters the dead-letter service redrove, and of those the ones it put back into
    /// their group with their id.
    pub redriven: usize,
    pub redriven_in_place: usize,
    /// What the audit group read.
    pub audit: audit::Figures,
    /// Deliveries on ordered subscription streams, and how many such streams: what the
    /// per-key order check covered.
    pub ordered_deliveries: usize,
    pub ordered_streams: usize,
    /// Deliveries and keys checked for order across a partitioned stream's group.
    pub across_deliveries: usize,
    pub across_keys: usize,
    /// The refusals the nemesis injected, by kind, with the flush reports they touched.
    pub refusals: BTreeMap<String, Touched>,
    /// Requeued entries Redis refused, by reason, over the whole run (from the flush reports
    /// the workers got).
    pub requeue_refused: BTreeMap<String, usize>,
    /// Roots settled without their kept side effect because Redis refused it in pipeline mode,
    /// as their flush report said (Redis has no rollback).
    pub effects_refused: usize,
    /// Entries the sidecars' logs named: settled without the side effect Redis refused, and
    /// retries kept in place that another consumer claimed.
    pub said_effects_refused: usize,
    pub said_claimed_away: usize,
}

/// The run's figures: what happened, and what the promises allowed.
pub(super) fn figures(
    history: &[Stamped],
    end: &EndState,
    facts: &Facts,
    promise: Promise,
) -> Figures {
    let mut figures = Figures {
        roots: facts.all_roots.len(),
        dead_letters: end.dead_letters.len() + facts.redriven_dead.len(),
        ..Figures::default()
    };
    for stamped in history {
        match &stamped.event {
            Event::Delivered { .. } => figures.deliveries += 1,
            Event::Decided { decision, .. } => {
                *figures.decisions.entry(*decision).or_default() += 1;
            }
            Event::Flushed { .. } => figures.flushes += 1,
            Event::Fault(name) => {
                let kind = name.split_whitespace().next().unwrap_or(name).to_owned();
                *figures.faults.entry(kind).or_default() += 1;
            }
            Event::Refused { requeues, .. } => {
                for reason in requeues {
                    *figures.requeue_refused.entry(reason.clone()).or_default() += 1;
                }
            }
            Event::Redriven { .. } => {
                figures.redriven += 1;
                figures.redriven_in_place +=
                    usize::from(stamped.event.in_place_redrive().is_some());
            }
            Event::Said { said, entries, .. } => match said {
                Said::EffectsRefused => figures.said_effects_refused += entries.len(),
                Said::ClaimedAway => figures.said_claimed_away += entries.len(),
            },
            Event::Late { .. }
            | Event::Read { .. }
            | Event::InOrder { .. }
            | Event::Undone(_)
            | Event::Settling
            | Event::Delayed { .. }
            | Event::Audited { .. }
            | Event::AuditAcked { .. }
            | Event::Ended { .. }
            | Event::Came { .. } => {}
        }
    }
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for stamped in history {
        if let Event::Delivered { entry, count, .. } = &stamped.event {
            let highest = seen.entry(entry.as_str()).or_default();
            *highest = (*highest).max(*count);
        }
    }
    for (entry, count) in end.dead_letters.iter().chain(&facts.redriven_dead) {
        let past = count.saturating_sub(seen.get(entry.as_str()).copied().unwrap_or(0));
        *figures.dead_counted_past_seen.entry(past).or_default() += 1;
    }
    figures.refusals = refusals_touched(history);
    for r in &facts.all_roots {
        let copies = facts.copies(r, promise);
        figures.duplicate_effects += (kept_runs(end, r) - copies).max(0);
        figures.duplicate_publishes += copies - 1;
        if promise.at_most_once && facts.unsettled(end, r) {
            figures.lost_at_most_once += 1;
        }
        if facts.effect_refused(end, r) {
            figures.effects_refused += 1;
        }
    }
    figures
}
