//! Per-key order on ordered subscriptions (`Open.ordering_key`), checked on the workers' view
//! of one subscription stream at a time: a worker's stream from its `open` until it ends or the
//! worker drops it.
//!
//! Per stream and per key, through every fault:
//!
//! - **one at a time**: no delivery of a key while an earlier delivery of that key on the
//!   stream has no flush report yet (it is out, or settled and its flush under way). The
//!   sidecar holds the next one until that flush has succeeded, and it reports a flush before
//!   it hands out what the flush freed. A read's settled deliveries may be flushed in parts
//!   ahead of the rest, each part reported with the read's id: a report frees the read's
//!   deliveries that had their outcome (a part cannot hold one without), the others stay out.
//! - **retries in place**: once a `retry` or `retry_after` below `max_deliveries` is reported
//!   flushed, the key's next delivery on the stream is that entry again (at the cap, the flush
//!   dead-letters it: settled).
//! - **no overtaking**: an entry whose flush failed, or whose outcome is unknown, may have
//!   been settled by that flush (a lost reply) and then never comes back, or comes back past
//!   the cap and is dead-lettered on the way; so another entry of its key may follow. But once
//!   another entry of its key was delivered on the stream, it must not come back there: that
//!   entry overtook an unsettled one.
//!
//! An entry delivered to another worker since its last delivery on the stream excuses the last
//! two, as does a redrive that put it back into its group with its id since then (the
//! dead-letter service re-queues it behind whatever of its key went out meanwhile, as across
//! the group), and so does one delivered to another worker later if the stream's sidecar logged that
//! another consumer had claimed it (a retry in place that its sidecar could not make idle again
//! while Redis was out of reach; the claimer delivers it when its own lane for the key frees):
//! it was reclaimed past `min_idle`, or a reliable-list consumer given up after
//! `dead_after` had its entries taken over, and order is promised within one subscription, not
//! across the consumers of a group. A retry in place of an entry handled past `min_idle` is
//! excused from the second rule whatever happened next: a stream's retry keeps only an entry
//! still pending on its consumer, and one handled that late may have been claimed by another
//! consumer, or acknowledged by a late holder, before the retry's flush; the key then moves on.
//! So is a retry in place of an entry that went to the dead letter: below the cap as its worker
//! saw it, but counted past it by readings that ended before handing it out again (a fenced or
//! killed holder takes back no count), and dead-lettered unread, settled; the key moves on.
//! And an entry of the key that sits before the one due or unsettled in their partition
//! neither passes nor overtakes it: a reading takes its consumer's pending entries in that
//! order, and such an entry is one a redrive put back with its id (as across the group).
//!
//! On a partitioned stream one subscription stream carries the reads of several partitions,
//! each reading of a partition numbering its reads from a range of its own: a delivery from a
//! later reading of its partition ends what the earlier reading still had out of its key (that
//! reading ended first: handed over or fenced, its outcomes answered `ALREADY_SETTLED`), as a
//! failed flush does. Order across the replicas of a group is [`super::across`]'s.
//!
//! Not checked across the streams of one consumer (a worker's next stream after a sidecar
//! restart, a TCP cut or an abandoned read): the new subscription re-reads the consumer's own
//! pending entries first and in order, but what the old stream held may meanwhile have been
//! settled by a flush whose report never arrived, reclaimed by another consumer, or given back
//! by a draining sidecar, and the workers' view cannot tell those apart from an overtaking.

use std::collections::{BTreeSet, HashMap};

use super::event::{Decision, Event, Said, Stamped, before, reading};
use super::verdict::{Anomaly, anomaly};

/// A delivery of a key out on a stream: handed out, its flush not reported yet.
#[derive(Debug)]
struct Out {
    entry: String,
    read_id: u64,
    count: u32,
    at_ms: u64,
    decision: Option<Decision>,
}

