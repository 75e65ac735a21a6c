//! What the refusals the nemesis injected touched: per kind, the flush reports the workers took
//! while Redis refused (and a moment after), how many failed, with a refusal's error, with
//! requeues or side effects refused. Figures, not anomalies: a refusal is allowed to fail a
//! flush.

use std::collections::BTreeMap;
use std::fmt;

use super::event::{Event, Stamped};

/// What the refusals of one kind touched: the flush reports the workers took from a refusal's
/// start until [`AFTER_UNDO_MS`] after its undo (or the next refusal's start, or the end of
/// the faults).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Touched {
    pub injected: usize,
    pub reports: usize,
    /// Of those, the ones with `ok` false, and of these the ones whose first error is a
    /// refusal (out of memory, an ACL, a key's type, a script gone, busy, read-only).
    pub failed: usize,
    pub refused: usize,
    /// Of those, the ones with `requeue_refused` entries, and how many entries.
    pub requeue_refused: usize,
    pub requeue_refused_entries: usize,
    /// Of those, the ones with side effects Redis refused while the settle stood.
    pub effects_refused: usize,
}

/// How long after a refusal's undo a flush report still counts as touched by it: a flush
/// refused just before the undo is reported a moment later, and a worker asleep on a slow ack
/// (4.5 s) takes the reports that came meanwhile when it wakes.
pub(crate) const AFTER_UNDO_MS: u64 = 5_000;

/// The classes of error that are Redis refusing a write (the others: a connection lost, a
/// timeout, a slot moving).
const REFUSAL_ERRORS: [&str; 6] = ["oom", "noperm", "wrongtype", "noscript", "busy", "readonly"];

impl fmt::Display for Touched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x: {} flush reports, {} failed ({} refused by Redis), {} with requeue_refused \
             ({} entries)",
            self.injected,
            self.reports,
            self.failed,
            self.refused,
            self.requeue_refused,
            self.requeue_refused_entries
        )?;
        if self.effects_refused > 0 {
            write!(f, ", {} with side effects refused", self.effects_refused)?;
        }
        Ok(())
    }
}

/// Each refusal kind's windows (from its fault to [`AFTER_UNDO_MS`] after its undo, the next
/// refusal or the end of the faults) and the
/// flush reports received within them. A refusal is a fault of one of
/// [`crate::refusal::Refusal::KINDS`]; one never undone lasts to the end of the history.
pub(super) fn refusals_touched(history: &[Stamped]) -> BTreeMap<String, Touched> {
    let windows = windows(history);
    let mut touched: BTreeMap<String, Touched> = BTreeMap::new();
    for (kind, _, _) in &windows {
        touched.entry(kind.clone()).or_default().injected += 1;
    }
    for stamped in history {
        let at = stamped.at_ms;
        let Some((kind, _, _)) = windows
            .iter()
            .find(|(_, from, to)| (*from..=*to).contains(&at))
        else {
            continue;
        };
        let figures = touched.entry(kind.clone()).or_default();
        match &stamped.event {
            Event::Flushed { ok, .. } => {
                figures.reports += 1;
                figures.failed += usize::from(!ok);
            }
            Event::Refused {
                error,
                requeues,
                kept_unwritten,
                ..
            } => {
                figures.refused += usize::from(REFUSAL_ERRORS.contains(&error.as_str()));
                if !requeues.is_empty() {
                    figures.requeue_refused += 1;
                    figures.requeue_refused_entries += requeues.len();
                }
                figures.effects_refused += usize::from(!kept_unwritten.is_empty());
            }
            _ => {}
        }
    }
    touched
}

/// Each refusal's window: its kind, from its fault to [`AFTER_UNDO_MS`] after its undo, cut
/// short where the next refusal begins or the faults end.
fn windows(history: &[Stamped]) -> Vec<(String, u64, u64)> {
    let mut windows: Vec<(String, u64, u64)> = Vec::new();
    let mut open: Option<(String, u64)> = None;
    for stamped in history {
        match &stamped.event {
            Event::Fault(name) => {
                let kind = name.split_whitespace().next().unwrap_or(name);
                if crate::refusal::Refusal::KINDS.contains(&kind) {
                    if let Some((kind, from)) = open.take() {
                        windows.push((kind, from, stamped.at_ms));
                    }
                    // The window before ends where this one begins.
                    if let Some(last) = windows.last_mut() {
                        last.2 = last.2.min(stamped.at_ms.saturating_sub(1));
                    }
                    open = Some((kind.to_owned(), stamped.at_ms));
                }
            }
            Event::Undone(kind) => {
                if let Some((open_kind, from)) = open.take_if(|(k, _)| k == kind) {
                    windows.push((open_kind, from, stamped.at_ms + AFTER_UNDO_MS));
                }
            }
            // The quiesce acks the backlog the faults left: not the refusals' doing.
            Event::Settling => {
                if let Some((kind, from)) = open.take() {
                    windows.push((kind, from, stamped.at_ms));
                }
                if let Some(last) = windows.last_mut() {
                    last.2 = last.2.min(stamped.at_ms);
                }
            }
            _ => {}
        }
    }
    if let Some((kind, from)) = open {
        windows.push((kind, from, u64::MAX));
    }
    windows
}
