//! What one reading of the history (with the end state) says about each root: its decisions,
//! the counts each worker saw per generation, whether it was handled past `min_idle`, its
//! copies, dead letters and redrives. Every property is checked over these facts, so that the
//! history is read once and every checker agrees on what an entry went through.

use std::collections::{BTreeSet, HashMap};

use super::end::EndState;
use super::event::{Decision, Event, Said, Stamped};
use super::verdict::Promise;

/// What one reading of the history (with the end state) says about each root, for the
/// invariants to check.
pub(super) struct Facts {
    pub(super) all_roots: BTreeSet<String>,
    /// Per root: its decisions in order.
    decisions: HashMap<String, Vec<Decision>>,
    /// Per root: when it was last decided an ack (or slow ack), and a drop.
    last_kept: HashMap<String, u64>,
    last_dropped: HashMap<String, u64>,
    /// Roots handled past `min_idle` (said so, or shown by the counts seen).
    late: BTreeSet<String>,
    /// Per (worker, entry, generation): the counts it saw, in order, with when.
    pub(super) seen: HashMap<(u32, String, usize), Vec<(u64, u32)>>,
    /// Per root: its deliveries with count 1.
    first_deliveries: HashMap<String, i64>,
    /// Per root: the most deliveries one read had.
    same_read: HashMap<String, i64>,
    /// Per root: its dead letters, those still in the dead letter and those redriven.
    dead: HashMap<String, usize>,
    /// Per root: its dead letters still in the dead letter at the end.
    dead_at_end: HashMap<String, usize>,
    /// Per root: when a redrive put it back into its group with its id (its count starts
    /// again: a new generation), in order.
    redrives: HashMap<String, Vec<u64>>,
    /// The dead letters those redrives consumed: the root and its deliveries.
    pub(super) redriven_dead: Vec<(String, u32)>,
    /// Roots acked whose flush report said Redis refused their side effect while the settle
    /// stood (pipeline mode).
    unwritten: BTreeSet<String>,
}

/// What one pass over the history tracks besides the facts.
#[derive(Default)]
struct Pass {
    /// Known by payload, a value's copies share one delivery count, so a second copy's
    /// first delivery need not be fresh; but two deliveries of a value in one read are two
    /// copies (a read takes each list element once).
    in_read: HashMap<(u32, u32, u64, String), i64>,
    /// Each worker's current read.
    reading: HashMap<u32, (u32, u64)>,
    /// When each read (worker, stream, read id) reached its worker: a read handled late was
    /// made before then.
    came: HashMap<(u32, u32, u64), u64>,
    /// Per (entry, generation): the highest count seen, when and by which worker.
    highest_count: HashMap<(String, usize), (u64, u32, u32)>,
}

impl Facts {
    pub(super) fn gather(history: &[Stamped], end: &EndState) -> Facts {
        let mut facts = Facts {
            all_roots: end.entries.iter().cloned().collect(),
            decisions: HashMap::new(),
            last_kept: HashMap::new(),
            last_dropped: HashMap::new(),
            late: BTreeSet::new(),
            seen: HashMap::new(),
            first_deliveries: HashMap::new(),
            same_read: HashMap::new(),
            dead: HashMap::new(),
            dead_at_end: HashMap::new(),
            redrives: HashMap::new(),
            redriven_dead: Vec::new(),
            unwritten: BTreeSet::new(),
        };
        // The redrives first: a delivery's generation depends on them.
        for stamped in history {
            if let (Some(origin), Event::Redriven { deliveries, .. }) =
                (stamped.event.in_place_redrive(), &stamped.event)
            {
                facts
                    .redrives
                    .entry(origin.to_owned())
                    .or_default()
                    .push(stamped.at_ms);
                facts.redriven_dead.push((origin.to_owned(), *deliveries));
            }
        }
        facts.read_history(history);
        for (root, _) in &end.dead_letters {
            if let Some(r) = facts.root(root) {
                *facts.dead_at_end.entry(r.clone()).or_default() += 1;
                *facts.dead.entry(r).or_default() += 1;
            }
        }
        for (root, _) in &facts.redriven_dead {
            *facts.dead.entry(root.clone()).or_default() += 1;
        }
        facts
    }