/// One key on one stream.
#[derive(Debug, Default)]
struct Lane {
    out: Option<Out>,
    /// Retried in place and reported flushed: the key's next delivery.
    owed: Option<(String, u64)>,
    /// Flushed with a failure or an unknown outcome, and no other entry of the key since: may
    /// come back (first) or not at all.
    unsure: BTreeSet<String>,
    /// Unsettled entries that another entry of the key followed, with when: they must not come
    /// back on this stream.
    overtaken: HashMap<String, (String, u64)>,
    /// Each entry's last delivery on the stream (its event's index), for the excuse.
    last_seen: HashMap<String, usize>,
}

/// One subscription stream of a worker.
#[derive(Debug, Default)]
struct Sub {
    lanes: HashMap<String, Lane>,
    /// The keys each read delivered, until its flush report.
    reads: HashMap<u64, Vec<String>>,
}

/// A delivery on an ordered stream, as the checker takes it.
struct Delivery<'a> {
    worker: u32,
    stream: u32,
    read_id: u64,
    entry: &'a str,
    key: &'a str,
    count: u32,
}

/// The checker's state over one pass of the history.
struct Order<'a> {
    max_deliveries: u32,
    /// The entries of ordered streams handled past `min_idle`, or ever dead-lettered: a
    /// retry in place of theirs may be followed by the key's next entry.
    settled_elsewhere: BTreeSet<String>,
    subs: HashMap<(u32, u32), Sub>,
    /// Each worker's current stream (its last read's).
    current: HashMap<u32, u32>,
    /// Every delivery of each entry: its event's index and worker.
    delivered: HashMap<&'a str, Vec<(usize, u32)>>,
    /// The entries a sidecar logged as claimed away from each worker's consumer.
    claimed_away: BTreeSet<(u32, &'a str)>,
    /// Every redrive of each entry back into its group with its id: its event's index.
    redriven: HashMap<&'a str, Vec<usize>>,
    anomalies: Vec<Anomaly>,
    /// Deliveries checked, and the streams they came on.
    deliveries: usize,
    streams: BTreeSet<(u32, u32)>,
}

/// What the check saw: deliveries on ordered streams, and how many streams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    pub deliveries: usize,
    pub streams: usize,
}

/// Checks per-key order on every ordered stream of the history; `root` names the entry an
/// anomaly is about, for its report; `slow`: whether an entry was handled past `min_idle`;
/// `dead_lettered`: whether an entry was ever dead-lettered.
pub(crate) fn check(
    history: &[Stamped],
    max_deliveries: u32,
    root: impl Fn(&str) -> Option<String>,
    slow: impl Fn(&str) -> bool,
    dead_lettered: impl Fn(&str) -> bool,
) -> (Vec<Anomaly>, Checked) {
    let settled_elsewhere = history
        .iter()
        .filter_map(|s| match &s.event {
            Event::InOrder { entry, .. } if slow(entry) || dead_lettered(entry) => {
                Some(entry.clone())
            }
            _ => None,
        })
        .collect();
    let mut order = Order {
        max_deliveries,
        settled_elsewhere,
        subs: HashMap::new(),
        current: HashMap::new(),
        delivered: HashMap::new(),
        claimed_away: history
            .iter()
            .flat_map(|s| match &s.event {
                Event::Said {
                    worker,
                    said: Said::ClaimedAway,
                    entries,
                } => entries.iter().map(|e| (*worker, e.as_str())).collect(),
                _ => Vec::new(),
            })
            .collect(),
        redriven: HashMap::new(),
        anomalies: Vec::new(),
        deliveries: 0,
        streams: BTreeSet::new(),
    };
    for (i, stamped) in history.iter().enumerate() {
        if let Event::Delivered { worker, entry, .. } = &stamped.event {
            order
                .delivered
                .entry(entry.as_str())
                .or_default()
                .push((i, *worker));
        }
        if let Some(origin) = stamped.event.in_place_redrive() {
            order.redriven.entry(origin).or_default().push(i);
        }
    }
    for (i, stamped) in history.iter().enumerate() {
        order.event(i, stamped, &root);
    }
    let checked = Checked {
        deliveries: order.deliveries,
        streams: order.streams.len(),
    };
    (order.anomalies, checked)
}

