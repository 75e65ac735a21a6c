//! Per-key order across the replicas of a group, on a partitioned stream: every worker is an
//! ordered replica of one group, a key's entries all sit in one partition, and each partition
//! is read by one replica at a time, handed over as replicas join, leave, die or stall. So per
//! key, whichever worker a delivery reaches:
//!
//! - **one holder**: no delivery of a key while an earlier delivery of it is still undecided
//!   at another worker that then acts on it. Acting is what Redis takes from it: an outcome
//!   whose flush is reported done. A delivery whose stream ended first (its sidecar killed or
//!   drained, its connection cut, the worker gone or abandoning the read), whose flush failed
//!   or was refused (`ALREADY_SETTLED` from a fenced partition, which writes nothing more) or
//!   never reported, can no longer be acted on, and excuses the overlap: the new owner took the
//!   partition only after the old reading ended or its lease lapsed. A delivery decided before
//!   the next one went out is not held any more: its outcome left the worker, and the old
//!   reading flushes it before it frees the partition (or never, when fenced).
//! - **retries in place**: once a `retry` or `retry_after` below `max_deliveries` is reported
//!   flushed, the key's next delivery, at whichever worker, is that entry again: it stays
//!   pending on the partition's one consumer name, which the next owner reads first. Excused
//!   for an entry later dead-lettered (it may have gone past the cap on the way).
//! - **no overtaking**: an entry whose fate is unknown (its flush failed or was never reported,
//!   its reading ended with it out) may come back first or never (a lost reply may have
//!   settled it); once a later entry of its key was handed out, it must not come back, unless
//!   a redrive put it back into the group.
//! - **stream order**: entries of a key reach the group for the first time (count 1) in the
//!   order of their ids (a partition is one stream, and a key one lane of it). A first
//!   delivery seen with a higher count followed one lost on the way, and says nothing of when
//!   that one went out.
//!
//! An entry earlier in the partition than the one due or unsettled passes neither retries in
//! place nor no overtaking: a reading takes the pending entries in stream order, and an earlier
//! one may be pending too (a dead letter a redrive put back with its id, or one whose fate the
//! workers could not know).
//!
//! Each delivery is placed when it came to its worker (the `Came` a worker logs as a read
//! arrives, also while it sleeps on a slow ack), not when the worker took it up: a worker
//! asleep holds reads that a partition's next owner may follow with later ones. A decision
//! belongs to the read its worker is answering (its last `Read`).
//!
//! What one stream alone shows ([`super::order`]) is left to that check: an overlap, a retry
//! or an overtaking that stays on one worker's stream is reported there, not twice. Within a
//! partition only its `partition-<n>` consumer holds entries, so no reclaim by another
//! consumer excuses anything here: a slow ack past `min_idle` keeps its partition (the lease,
//! renewed by the sidecar, holds it) and its entry (its own consumer's).

use std::collections::{BTreeSet, HashMap};

use super::event::{Decision, Event, Stamped, before, id_order, reading};
use super::verdict::{Anomaly, anomaly};

/// A worker's subscription stream: (worker, stream).
type On = (u32, u32);

/// A delivery of a key out at a worker: handed out, its flush not reported yet.
#[derive(Debug)]
struct Out {
    on: On,
    entry: String,
    read_id: u64,
    count: u32,
    at_ms: u64,
    decision: Option<Decision>,
    /// Deliveries of the key elsewhere while this one was undecided: anomalies once its flush
    /// is reported done.
    overlapped: Vec<String>,
}

impl Out {
    /// Whether its worker sent an outcome for it.
    fn decided(&self) -> bool {
        self.decision.is_some_and(|d| d != Decision::Abandon)
    }
}

/// One key across the group.
#[derive(Debug, Default)]
struct Lane {
    out: Vec<Out>,
    /// Retried in place and reported flushed (where, when): the key's next delivery.
    owed: Option<(String, On, u64)>,
    /// Fate unknown, and no other entry of the key since (where it was out).
    unsure: HashMap<String, On>,
    /// Unsure entries another entry of the key followed: (that entry, where, where the unsure
    /// one was out, when).
    overtaken: HashMap<String, (String, On, On, u64)>,
    /// The highest id of the key's entries handed out so far, and its entry.
    newest: Option<((u64, u64), String)>,
}

