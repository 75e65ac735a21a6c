//! Retries in place, in the workers' group: a `retry` or `retry_after` below `max_deliveries`
//! whose flush was reported ok keeps the entry pending with its id, and the entry's next
//! delivery (to any worker) is that same id:
//!
//! - **again**: it is delivered again (nothing else settles it: no copy takes its place);
//! - **counted**: with a count above the retried delivery's (the flush claimed it with its
//!   next delivery's count, and Redis never lowers one);
//! - **not early**: after a `retry_after(d)`, not before `d` has passed since the decision,
//!   whatever happened meanwhile (a sidecar restart, a re-read of the consumer's own pending
//!   entries, another consumer's reclaim: the due time is in Redis).
//!
//! An entry handled past `min_idle` is excused (another consumer may have reclaimed it and
//! settled it before the retry's flush, which then left it alone), and so is one that was
//! dead-lettered (a count Redis ran ahead of the one delivered may reach the cap). Checked on the subscription
//! streams that are not ordered: an ordered one flushes a read in parts, and [`super::order`]
//! holds its retries to their place in the key's order.

use std::collections::{BTreeSet, HashMap};

use super::event::{Decision, Event, Stamped};
use super::verdict::{Anomaly, anomaly};

/// A retry whose flush was reported ok: what its entry's next delivery must show.
#[derive(Debug)]
struct Owed {
    worker: u32,
    decision: Decision,
    count: u32,
    decided_ms: u64,
    flushed_ms: u64,
    /// A `retry_after`'s delay.
    delay_ms: Option<u64>,
}

/// A delivery of a read: its entry, count and (once decided) decision with when.
struct Delivered {
    entry: String,
    count: u32,
    decided: Option<(Decision, u64, Option<u64>)>,
}

/// The checker's state over one pass of the history.
#[derive(Default)]
struct Redelivery {
    /// The deliveries of each read, by (worker, stream, read), until its flush report.
    reads: HashMap<(u32, u32, u64), Vec<Delivered>>,
    /// Each worker's current read.
    reading: HashMap<u32, (u32, u64)>,
    /// Each entry's last delivery: when, and with which count.
    last: HashMap<String, (u64, u32)>,
    owed: HashMap<String, Owed>,
    anomalies: Vec<Anomaly>,
}

/// Checks that retries come back in place (see the module's doc); `excused`: the entries
/// handled past `min_idle` or dead-lettered.
pub(crate) fn check(
    history: &[Stamped],
    max_deliveries: u32,
    excused: impl Fn(&str) -> bool,
) -> Vec<Anomaly> {
    let ordered: BTreeSet<(u32, u32)> = history
        .iter()
        .filter_map(|s| match &s.event {
            Event::InOrder { worker, stream, .. } => Some((*worker, *stream)),
            _ => None,
        })
        .collect();
    let mut state = Redelivery::default();
    for stamped in history {
        state.event(stamped, &ordered, max_deliveries);
    }
    state.never_back();
    state
        .anomalies
        .into_iter()
        .filter(|a| !a.root.as_deref().is_some_and(&excused))
        .collect()
}

impl Redelivery {
    /// One event of the pass: a worker's read, its deliveries and decisions, and a flush
    /// report, which on a stream that is not ordered owes each retry back.
    fn event(&mut self, stamped: &Stamped, ordered: &BTreeSet<(u32, u32)>, max_deliveries: u32) {
        let at_ms = stamped.at_ms;
        match &stamped.event {
            Event::Read {
                worker,
                stream,
                read_id,
            } => {
                self.reading.insert(*worker, (*stream, *read_id));
            }
            Event::Delivered {
                worker,
                entry,
                count,
            } => self.delivered(at_ms, *worker, entry, *count),
            Event::Decided {
                worker,
                entry,
                decision,
            } => {
                if let Some(d) = self.out_on(*worker, entry) {
                    d.decided = Some((*decision, at_ms, None));
                }
            }
            Event::Delayed {
                worker,
                entry,
                delay_ms,
            } => {
                if let Some((_, _, delay)) =
                    self.out_on(*worker, entry).and_then(|d| d.decided.as_mut())
                {
                    *delay = Some(*delay_ms);
                }
            }
            Event::Flushed {
                worker,
                stream,
                read_id,
                ok,
            } => {
                let Some(read) = self.reads.remove(&(*worker, *stream, *read_id)) else {
                    return;
                };
                if *ok && !ordered.contains(&(*worker, *stream)) {
                    self.flushed(at_ms, *worker, read, max_deliveries);
                }
            }
            _ => {}
        }
    }