impl<'a> Order<'a> {
    fn event(&mut self, i: usize, stamped: &'a Stamped, root: &impl Fn(&str) -> Option<String>) {
        match &stamped.event {
            Event::Read { worker, stream, .. } => {
                self.current.insert(*worker, *stream);
            }
            Event::InOrder {
                worker,
                stream,
                read_id,
                entry,
                key,
                count,
            } => {
                let d = Delivery {
                    worker: *worker,
                    stream: *stream,
                    read_id: *read_id,
                    entry,
                    key,
                    count: *count,
                };
                self.deliver(i, stamped.at_ms, &d, root);
            }
            Event::Decided {
                worker,
                entry,
                decision,
            } => self.decided(*worker, entry, *decision),
            Event::Flushed {
                worker,
                stream,
                read_id,
                ok,
            } => self.flushed((*worker, *stream), *read_id, *ok, stamped.at_ms),
            _ => {}
        }
    }

    /// Whether `entry` left `worker`'s hands between events `since` and `now`: it reached
    /// another worker, or a redrive put it back into its group.
    fn moved(&self, entry: &str, worker: u32, since: usize, now: usize) -> bool {
        let elsewhere = self.delivered.get(entry).is_some_and(|all| {
            all.iter()
                .any(|(i, w)| *w != worker && (since..now).contains(i))
        });
        let redriven = self
            .redriven
            .get(entry)
            .is_some_and(|all| all.iter().any(|i| (since..now).contains(i)));
        elsewhere || redriven
    }

    fn deliver(
        &mut self,
        i: usize,
        at_ms: u64,
        d: &Delivery<'_>,
        root: &impl Fn(&str) -> Option<String>,
    ) {
        self.deliveries += 1;
        self.streams.insert((d.worker, d.stream));
        let found = self.broken(i, at_ms, d);
        for (about, what) in found {
            self.anomalies.push(anomaly(root(&about), what));
        }
        let lane = self.lane(d);
        // An entry before one due or unsettled in their partition does not pass it: a reading
        // takes its pending entries in that order (one a redrive put back with its id, say).
        let mut passed = Vec::new();
        match lane.owed.take() {
            Some((owed, since_ms)) if before(d.entry, &owed) => {
                lane.owed = Some((owed, since_ms));
            }
            owed => passed.extend(owed.map(|(e, _)| e)),
        }
        for entry in std::mem::take(&mut lane.unsure) {
            if before(d.entry, &entry) {
                lane.unsure.insert(entry);
            } else {
                passed.push(entry);
            }
        }
        for entry in passed.into_iter().filter(|e| e != d.entry) {
            lane.overtaken.insert(entry, (d.entry.to_owned(), at_ms));
        }
        lane.overtaken.remove(d.entry);
        lane.last_seen.insert(d.entry.to_owned(), i);
        lane.out = Some(Out {
            entry: d.entry.to_owned(),
            read_id: d.read_id,
            count: d.count,
            at_ms,
            decision: None,
        });
        let sub = self.subs.entry((d.worker, d.stream)).or_default();
        sub.reads
            .entry(d.read_id)
            .or_default()
            .push(d.key.to_owned());
    }

    fn lane(&mut self, d: &Delivery<'_>) -> &mut Lane {
        let sub = self.subs.entry((d.worker, d.stream)).or_default();
        sub.lanes.entry(d.key.to_owned()).or_default()
    }