/// A delivery as the check takes it.
struct Delivery<'a> {
    on: On,
    read_id: u64,
    entry: &'a str,
    key: &'a str,
    count: u32,
    at_ms: u64,
}

struct Across<'a> {
    max_deliveries: u32,
    dead_lettered: &'a dyn Fn(&str) -> bool,
    root: &'a dyn Fn(&str) -> Option<String>,
    /// Entries a redrive put back into the group with their id.
    redriven: BTreeSet<String>,
    lanes: HashMap<String, Lane>,
    /// The read each worker is answering (its last `Read`): its decisions are of that read's
    /// deliveries (one stream may carry an entry twice, from two readings of its partition).
    answering: HashMap<u32, (u32, u64)>,
    /// Entries handed out before.
    seen: BTreeSet<String>,
    anomalies: Vec<Anomaly>,
    deliveries: usize,
}

/// What the check saw: deliveries and keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    pub deliveries: usize,
    pub keys: usize,
}

/// Checks per-key order across the workers of a partitioned stream's group; `root` names the
/// entry an anomaly is about; `dead_lettered`: whether an entry was ever dead-lettered.
pub(crate) fn check(
    history: &[Stamped],
    max_deliveries: u32,
    root: impl Fn(&str) -> Option<String>,
    dead_lettered: impl Fn(&str) -> bool,
) -> (Vec<Anomaly>, Checked) {
    let mut across = Across {
        max_deliveries,
        dead_lettered: &dead_lettered,
        root: &root,
        redriven: history
            .iter()
            .filter_map(|s| s.event.in_place_redrive().map(str::to_owned))
            .collect(),
        lanes: HashMap::new(),
        answering: HashMap::new(),
        seen: BTreeSet::new(),
        anomalies: Vec::new(),
        deliveries: 0,
    };
    for stamped in history {
        across.event(stamped);
    }
    let checked = Checked {
        deliveries: across.deliveries,
        keys: across.lanes.len(),
    };
    (across.anomalies, checked)
}

