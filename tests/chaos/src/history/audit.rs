//! Exactly once in the audit group: the second group on the stream, read by the campaign
//! itself behind the workers, sees every published entry once and nothing else. A worker's
//! `retry` or `retry_after`, and a redrive, act in the workers' group alone: a copy appended to
//! the stream, or an entry put back into the audit group, is something every other group of the
//! stream would handle again.
//!
//! - **no copy**: an entry that carries `h:x-window-original-id` was never published by a
//!   producer. The one copy allowed is the fresh entry a redrive wrote when it could not put
//!   its dead letter back into the group (its entry was trimmed): the dead-letter service names
//!   it (`Redriven.copy`).
//! - **once**: an entry read a second time after its first read. The reader's own
//!   at-least-once is not a second sighting: a fault may take a read's reply or its `XACK`, and
//!   then the entry comes back from the reader's own pending entries (`XREADGROUP … 0`) until an
//!   `XACK` is confirmed. Nor is a failover's: a `primary-kill` loses what the replica had not
//!   received yet (the reader does not wait for replicas), so an entry read or acknowledged just
//!   before it may come again after it.
//! - **nothing foreign**: once the reader drained the stream, the audit group has nothing
//!   pending; an entry pending there on another consumer was put there by someone else (an
//!   `XCLAIM` into the wrong group).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::end::EndState;
use super::event::{Copied, Event, Stamped};
use super::verdict::{Anomaly, anomaly};

/// How long before a failover's fault a read or an ack may still be lost to it: the fault is
/// logged, then the node is killed.
const FAILOVER_REACH_MS: u64 = 2_000;

/// What the audit group read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    /// Entries it read, and reads of them in all.
    pub entries: usize,
    pub reads: usize,
    /// Reads again from its own pending entries, before an ack was confirmed (the reader's own
    /// at-least-once).
    pub own_rereads: usize,
    /// Reads again after a failover took what the reader had done.
    pub after_failover: usize,
    /// Fresh entries redrives wrote (allowed copies).
    pub redrive_copies: usize,
}

/// One read of an entry by the audit reader.
struct Sighting {
    at_ms: u64,
    own: bool,
}

/// Checks the audit group's reads in the history and its pending entries at the end.
pub(crate) fn check(history: &[Stamped], end: &EndState) -> (Vec<Anomaly>, Figures) {
    let mut audit = Audit::new(history);
    for stamped in history {
        match &stamped.event {
            Event::Audited { entry, own, copy } => {
                audit.audited(stamped.at_ms, entry, *own, copy.as_ref());
            }
            Event::AuditAcked { entries } => {
                for entry in entries {
                    audit.acked.insert(entry, stamped.at_ms);
                }
            }
            _ => {}
        }
    }
    audit.figures.entries = audit.sightings.len();
    audit.report_doubled();
    audit.anomalies.extend(
        end.audit_pending
            .iter()
            .map(|(entry, consumer, deliveries)| {
                anomaly(
                    Some(entry.clone()),
                    format!(
                        "pending in the audit group on {consumer} (delivered {deliveries} times) \
                     once its reader had drained the stream"
                    ),
                )
            }),
    );
    (audit.anomalies, audit.figures)
}

/// The check's state over one pass of the history.
struct Audit<'a> {
    /// The fresh entries redrives wrote: the copies allowed.
    redrive_copies: BTreeSet<&'a str>,
    /// When a failover's fault was logged.
    failovers: Vec<u64>,
    figures: Figures,
    anomalies: Vec<Anomaly>,
    copies_reported: BTreeSet<&'a str>,
    sightings: BTreeMap<&'a str, Vec<Sighting>>,
    /// Per entry: when an ack of it was confirmed, and the time of its last read or ack.
    acked: HashMap<&'a str, u64>,
    doubled: BTreeSet<&'a str>,
}

impl<'a> Audit<'a> {
    fn new(history: &'a [Stamped]) -> Self {
        let redrive_copies = history
            .iter()
            .filter_map(|s| match &s.event {
                Event::Redriven { copy, .. } if s.event.in_place_redrive().is_none() => {
                    Some(copy.as_str())
                }
                _ => None,
            })
            .collect();
        let failovers = history
            .iter()
            .filter(|s| matches!(&s.event, Event::Fault(f) if f.starts_with("primary-kill")))
            .map(|s| s.at_ms)
            .collect();
        Audit {
            redrive_copies,
            failovers,
            figures: Figures::default(),
            anomalies: Vec::new(),
            copies_reported: BTreeSet::new(),
            sightings: BTreeMap::new(),
            acked: HashMap::new(),
            doubled: BTreeSet::new(),
        }
    }

    fn failover_between(&self, from: u64, to: u64) -> bool {
        self.failovers
            .iter()
            .any(|f| f + FAILOVER_REACH_MS >= from && *f <= to)
    }