    /// The root `entry` is (itself), when the end state knows it.
    pub(super) fn root(&self, entry: &str) -> Option<String> {
        self.all_roots.contains(entry).then(|| entry.to_owned())
    }

    /// The generation of `entry` at `at_ms`: how many times a redrive had put it back into
    /// its group by then.
    fn generation(&self, entry: &str, at_ms: u64) -> usize {
        self.redrives
            .get(entry)
            .map_or(0, |times| times.iter().filter(|t| **t <= at_ms).count())
    }

    fn read_history(&mut self, history: &[Stamped]) {
        let mut pass = Pass::default();
        for stamped in history {
            match &stamped.event {
                Event::Delivered {
                    worker,
                    entry,
                    count,
                } => self.delivered(&mut pass, stamped.at_ms, *worker, entry, *count),
                Event::Decided {
                    entry, decision, ..
                } => {
                    if let Some(r) = self.root(entry) {
                        if decision.keeps() {
                            self.last_kept.insert(r.clone(), stamped.at_ms);
                        } else if *decision == Decision::Drop {
                            self.last_dropped.insert(r.clone(), stamped.at_ms);
                        }
                        self.decisions.entry(r).or_default().push(*decision);
                    }
                }
                Event::Late { entry } => {
                    if let Some(r) = self.root(entry) {
                        self.late.insert(r);
                    }
                }
                Event::Read {
                    worker,
                    stream,
                    read_id,
                } => {
                    pass.reading.insert(*worker, (*stream, *read_id));
                }
                Event::Refused { kept_unwritten, .. } => {
                    for entry in kept_unwritten {
                        if let Some(r) = self.root(entry) {
                            self.unwritten.insert(r);
                        }
                    }
                }
                Event::Said {
                    said: Said::EffectsRefused,
                    entries,
                    ..
                } => {
                    for entry in entries {
                        if let Some(r) = self.root(entry) {
                            self.unwritten.insert(r);
                        }
                    }
                }
                Event::Came {
                    worker,
                    stream,
                    read_id,
                    ..
                } => {
                    pass.came
                        .insert((*worker, *stream, *read_id), stamped.at_ms);
                }
                Event::Flushed { .. }
                | Event::Said { .. }
                | Event::InOrder { .. }
                | Event::Fault(_)
                | Event::Undone(_)
                | Event::Settling
                | Event::Redriven { .. }
                | Event::Delayed { .. }
                | Event::Audited { .. }
                | Event::AuditAcked { .. }
                | Event::Ended { .. } => {}
            }
        }
    }

    /// A delivery: a fresh one counts as a copy, so does each delivery of the root in one read;
    /// its count against the highest another worker saw, and among the counts its worker saw
    /// of the entry's generation.
    fn delivered(&mut self, pass: &mut Pass, at_ms: u64, worker: u32, entry: &str, count: u32) {
        let Some(r) = self.root(entry) else { return };
        if count == 1 {
            *self.first_deliveries.entry(r.clone()).or_default() += 1;
        }
        // A worker's deliveries follow the read they came in.
        if let Some(&(stream, read_id)) = pass.reading.get(&worker) {
            let n = pass
                .in_read
                .entry((worker, stream, read_id, r.clone()))
                .or_default();
            *n += 1;
            let most = self.same_read.entry(r.clone()).or_default();
            *most = (*most).max(*n);
        }
        // A redrive starts the count again: each generation on its own. A read that waited
        // for its worker belongs to the generation it was read in: it came before the redrive
        // that a late handling follows.
        let read_at = pass
            .reading
            .get(&worker)
            .and_then(|&(stream, read_id)| pass.came.get(&(worker, stream, read_id)))
            .copied()
            .unwrap_or(at_ms);
        let generation = self.generation(entry, read_at);
        let highest = pass
            .highest_count
            .entry((entry.to_owned(), generation))
            .or_insert((at_ms, count, worker));
        self.note_order(at_ms, worker, count, highest, &r);
        self.seen
            .entry((worker, entry.to_owned(), generation))
            .or_default()
            .push((at_ms, count));
    }