    /// Each retry owed back that never came again.
    fn never_back(&mut self) {
        for (entry, owed) in std::mem::take(&mut self.owed) {
            self.anomalies.push(anomaly(
                Some(entry),
                format!(
                    "{:?} at count {} by worker {} (decided at {} ms, its flush reported ok at {} \
                     ms), and never delivered again with its id",
                    owed.decision, owed.count, owed.worker, owed.decided_ms, owed.flushed_ms
                ),
            ));
        }
    }

    /// Worker `worker`'s delivery of `entry` in its current read, if it has one.
    fn out_on(&mut self, worker: u32, entry: &str) -> Option<&mut Delivered> {
        let (stream, read_id) = self.reading.get(&worker)?;
        self.reads
            .get_mut(&(worker, *stream, *read_id))?
            .iter_mut()
            .rev()
            .find(|d| d.entry == entry)
    }

    fn delivered(&mut self, at_ms: u64, worker: u32, entry: &str, count: u32) {
        if let Some(owed) = self.owed.remove(entry) {
            self.came_back(entry, &owed, at_ms, count);
        }
        self.last.insert(entry.to_owned(), (at_ms, count));
        if let Some(&(stream, read_id)) = self.reading.get(&worker) {
            self.reads
                .entry((worker, stream, read_id))
                .or_default()
                .push(Delivered {
                    entry: entry.to_owned(),
                    count,
                    decided: None,
                });
        }
    }

    /// A read's flush reported ok: each retry below the cap is owed back, unless it came back
    /// already (a report may follow the read that brought the entry again).
    fn flushed(&mut self, at_ms: u64, worker: u32, read: Vec<Delivered>, max_deliveries: u32) {
        for d in read {
            let Some((decision, decided_ms, delay_ms)) = d.decided else {
                continue;
            };
            if !matches!(decision, Decision::Retry | Decision::RetryAfter)
                || d.count >= max_deliveries
            {
                continue;
            }
            let owed = Owed {
                worker,
                decision,
                count: d.count,
                decided_ms,
                flushed_ms: at_ms,
                delay_ms,
            };
            match self.last.get(&d.entry) {
                Some(&(back_ms, count)) if back_ms > decided_ms => {
                    self.came_back(&d.entry, &owed, back_ms, count);
                }
                _ => {
                    self.owed.insert(d.entry, owed);
                }
            }
        }
    }