    /// A read of `entry` at `at_ms`: a copy no redrive wrote is reported once; a read after
    /// the first is the reader's own again (its ack not confirmed), a failover's, or a second
    /// sighting.
    fn audited(&mut self, at_ms: u64, entry: &'a str, own: bool, copy: Option<&Copied>) {
        self.figures.reads += 1;
        if let Some(copy) = copy {
            if self.redrive_copies.contains(entry) {
                self.figures.redrive_copies += usize::from(self.copies_reported.insert(entry));
            } else if self.copies_reported.insert(entry) {
                self.anomalies.push(anomaly(
                    Some(entry.to_owned()),
                    format!(
                        "the audit group read it, but no producer published it: a copy of {} \
                         ({}) appended to the stream",
                        copy.of, copy.marks
                    ),
                ));
            }
        }
        let last = self
            .sightings
            .get(entry)
            .and_then(|seen| seen.last())
            .map(|s| s.at_ms);
        let again = match (last, self.acked.get(entry).copied()) {
            (None, _) => None,
            // Its ack was not confirmed: the reader's own pending entry again.
            (Some(_), None) if own => {
                self.figures.own_rereads += 1;
                None
            }
            (Some(last), ack) => Some(ack.unwrap_or(last).max(last)),
        };
        if let Some(since) = again {
            if self.failover_between(since, at_ms) {
                self.figures.after_failover += 1;
            } else {
                self.doubled.insert(entry);
            }
        }
        self.sightings
            .entry(entry)
            .or_default()
            .push(Sighting { at_ms, own });
    }

    /// Each entry read more than once: when, how, and when its ack was confirmed.
    fn report_doubled(&mut self) {
        for entry in &self.doubled {
            let reads: Vec<String> = self.sightings[entry]
                .iter()
                .map(|s| {
                    let how = if s.own { "from its own pending" } else { "new" };
                    format!("{} ms {how}", s.at_ms)
                })
                .collect();
            let ack = self
                .acked
                .get(entry)
                .map_or_else(String::new, |t| format!(", its ack confirmed at {t} ms"));
            self.anomalies.push(anomaly(
                Some((*entry).to_owned()),
                format!(
                    "the audit group read it {} times ({}{ack}): exactly once promised",
                    reads.len(),
                    reads.join(", ")
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Copied;
    use super::*;

    fn at(at_ms: u64, event: Event) -> Stamped {
        Stamped { at_ms, event }
    }

    fn audited(entry: &str, own: bool) -> Event {
        Event::Audited {
            entry: entry.into(),
            own,
            copy: None,
        }
    }

    fn acked(entries: &[&str]) -> Event {
        Event::AuditAcked {
            entries: entries.iter().map(|e| e.to_string()).collect(),
        }
    }

    fn found(history: &[Stamped], end: &EndState) -> Vec<String> {
        check(history, end)
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn each_entry_once_and_the_reader_s_own_rereads_pass() {
        let history = vec![
            at(0, audited("1-0", false)),
            at(1, audited("2-0", false)),
            at(2, acked(&["1-0"])),
            // 2-0's ack was taken by a fault: read again from the reader's own pending.
            at(500, audited("2-0", true)),
            at(501, acked(&["2-0"])),
        ];
        let (anomalies, figures) = check(&history, &EndState::default());
        assert_eq!(anomalies, vec![]);
        assert_eq!(
            (figures.entries, figures.reads, figures.own_rereads),
            (2, 3, 1)
        );
    }

    #[test]
    fn an_entry_read_again_after_its_ack_or_as_new_twice_is_an_anomaly() {
        let history = vec![
            at(0, audited("1-0", false)),
            at(1, acked(&["1-0"])),
            at(900, audited("1-0", true)),
            at(1_000, audited("2-0", false)),
            at(1_500, audited("2-0", false)),
        ];
        assert_eq!(
            found(&history, &EndState::default()),
            [
                "entry 1-0: the audit group read it 2 times (0 ms new, 900 ms from its own \
                 pending, its ack confirmed at 1 ms): exactly once promised",
                "entry 2-0: the audit group read it 2 times (1000 ms new, 1500 ms new): \
                 exactly once promised",
            ]
        );
        // A failover between the two takes what the replica had not received.
        let mut failover = history;
        failover.insert(2, at(500, Event::Fault("primary-kill 7000".into())));
        let (anomalies, figures) = check(&failover, &EndState::default());
        assert_eq!(anomalies, vec![]);
        assert_eq!(figures.after_failover, 2);
    }

    #[test]
    fn a_copy_is_an_anomaly_unless_a_redrive_wrote_it() {
        let copy = |entry: &str| Event::Audited {
            entry: entry.into(),
            own: false,
            copy: Some(Copied {
                of: "1-0".into(),
                marks: "h:x-window-attempts 2".into(),
            }),
        };
        let history = vec![
            at(0, audited("1-0", false)),
            at(1, copy("5-0")),
            at(
                2,
                Event::Redriven {
                    dead: "9-0".into(),
                    origin: "1-0".into(),
                    deliveries: 5,
                    copy: "6-0".into(),
                },
            ),
            at(3, copy("6-0")),
        ];
        let (anomalies, figures) = check(&history, &EndState::default());
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "entry 5-0: the audit group read it, but no producer published it: a copy of 1-0 \
              (h:x-window-attempts 2) appended to the stream"
            ]
        );
        assert_eq!(figures.redrive_copies, 1);
    }

    #[test]
    fn an_entry_left_pending_in_the_audit_group_is_an_anomaly() {
        let end = EndState {
            audit_pending: vec![("3-0".into(), "w1".into(), 1)],
            ..EndState::default()
        };
        assert_eq!(
            found(&[], &end),
            [
                "entry 3-0: pending in the audit group on w1 (delivered 1 times) once its reader \
              had drained the stream"
            ]
        );
    }
}