    /// Redis never lowers a count: a delivery with a lower count than another worker saw
    /// before was read before that one, whose consumer could take the entry only once it had
    /// been idle past min_idle. So this one waited that long between Redis and its worker:
    /// handled past min_idle. Nor across a restart from the AOF or a failover: the sidecar
    /// makes a re-read's counts durable (an `XREADGROUP … 0` alone is kept in memory only).
    /// (One worker seeing its own counts go back is an anomaly of its own.)
    fn note_order(
        &mut self,
        at_ms: u64,
        worker: u32,
        count: u32,
        highest: &mut (u64, u32, u32),
        root: &str,
    ) {
        if count < highest.1 && worker != highest.2 {
            self.late.insert(root.to_owned());
        } else if count >= highest.1 {
            *highest = (at_ms, count, worker);
        }
    }

    pub(super) fn decided(&self, root: &str) -> &[Decision] {
        self.decisions
            .get(root)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    pub(super) fn dead_letters(&self, root: &str) -> usize {
        self.dead.get(root).copied().unwrap_or(0)
    }

    /// Handled past min_idle, an entry may be handled twice, or dead-lettered twice (once by
    /// the consumer that reclaimed it past the cap): the README allows it.
    pub(super) fn slow(&self, root: &str) -> bool {
        self.decided(root).contains(&Decision::SlowAck) || self.late.contains(root)
    }

    /// How many copies of the root were written: one, unless known by payload, where each
    /// fresh delivery, or each delivery of one read, is a copy of its own.
    pub(super) fn copies(&self, root: &str, promise: Promise) -> i64 {
        if promise.by_payload {
            let fresh = self.first_deliveries.get(root).copied().unwrap_or(0);
            fresh
                .max(self.same_read.get(root).copied().unwrap_or(0))
                .max(1)
        } else {
            1
        }
    }

    /// How many generations the root had: one, and one more for each redrive that put it
    /// back into its group.
    pub(super) fn generations(&self, root: &str) -> i64 {
        1 + self.redrives.get(root).map_or(0, Vec::len) as i64
    }

    /// Neither its side effect ran, nor was it dropped or dead-lettered. Not the last drop
    /// decided: a worker whose stream broke, or whose entry another consumer reclaimed, may
    /// decide after the decision that took effect. Redriven back into its group, it must
    /// have been settled again since its last redrive: an ack or a drop decided since (with
    /// its side effect run, for an ack), or a dead letter still there.
    pub(super) fn unsettled(&self, end: &EndState, root: &str) -> bool {
        let dead_now = self.dead_at_end.get(root).copied().unwrap_or(0) > 0;
        let Some(&redriven) = self.redrives.get(root).and_then(|t| t.last()) else {
            return kept_runs(end, root) == 0
                && self.dead_letters(root) == 0
                && !self.decided(root).contains(&Decision::Drop);
        };
        let since =
            |decided: &HashMap<String, u64>| decided.get(root).is_some_and(|t| *t > redriven);
        let kept = kept_runs(end, root) > 0 && since(&self.last_kept);
        !dead_now && !kept && !since(&self.last_dropped)
    }

    /// Settled without its side effect, which Redis refused: its ack's flush report said so
    /// (pipeline mode: the settle stands, Redis has no rollback; docs/design.md, "When Redis
    /// refuses a write").
    pub(super) fn effect_refused(&self, end: &EndState, root: &str) -> bool {
        self.unsettled(end, root) && self.unwritten.contains(root)
    }
}

/// How many times the root's kept side effect ran.
pub(super) fn kept_runs(end: &EndState, root: &str) -> i64 {
    end.kept_effects.get(root).copied().unwrap_or(0)
}