    fn came_back(&mut self, entry: &str, owed: &Owed, at_ms: u64, count: u32) {
        let retried = format!(
            "{:?} at count {} by worker {} (decided at {} ms, flushed ok at {} ms)",
            owed.decision, owed.count, owed.worker, owed.decided_ms, owed.flushed_ms
        );
        if count <= owed.count {
            self.anomalies.push(anomaly(
                Some(entry.to_owned()),
                format!(
                    "{retried}, came back at {at_ms} ms with count {count}: not above the \
                     retried delivery's"
                ),
            ));
        }
        if let Some(delay) = owed.delay_ms
            && at_ms < owed.decided_ms + delay
        {
            self.anomalies.push(anomaly(
                Some(entry.to_owned()),
                format!(
                    "{retried} with a delay of {delay} ms, came back at {at_ms} ms: {} ms early",
                    owed.decided_ms + delay - at_ms
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at_ms: u64, event: Event) -> Stamped {
        Stamped { at_ms, event }
    }

    fn read(worker: u32, read_id: u64) -> Event {
        Event::Read {
            worker,
            stream: 1,
            read_id,
        }
    }

    fn delivered(worker: u32, entry: &str, count: u32) -> Event {
        Event::Delivered {
            worker,
            entry: entry.into(),
            count,
        }
    }

    fn decided(worker: u32, entry: &str, decision: Decision) -> Event {
        Event::Decided {
            worker,
            entry: entry.into(),
            decision,
        }
    }

    fn flushed(worker: u32, read_id: u64, ok: bool) -> Event {
        Event::Flushed {
            worker,
            stream: 1,
            read_id,
            ok,
        }
    }

    fn found(history: &[Stamped]) -> Vec<String> {
        check(history, 5, |_| false)
            .iter()
            .map(|a| a.what.clone())
            .collect()
    }

    /// Entry 1-0 retried after 300 ms at count 1 by worker 1, its flush reported ok.
    fn retried_after() -> Vec<Stamped> {
        vec![
            at(0, read(1, 1)),
            at(1, delivered(1, "1-0", 1)),
            at(2, decided(1, "1-0", Decision::RetryAfter)),
            at(
                2,
                Event::Delayed {
                    worker: 1,
                    entry: "1-0".into(),
                    delay_ms: 300,
                },
            ),
            at(10, flushed(1, 1, true)),
        ]
    }

    #[test]
    fn a_retry_that_comes_back_in_place_counted_and_on_time_passes() {
        let mut h = retried_after();
        h.push(at(400, read(2, 1)));
        h.push(at(401, delivered(2, "1-0", 2)));
        assert_eq!(found(&h), Vec::<String>::new());
        // A retry at once, whose report comes after the read that brought it back.
        let h = vec![
            at(0, read(1, 1)),
            at(1, delivered(1, "2-0", 3)),
            at(2, decided(1, "2-0", Decision::Retry)),
            at(5, read(1, 2)),
            at(6, delivered(1, "2-0", 4)),
            at(7, flushed(1, 1, true)),
        ];
        assert_eq!(found(&h), Vec::<String>::new());
    }

    #[test]
    fn a_retry_early_uncounted_or_gone_is_an_anomaly() {
        let mut early = retried_after();
        early.push(at(100, read(1, 2)));
        early.push(at(101, delivered(1, "1-0", 1)));
        let found_early = found(&early);
        assert_eq!(found_early.len(), 2, "{found_early:?}");
        assert!(found_early[0].contains("with count 1: not above"));
        assert!(found_early[1].contains("201 ms early"));
        // Never again: a copy took its place, or it was lost.
        let gone = found(&retried_after());
        assert_eq!(
            gone,
            [
                "RetryAfter at count 1 by worker 1 (decided at 2 ms, its flush reported ok at 10 \
              ms), and never delivered again with its id"
            ]
        );
        // Excused when handled past min_idle; nothing owed for a failed flush or at the cap.
        assert!(check(&retried_after(), 5, |e| e == "1-0").is_empty());
        let mut failed = retried_after();
        failed[4] = at(10, flushed(1, 1, false));
        assert_eq!(found(&failed), Vec::<String>::new());
        let mut at_cap = retried_after();
        at_cap[1] = at(1, delivered(1, "1-0", 5));
        assert_eq!(found(&at_cap), Vec::<String>::new());
    }

    #[test]
    fn ordered_streams_are_left_to_the_order_check() {
        let mut h = retried_after();
        h.insert(
            2,
            at(
                1,
                Event::InOrder {
                    worker: 1,
                    stream: 1,
                    read_id: 1,
                    entry: "1-0".into(),
                    key: "k1".into(),
                    count: 1,
                },
            ),
        );
        assert_eq!(found(&h), Vec::<String>::new());
    }
}