    /// What delivery `d` (event `i`) breaks on its stream: each rule above, unless the entry
    /// it passed, or that came back, moved since its last delivery there.
    /// Each with the entry it is about (for the report's events): the one passed, or `d`'s.
    fn broken(&mut self, i: usize, at_ms: u64, d: &Delivery<'_>) -> Vec<(String, String)> {
        let on = format!(
            "worker {} got {} (key {}, read {}, count {}) at {at_ms} ms on its stream {}",
            d.worker, d.entry, d.key, d.read_id, d.count, d.stream
        );
        let settled_elsewhere = &self.settled_elsewhere;
        let lane = self
            .subs
            .entry((d.worker, d.stream))
            .or_default()
            .lanes
            .entry(d.key.to_owned())
            .or_default();
        // A partition's earlier reading on this stream ended before this one began (handed
        // over, fenced): what it had out can no longer be settled, as after a failed flush.
        if let Some(out) = lane
            .out
            .take_if(|out| reading(out.read_id) != reading(d.read_id))
        {
            lane.unsure.insert(out.entry);
        }
        let mut found = Vec::new();
        if let Some(out) = &lane.out {
            let decision = out
                .decision
                .map_or_else(|| "no decision".to_owned(), |d| format!("{d:?}"));
            found.push((
                d.entry.to_owned(),
                format!(
                    "{on} while {} of its key was still out (read {}, count {}, {decision}, \
                 delivered at {} ms, no flush report yet): two deliveries of a key out at once",
                    out.entry, out.read_id, out.count, out.at_ms
                ),
            ));
        }
        // (what, the entry that may have moved, since when)
        let mut excusable = Vec::new();
        let owed = lane
            .owed
            .as_ref()
            .filter(|(e, _)| e != d.entry && !settled_elsewhere.contains(e) && !before(d.entry, e));
        if let Some((owed, since_ms)) = owed {
            excusable.push((
                format!(
                    "{on}, but {owed}, retried in place and reported flushed at {since_ms} \
                     ms, was due first"
                ),
                owed.clone(),
                lane.last_seen.get(owed).copied(),
            ));
        }
        if let Some((by, by_ms)) = lane.overtaken.get(d.entry) {
            excusable.push((
                format!(
                    "{on}, after {by} of its key (delivered at {by_ms} ms) had overtaken it \
                     unsettled"
                ),
                d.entry.to_owned(),
                lane.last_seen.get(d.entry).copied(),
            ));
        }
        for (what, entry, since) in excusable {
            let until = if self.claimed_away.contains(&(d.worker, entry.as_str())) {
                usize::MAX
            } else {
                i
            };
            let moved = since.is_some_and(|since| self.moved(&entry, d.worker, since, until));
            if !moved {
                found.push((entry, what));
            }
        }
        found
    }

    /// A worker's decision, for its current stream's delivery of that entry.
    fn decided(&mut self, worker: u32, entry: &str, decision: Decision) {
        let Some(stream) = self.current.get(&worker) else {
            return;
        };
        let Some(sub) = self.subs.get_mut(&(worker, *stream)) else {
            return;
        };
        for lane in sub.lanes.values_mut() {
            if let Some(out) = lane.out.as_mut().filter(|out| out.entry == entry) {
                out.decision = Some(decision);
            }
        }
    }