impl Across<'_> {
    fn event(&mut self, stamped: &Stamped) {
        let at_ms = stamped.at_ms;
        match &stamped.event {
            Event::Read {
                worker,
                stream,
                read_id,
            } => {
                // A worker reads on one stream at a time: a new one means the others ended
                // (a killed worker logs no end of its own).
                self.end(|on| on.0 == *worker && on.1 != *stream);
                self.answering.insert(*worker, (*stream, *read_id));
            }
            Event::Ended { worker, stream } => self.end(|on| on == (*worker, *stream)),
            Event::Came {
                worker,
                stream,
                read_id,
                deliveries,
            } => {
                for (entry, key, count) in deliveries {
                    self.deliver(&Delivery {
                        on: (*worker, *stream),
                        read_id: *read_id,
                        entry,
                        key,
                        count: *count,
                        at_ms,
                    });
                }
            }
            Event::Decided {
                worker,
                entry,
                decision,
            } => {
                let Some((stream, read_id)) = self.answering.get(worker) else {
                    return;
                };
                let on = (*worker, *stream);
                for lane in self.lanes.values_mut() {
                    for out in lane.out.iter_mut() {
                        if out.on == on && out.read_id == *read_id && out.entry == *entry {
                            out.decision = Some(*decision);
                        }
                    }
                }
            }
            Event::Flushed {
                worker,
                stream,
                read_id,
                ok,
            } => self.flushed((*worker, *stream), *read_id, *ok, at_ms),
            _ => {}
        }
    }

    /// The deliveries out on the streams `ended` picks can no longer be acted on: their fate
    /// is unknown, and what overlapped them is excused.
    fn end(&mut self, ended: impl Fn(On) -> bool) {
        for lane in self.lanes.values_mut() {
            let (gone, kept): (Vec<Out>, Vec<Out>) = lane.out.drain(..).partition(|o| ended(o.on));
            lane.out = kept;
            for out in gone {
                lane.unsure.insert(out.entry, out.on);
            }
        }
    }

    /// A flush report: the read's decided deliveries on that stream are settled, owed (a
    /// retry in place) or unsure (a failure); a done flush of one that overlapped a delivery
    /// elsewhere is an anomaly.
    fn flushed(&mut self, on: On, read_id: u64, ok: bool, at_ms: u64) {
        let max = self.max_deliveries;
        for (key, lane) in self.lanes.iter_mut() {
            let (done, kept): (Vec<Out>, Vec<Out>) = lane
                .out
                .drain(..)
                .partition(|o| o.on == on && o.read_id == read_id && o.decided());
            lane.out = kept;
            for out in done {
                if !ok {
                    lane.unsure.insert(out.entry, out.on);
                    continue;
                }
                for overlap in &out.overlapped {
                    let decision = out.decision.map(|d| format!("{d:?}")).unwrap_or_default();
                    self.anomalies.push(anomaly(
                        (self.root)(&out.entry),
                        format!(
                            "worker {} got {} (key {key}, read {}, count {}) at {} ms and \
                             decided it ({decision}, flush reported done at {at_ms} ms) after \
                             {overlap}: two workers held the key at once",
                            out.on.0, out.entry, out.read_id, out.count, out.at_ms
                        ),
                    ));
                }
                if matches!(out.decision, Some(Decision::Retry | Decision::RetryAfter))
                    && out.count < max
                {
                    lane.owed = Some((out.entry, out.on, at_ms));
                }
            }
        }
    }

    fn deliver(&mut self, d: &Delivery<'_>) {
        self.deliveries += 1;
        let on_text = format!(
            "worker {} got {} (key {}, read {}, count {}) at {} ms on its stream {}",
            d.on.0, d.entry, d.key, d.read_id, d.count, d.at_ms, d.on.1
        );
        let first = self.seen.insert(d.entry.to_owned());
        let lane = self.lanes.entry(d.key.to_owned()).or_default();
        // An earlier reading of the partition on this stream ended before this one began.
        let (gone, kept): (Vec<Out>, Vec<Out>) = lane
            .out
            .drain(..)
            .partition(|o| o.on == d.on && reading(o.read_id) != reading(d.read_id));
        lane.out = kept;
        for out in gone {
            lane.unsure.insert(out.entry, out.on);
        }
        let mut found: Vec<(String, String)> = Vec::new();
        for out in lane.out.iter_mut().filter(|o| o.on != d.on && !o.decided()) {
            out.overlapped.push(on_text.clone());
        }
        if lane
            .owed
            .as_ref()
            .is_some_and(|(owed, ..)| before(d.entry, owed))
        {
            // Still due: the next after this one.
        } else if let Some((owed, owed_on, since_ms)) = lane.owed.take()
            && owed != d.entry
            && owed_on != d.on
            && !(self.dead_lettered)(&owed)
        {
            found.push((
                owed.clone(),
                format!(
                    "{on_text}, but {owed}, retried in place by worker {} and reported flushed \
                     at {since_ms} ms, was due first",
                    owed_on.0
                ),
            ));
        }
        if let Some((by, by_on, origin, at_ms)) = lane.overtaken.remove(d.entry)
            && !(origin == by_on && by_on == d.on)
            && !self.redriven.contains(d.entry)
        {
            found.push((
                d.entry.to_owned(),
                format!(
                    "{on_text}, after {by} of its key (worker {}, delivered at {at_ms} ms) had \
                     overtaken it unsettled (it was out at worker {})",
                    by_on.0, origin.0
                ),
            ));
        }
        // Only a count of 1 is the entry's first hand-out: a higher one on the first delivery
        // a worker saw follows one lost on the way (a read that went down with its stream).
        let first = first && d.count == 1 && !self.redriven.contains(d.entry);
        if first && let Some(id) = id_order(d.entry) {
            match &lane.newest {
                Some((newest, by)) if id < *newest => found.push((
                    d.entry.to_owned(),
                    format!(
                        "{on_text}: its first delivery, after {by} of its key, later in the \
                         stream, had gone out"
                    ),
                )),
                Some((newest, _)) if id <= *newest => {}
                _ => lane.newest = Some((id, d.entry.to_owned())),
            }
        }
        for (entry, origin) in std::mem::take(&mut lane.unsure) {
            if entry == d.entry {
                continue;
            }
            if before(d.entry, &entry) {
                lane.unsure.insert(entry, origin);
            } else {
                lane.overtaken
                    .insert(entry, (d.entry.to_owned(), d.on, origin, d.at_ms));
            }
        }
        lane.out.push(Out {
            on: d.on,
            entry: d.entry.to_owned(),
            read_id: d.read_id,
            count: d.count,
            at_ms: d.at_ms,
            decision: None,
            overlapped: Vec::new(),
        });
        for (about, what) in found {
            self.anomalies.push(anomaly((self.root)(&about), what));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events in order, 10 ms apart.
    fn history(events: Vec<Vec<Event>>) -> Vec<Stamped> {
        events
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, event)| Stamped {
                at_ms: 10 * i as u64,
                event,
            })
            .collect()
    }

    fn read(worker: u32, read_id: u64) -> Event {
        Event::Read {
            worker,
            stream: worker,
            read_id,
        }
    }

    /// Worker `worker` gets `entry` of key `key` in read `read_id` on its stream (numbered as
    /// the worker).
    fn got(worker: u32, read_id: u64, entry: &str, key: &str, count: u32) -> Vec<Event> {
        vec![
            Event::Came {
                worker,
                stream: worker,
                read_id,
                deliveries: vec![(entry.into(), key.into(), count)],
            },
            read(worker, read_id),
            Event::Delivered {
                worker,
                entry: entry.into(),
                count,
            },
        ]
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
            stream: worker,
            read_id,
            ok,
        }
    }

    fn anomalies(history: &[Stamped]) -> Vec<String> {
        check(history, 5, |e| Some(e.to_owned()), |_| false)
            .0
            .iter()
            .map(|a| a.what.clone())
            .collect()
    }

    #[test]
    fn a_key_handed_over_between_workers_in_order_passes() {
        let h = history(vec![
            got(1, 1, "0/1-0", "a", 1),
            vec![decided(1, "0/1-0", Decision::Retry), flushed(1, 1, true)],
            // The partition moves to worker 2: the retried entry first, then the next.
            vec![Event::Ended {
                worker: 1,
                stream: 1,
            }],
            got(2, 1, "0/1-0", "a", 2),
            vec![decided(2, "0/1-0", Decision::Ack), flushed(2, 1, true)],
            got(2, 2, "0/2-0", "a", 1),
            // Another key at worker 1 meanwhile.
            got(1, 2, "1/1-0", "b", 1),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
        let (_, checked) = check(&h, 5, |e| Some(e.to_owned()), |_| false);
        assert_eq!(
            checked,
            Checked {
                deliveries: 4,
                keys: 2
            }
        );
    }

    #[test]
    fn two_workers_holding_a_key_at_once_is_an_anomaly_once_the_first_acts() {
        let overlap = vec![
            got(1, 1, "0/1-0", "a", 1),
            // Undecided at worker 1 when worker 2 gets the next entry of the key.
            got(2, 1, "0/2-0", "a", 1),
        ];
        let mut h = overlap.clone();
        h.push(vec![
            decided(1, "0/1-0", Decision::Ack),
            flushed(1, 1, true),
        ]);
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("two workers held the key at once"),
            "{found:?}"
        );
        // The same entry again elsewhere, too.
        let h = history(vec![
            got(1, 1, "0/1-0", "a", 1),
            got(2, 1, "0/1-0", "a", 2),
            vec![decided(1, "0/1-0", Decision::Ack), flushed(1, 1, true)],
        ]);
        assert_eq!(anomalies(&h).len(), 1);
        // Its stream ended first, its flush failed (a fenced partition refuses it) or was
        // never reported: it could not act.
        let mut ended = overlap.clone();
        ended.push(vec![
            Event::Ended {
                worker: 1,
                stream: 1,
            },
            decided(1, "0/1-0", Decision::Ack),
        ]);
        assert_eq!(anomalies(&history(ended)), Vec::<String>::new());
        let mut failed = overlap.clone();
        failed.push(vec![
            decided(1, "0/1-0", Decision::Ack),
            flushed(1, 1, false),
        ]);
        assert_eq!(anomalies(&history(failed)), Vec::<String>::new());
        let mut unreported = overlap;
        unreported.push(vec![decided(1, "0/1-0", Decision::Ack)]);
        assert_eq!(anomalies(&history(unreported)), Vec::<String>::new());
        // Decided before the next went out: its outcome had left the worker.
        let h = history(vec![
            got(1, 1, "0/1-0", "a", 1),
            vec![decided(1, "0/1-0", Decision::Ack)],
            got(2, 1, "0/2-0", "a", 1),
            vec![flushed(1, 1, true)],
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
    }

    #[test]
    fn a_later_entry_handed_out_while_a_retry_in_place_is_due_is_an_anomaly() {
        let retried = vec![
            got(1, 1, "0/1-0", "a", 1),
            vec![
                decided(1, "0/1-0", Decision::RetryAfter),
                flushed(1, 1, true),
                Event::Ended {
                    worker: 1,
                    stream: 1,
                },
            ],
        ];
        let mut h = retried.clone();
        h.push(got(2, 1, "0/2-0", "a", 1));
        let found = anomalies(&history(h.clone()));
        assert!(
            found.len() == 1 && found[0].contains("was due first"),
            "{found:?}"
        );
        // Dead-lettered later: it may have gone past the cap on the way.
        let h = history(h);
        assert!(
            check(&h, 5, |e| Some(e.to_owned()), |e| e == "0/1-0")
                .0
                .is_empty()
        );
        // At the cap the flush dead-letters it: settled.
        let mut h = retried;
        h[0] = got(1, 1, "0/1-0", "a", 5);
        h.push(got(2, 1, "0/2-0", "a", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
    }

    #[test]
    fn an_unsettled_entry_may_vanish_but_not_come_back_after_a_later_one() {
        let lost = vec![
            got(1, 1, "0/1-0", "a", 1),
            vec![decided(1, "0/1-0", Decision::Ack), flushed(1, 1, false)],
            got(2, 1, "0/2-0", "a", 1),
            vec![decided(2, "0/2-0", Decision::Ack), flushed(2, 1, true)],
        ];
        assert_eq!(anomalies(&history(lost.clone())), Vec::<String>::new());
        let mut h = lost.clone();
        h.push(got(2, 2, "0/1-0", "a", 2));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("had overtaken it unsettled"),
            "{found:?}"
        );
        // A redrive put it back into the group.
        let mut h = lost;
        h.push(vec![Event::Redriven {
            dead: "9-0".into(),
            origin: "0/1-0".into(),
            deliveries: 5,
            copy: String::new(),
        }]);
        h.push(got(2, 2, "0/1-0", "a", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
    }

    #[test]
    fn a_keys_entries_first_go_out_in_stream_order() {
        let h = history(vec![
            got(1, 1, "0/2-0", "a", 1),
            vec![decided(1, "0/2-0", Decision::Ack), flushed(1, 1, true)],
            got(2, 1, "0/1-5", "a", 1),
        ]);
        let found = anomalies(&h);
        assert!(
            found.len() == 1 && found[0].contains("later in the stream"),
            "{found:?}"
        );
        // Seen first with a higher count: its first hand-out was lost on the way, at a moment
        // the workers do not know.
        let h = history(vec![
            got(1, 1, "0/2-0", "a", 1),
            vec![decided(1, "0/2-0", Decision::Ack), flushed(1, 1, true)],
            got(2, 1, "0/1-5", "a", 2),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
        // Another key's, or the same entry again, is no anomaly.
        let h = history(vec![
            got(1, 1, "0/2-0", "a", 1),
            vec![decided(1, "0/2-0", Decision::Ack), flushed(1, 1, true)],
            got(2, 1, "1/1-0", "b", 1),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
    }

    #[test]
    fn a_later_reading_of_the_partition_on_the_same_stream_ends_the_earlier() {
        // Worker 1's reading 1 of the partition was fenced with 0/1-0 out; reading 2 on the
        // same stream hands it out again: not two holders (the same stream is `order`'s).
        let later = 2 << 36;
        let h = history(vec![
            got(1, 1, "0/1-0", "a", 1),
            got(1, later, "0/1-0", "a", 2),
            vec![decided(1, "0/1-0", Decision::Ack), flushed(1, later, true)],
            got(2, 1, "0/2-0", "a", 1),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
    }

    #[test]
    fn deliveries_count_when_they_came_not_when_their_worker_took_them_up() {
        // 0/1-0 came to worker 1 while it slept on a slow ack; the partition moved on to
        // worker 2, which dropped it and retried the next; worker 1 took its read up later,
        // and its outcome was refused.
        let h = history(vec![
            vec![Event::Came {
                worker: 1,
                stream: 1,
                read_id: 7,
                deliveries: vec![("0/1-0".into(), "a".into(), 2)],
            }],
            got(2, 1, "0/1-0", "a", 3),
            vec![decided(2, "0/1-0", Decision::Drop), flushed(2, 1, true)],
            got(2, 2, "0/2-0", "a", 1),
            vec![decided(2, "0/2-0", Decision::Retry), flushed(2, 2, true)],
            vec![
                read(1, 7),
                Event::Delivered {
                    worker: 1,
                    entry: "0/1-0".into(),
                    count: 2,
                },
                decided(1, "0/1-0", Decision::Ack),
                flushed(1, 7, false),
            ],
            got(2, 3, "0/2-0", "a", 2),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
    }

    #[test]
    fn an_earlier_entry_of_the_partition_may_come_before_what_is_due_or_unsettled() {
        // 0/1-0 dead-lettered at the cap; 0/5-0 abandoned, then its flush failed (unsettled);
        // 0/6-0 retried in place. A redrive puts 0/1-0 back with its id: the next reading
        // takes it first, then 0/6-0.
        let base = vec![
            got(4, 1, "0/1-0", "a", 5),
            vec![decided(4, "0/1-0", Decision::Retry), flushed(4, 1, true)],
            got(1, 1, "0/5-0", "a", 1),
            vec![
                decided(1, "0/5-0", Decision::Abandon),
                Event::Ended {
                    worker: 1,
                    stream: 1,
                },
            ],
            got(2, 1, "0/5-0", "a", 2),
            vec![decided(2, "0/5-0", Decision::Ack), flushed(2, 1, false)],
            got(2, 2, "0/6-0", "a", 1),
            vec![decided(2, "0/6-0", Decision::Retry), flushed(2, 2, true)],
        ];
        let mut h = base.clone();
        h.push(vec![Event::Redriven {
            dead: "9-0".into(),
            origin: "0/1-0".into(),
            deliveries: 5,
            copy: String::new(),
        }]);
        h.push(got(3, 1, "0/1-0", "a", 1));
        h.push(vec![
            decided(3, "0/1-0", Decision::Ack),
            flushed(3, 1, true),
        ]);
        h.push(got(3, 2, "0/6-0", "a", 2));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
        // A later entry first is an anomaly.
        let mut h = base;
        h.push(got(3, 1, "0/7-0", "a", 1));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("was due first"),
            "{found:?}"
        );
    }

    #[test]
    fn decisions_go_to_the_read_their_worker_answers() {
        // Two readings of the partition handed 0/1-0 to worker 1's one stream while it slept:
        // it retries the first (its reading had ended: refused) and acks the second.
        let later = 2 << 36;
        let h = history(vec![
            vec![Event::Came {
                worker: 1,
                stream: 1,
                read_id: 1,
                deliveries: vec![("0/1-0".into(), "a".into(), 1)],
            }],
            vec![Event::Came {
                worker: 1,
                stream: 1,
                read_id: later,
                deliveries: vec![("0/1-0".into(), "a".into(), 2)],
            }],
            vec![read(1, 1), decided(1, "0/1-0", Decision::RetryAfter)],
            vec![read(1, later), decided(1, "0/1-0", Decision::Ack)],
            vec![flushed(1, later, true)],
            got(2, 1, "0/2-0", "a", 1),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
    }
}