    /// A flush report: the read's decided deliveries are settled (a read's settled deliveries
    /// may be flushed in parts ahead of the rest, each part reported with the read's id);
    /// what a report did not settle for good is owed (a retry in place) or may come back (a
    /// failure).
    fn flushed(&mut self, stream: (u32, u32), read_id: u64, ok: bool, at_ms: u64) {
        let max = self.max_deliveries;
        let Some(sub) = self.subs.get_mut(&stream) else {
            return;
        };
        let Some(mut keys) = sub.reads.remove(&read_id) else {
            return;
        };
        keys.retain(|key| {
            let Some(lane) = sub.lanes.get_mut(key) else {
                return false;
            };
            let Some(out) = lane.out.take_if(|out| out.read_id == read_id) else {
                return false;
            };
            match out.decision {
                // Not in this part: still out.
                None => {
                    lane.out = Some(out);
                    return true;
                }
                _ if !ok => {
                    lane.unsure.insert(out.entry);
                }
                Some(Decision::Retry | Decision::RetryAfter) if out.count < max => {
                    lane.owed = Some((out.entry, at_ms));
                }
                Some(_) => {}
            }
            false
        });
        if !keys.is_empty() {
            sub.reads.insert(read_id, keys);
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

    fn got(worker: u32, read_id: u64, entry: &str, key: &str, count: u32) -> Vec<Event> {
        vec![
            Event::Delivered {
                worker,
                entry: entry.into(),
                count,
            },
            Event::InOrder {
                worker,
                stream: 1,
                read_id,
                entry: entry.into(),
                key: key.into(),
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
            stream: 1,
            read_id,
            ok,
        }
    }

    /// Events in order, 10 ms apart.
    fn history(events: Vec<Vec<Event>>) -> Vec<Stamped> {
        events
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, e)| at(10 * i as u64, e))
            .collect()
    }

    fn anomalies(history: &[Stamped]) -> Vec<String> {
        check(history, 5, |e| Some(e.to_owned()), |_| false, |_| false)
            .0
            .iter()
            .map(|a| a.what.clone())
            .collect()
    }

    #[test]
    fn keys_one_at_a_time_with_retries_in_place_pass() {
        let h = history(vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            got(1, 1, "2-0", "b", 1),
            vec![
                decided(1, "1-0", Decision::Retry),
                decided(1, "2-0", Decision::Ack),
            ],
            vec![flushed(1, 1, true), read(1, 2)],
            got(1, 2, "1-0", "a", 2),
            got(1, 2, "3-0", "b", 1),
            vec![
                decided(1, "1-0", Decision::Ack),
                decided(1, "3-0", Decision::Ack),
            ],
            vec![flushed(1, 2, true), read(1, 3)],
            got(1, 3, "4-0", "a", 1),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
        let (_, checked) = check(&h, 5, |e| Some(e.to_owned()), |_| false, |_| false);
        assert_eq!(
            checked,
            Checked {
                deliveries: 5,
                streams: 1
            }
        );
    }

    #[test]
    fn a_second_delivery_of_a_key_before_the_flush_report_is_an_anomaly() {
        let h = history(vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            vec![decided(1, "1-0", Decision::Ack), read(1, 2)],
            got(1, 2, "2-0", "a", 1),
        ]);
        let found = anomalies(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("two deliveries of a key out at once"));
        // Another key, or the same key on another worker's stream, is no anomaly.
        let h = history(vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            vec![read(2, 1)],
            got(2, 1, "2-0", "a", 1),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
    }

    #[test]
    fn a_part_of_a_read_flushed_ahead_frees_only_its_decided_keys() {
        let parts = vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            got(1, 1, "2-0", "b", 1),
            vec![decided(1, "1-0", Decision::Ack), flushed(1, 1, true)],
            vec![read(1, 2)],
            got(1, 2, "3-0", "a", 1),
        ];
        assert_eq!(anomalies(&history(parts.clone())), Vec::<String>::new());
        // Key b's delivery was in no part yet: still out.
        let mut h = parts.clone();
        h.push(got(1, 2, "4-0", "b", 1));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("out at once"),
            "{found:?}"
        );
        // Its own part frees it.
        let mut h = parts;
        h.push(vec![decided(1, "2-0", Decision::Ack), flushed(1, 1, true)]);
        h.push(got(1, 2, "4-0", "b", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
    }

    #[test]
    fn an_entry_that_passes_a_retry_in_place_is_an_anomaly_unless_the_retry_moved() {
        let retried = vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            vec![decided(1, "1-0", Decision::RetryAfter), flushed(1, 1, true)],
            vec![read(1, 2)],
        ];
        let mut h = retried.clone();
        h.push(got(1, 2, "2-0", "a", 1));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("retried in place"),
            "{found:?}"
        );
        // Reclaimed by worker 2 meanwhile: another consumer's, not promised.
        let mut h = retried.clone();
        h.push(got(2, 7, "1-0", "a", 2));
        h.push(got(1, 2, "2-0", "a", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
        // The anomaly is about the entry that was due first (its events are the report's);
        // none when that entry was handled past min_idle.
        let mut h = retried.clone();
        h.push(got(1, 2, "2-0", "a", 1));
        let h = history(h);
        let (found, _) = check(&h, 5, |e| Some(e.to_owned()), |_| false, |_| false);
        assert_eq!(found[0].root.as_deref(), Some("1-0"));
        assert!(
            check(&h, 5, |e| Some(e.to_owned()), |e| e == "1-0", |_| false)
                .0
                .is_empty()
        );
        // Nor when it went to the dead letter (counted past the cap by readings its worker
        // never saw).
        assert!(
            check(&h, 5, |e| Some(e.to_owned()), |_| false, |e| e == "1-0")
                .0
                .is_empty()
        );
        // Delivered to worker 2 only after 2-0 went out: its sidecar must have said that
        // another consumer claimed it from worker 1's.
        let mut h = retried.clone();
        h.push(got(1, 2, "2-0", "a", 1));
        h.push(got(2, 7, "1-0", "a", 2));
        let found = anomalies(&history(h.clone()));
        assert!(
            found.len() == 1 && found[0].contains("retried in place"),
            "{found:?}"
        );
        let said = |worker| Event::Said {
            worker,
            said: Said::ClaimedAway,
            entries: vec!["1-0".into()],
        };
        let mut elsewhere = h.clone();
        elsewhere.push(vec![said(1)]);
        assert_eq!(anomalies(&history(elsewhere)), Vec::<String>::new());
        let mut about_another = h;
        about_another.push(vec![said(3)]);
        assert_eq!(anomalies(&history(about_another)).len(), 1);
        // At the cap the flush dead-letters it: settled.
        let mut h = retried;
        h[1] = got(1, 1, "1-0", "a", 5);
        h.push(got(1, 2, "2-0", "a", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
    }

    #[test]
    fn after_a_failed_flush_the_entry_may_vanish_but_not_come_back_after_a_later_one() {
        let failed = vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            vec![decided(1, "1-0", Decision::Ack), flushed(1, 1, false)],
            vec![read(1, 2)],
        ];
        // Back first: in order.
        let mut h = failed.clone();
        h.push(got(1, 2, "1-0", "a", 2));
        h.push(vec![decided(1, "1-0", Decision::Ack), flushed(1, 2, true)]);
        h.push(vec![read(1, 3)]);
        h.push(got(1, 3, "2-0", "a", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
        // Settled by the flush whose reply was lost: never back, the next follows.
        let mut h = failed.clone();
        h.push(got(1, 2, "2-0", "a", 1));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
        // Back after the next one: overtaken.
        let mut h = failed;
        h.push(got(1, 2, "2-0", "a", 1));
        h.push(vec![decided(1, "2-0", Decision::Ack), flushed(1, 2, true)]);
        h.push(vec![read(1, 3)]);
        h.push(got(1, 3, "1-0", "a", 2));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("had overtaken it unsettled"),
            "{found:?}"
        );
    }

    #[test]
    fn an_entry_redriven_in_place_may_come_back_after_a_later_one() {
        // Reading 1 of the partition had 1-0 out at its cap when it was fenced; reading 2 found
        // it past the cap, dead-lettered it unread and handed out 2-0; the dead-letter service
        // put 1-0 back into its group with its id, behind 2-0.
        let later = 2 << 36;
        let redrive = |copy: &str| Event::Redriven {
            dead: "9-0".into(),
            origin: "1-0".into(),
            deliveries: 6,
            copy: copy.into(),
        };
        let fenced = vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 5),
            vec![read(1, later)],
            got(1, later, "2-0", "a", 2),
            vec![decided(1, "2-0", Decision::Ack), flushed(1, later, true)],
        ];
        let back = |mut h: Vec<Vec<Event>>| {
            h.push(vec![read(1, later + 1)]);
            h.push(got(1, later + 1, "1-0", "a", 1));
            anomalies(&history(h))
        };
        let mut h = fenced.clone();
        h.push(vec![redrive("")]);
        assert_eq!(back(h), Vec::<String>::new());
        // Without the redrive, or with one that wrote a fresh entry, it overtook 1-0.
        for h in [
            fenced.clone(),
            [fenced.clone(), vec![vec![redrive("10-0")]]].concat(),
        ] {
            let found = back(h);
            assert!(
                found.len() == 1 && found[0].contains("had overtaken it unsettled"),
                "{found:?}"
            );
        }
        // A redrive before its last delivery on the stream excuses nothing after it.
        let mut h = vec![vec![redrive("")]];
        h.extend(fenced);
        assert_eq!(back(h).len(), 1);
    }

    #[test]
    fn an_earlier_entry_of_the_key_does_not_overtake_a_later_one() {
        // Reading 1 had 5-0 out when it was fenced; reading 2 hands out 2-0 first (a redrive
        // put it back with its id), then 5-0 again: in stream order.
        let later = 2 << 36;
        let fenced = vec![
            vec![read(1, 1)],
            got(1, 1, "5-0", "a", 1),
            vec![read(1, later)],
            got(1, later, "2-0", "a", 1),
            vec![decided(1, "2-0", Decision::Ack), flushed(1, later, true)],
            vec![read(1, later + 1)],
        ];
        let mut h = fenced.clone();
        h.push(got(1, later + 1, "5-0", "a", 2));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
        // A later entry than 5-0 does overtake it.
        let mut h = fenced;
        h[3] = got(1, later, "7-0", "a", 1);
        h[4] = vec![decided(1, "7-0", Decision::Ack), flushed(1, later, true)];
        h.push(got(1, later + 1, "5-0", "a", 2));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("had overtaken it unsettled"),
            "{found:?}"
        );
        // Nor does it pass a retry in place of a later entry: that one is still due next.
        let retried = vec![
            vec![read(1, 1)],
            got(1, 1, "5-0", "a", 1),
            vec![decided(1, "5-0", Decision::Retry), flushed(1, 1, true)],
            vec![read(1, 2)],
            got(1, 2, "2-0", "a", 1),
            vec![decided(1, "2-0", Decision::Ack), flushed(1, 2, true)],
            vec![read(1, 3)],
        ];
        let mut h = retried.clone();
        h.push(got(1, 3, "5-0", "a", 2));
        assert_eq!(anomalies(&history(h)), Vec::<String>::new());
        let mut h = retried;
        h.push(got(1, 3, "6-0", "a", 1));
        let found = anomalies(&history(h));
        assert!(
            found.len() == 1 && found[0].contains("was due first"),
            "{found:?}"
        );
    }

    #[test]
    fn a_later_reading_of_a_partition_ends_what_the_earlier_had_out() {
        // Reading 1 of the partition was fenced with 1-0 out; reading 2 on the same stream
        // hands it out again.
        let later = 2 << 36;
        let h = history(vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            vec![read(1, later)],
            got(1, later, "1-0", "a", 2),
        ]);
        assert_eq!(anomalies(&h), Vec::<String>::new());
        // Within one reading it is two out at once.
        let h = history(vec![
            vec![read(1, 1)],
            got(1, 1, "1-0", "a", 1),
            vec![read(1, 2)],
            got(1, 2, "1-0", "a", 2),
        ]);
        assert_eq!(anomalies(&h).len(), 1);
    }
}
