//! The campaign's history and its checker, pure: what workers saw and decided, what the
//! nemesis did, and what Redis holds at the end go in; anomalies come out. Nothing here talks
//! to Redis or the sidecar, so every rule is tested on made-up histories.
//!
//! Per-key order on ordered subscriptions is checked in [`order`].
//!
//! A stream entry is known by the id the producer's `XADD` gave it, for its whole life in the
//! workers' group: a `retry` or `retry_after` keeps it pending with that id and delivers it
//! again with a higher count ([`redelivery`]), and a redrive of its dead letter puts it back in
//! that group alone with the same id and its count reset (a *generation* of its own). The audit
//! group, which reads every entry behind the workers, must see each published entry exactly
//! once and nothing else ([`audit`]). Only a redrive that could not re-enter the group (its
//! entry was trimmed) may still write a fresh entry; that one is a root of its own.
//! List values and pub/sub messages are known by their payload.

mod audit;
mod order;
mod redelivery;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// What a worker decided for one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Decision {
    /// Its side effect queued and the entry acked.
    Ack,
    /// Acked after handling longer than `min_idle` (or after a slow one of the same read):
    /// another consumer may take it meanwhile.
    SlowAck,
    /// Dropped: its queued side effect must never run.
    Drop,
    /// Retried at once: its queued side effect must never run.
    Retry,
    /// Retried after a delay: its queued side effect must never run.
    RetryAfter,
    /// No outcome: the worker closed its stream; the entry is delivered again.
    Abandon,
}

impl Decision {
    /// Whether the decision keeps the delivery's side effect.
    pub(crate) fn keeps(self) -> bool {
        matches!(self, Decision::Ack | Decision::SlowAck)
    }
}

/// One event of the history, in the order the campaign recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A worker received a delivery of `entry` with the sidecar's count.
    Delivered {
        worker: u32,
        entry: String,
        count: u32,
    },
    /// A worker decided what to do with a delivery.
    Decided {
        worker: u32,
        entry: String,
        decision: Decision,
    },
    /// A delivery of a read that was handled past `min_idle` (one of its deliveries was
    /// slow, and a read settles as a whole): another consumer may have taken it meanwhile.
    Late { entry: String },
    /// A read a worker received on subscription stream `stream` (numbered across the run).
    Read {
        worker: u32,
        stream: u32,
        read_id: u64,
    },
    /// A flush report a worker received on subscription stream `stream`, for read `read_id`;
    /// `ok`: the flush succeeded (else it failed, or its outcome is unknown).
    Flushed {
        worker: u32,
        stream: u32,
        read_id: u64,
        ok: bool,
    },
    /// A delivery on an ordered subscription stream, logged after its `Delivered`: the read it
    /// came in and its ordering key (none logged for an entry without a key).
    InOrder {
        worker: u32,
        stream: u32,
        read_id: u64,
        entry: String,
        key: String,
        count: u32,
    },
    /// A fault the nemesis injected (its name and target).
    Fault(String),
    /// The nemesis undid a refusal it injected (its kind): Redis takes writes again.
    Undone(String),
    /// The faults are over: from here every delivery is acked until the run is quiet.
    Settling,
    /// A flush report on subscription stream `stream` that failed (logged after its
    /// `Flushed`): the class of its first error (`oom`, `noperm`, `wrongtype`, ..., `other`),
    /// the class of each requeue Redis refused (`requeue_refused`), and the acked entries
    /// whose side effect Redis refused while their settle stood (`side_effect_failures`
    /// marked `settled`, pipeline mode: Redis has no rollback, the report is all the client
    /// gets).
    Refused {
        worker: u32,
        stream: u32,
        read_id: u64,
        error: String,
        requeues: Vec<String>,
        kept_unwritten: Vec<String>,
    },
    /// The dead-letter service said it redrove dead letter `dead`, a dead letter of `origin`
    /// after `deliveries` deliveries: back into its own group with its id (`copy` empty or
    /// `origin` itself), or as the fresh stream entry `copy`. Stamped when the call was sent:
    /// the entry may come back before the answer.
    Redriven {
        dead: String,
        origin: String,
        deliveries: u32,
        copy: String,
    },
    /// A worker's `retry_after` of `entry` asked for `delay_ms` (logged after its `Decided`).
    Delayed {
        worker: u32,
        entry: String,
        delay_ms: u64,
    },
    /// The audit group's reader read `entry`: from its own pending entries (`own`, `XREADGROUP
    /// … 0`: a read whose reply or ack a fault took) or as new (`>`). `copy`: the entry is a
    /// copy (it carries `h:x-window-original-id`), which no producer published.
    Audited {
        entry: String,
        own: bool,
        copy: Option<Copied>,
    },
    /// Redis counted every one of these entries in the audit reader's `XACK`: acknowledged.
    AuditAcked { entries: Vec<String> },
}

/// What marks a stream entry as a copy: the id it names as its original, and its copy fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Copied {
    pub of: String,
    /// Its `h:x-window-*` fields, as `name value` pairs.
    pub marks: String,
}

impl Event {
    /// Whether it is a redrive that put `origin`'s entry back into its own group with its id.
    pub(crate) fn in_place_redrive(&self) -> Option<&str> {
        match self {
            Event::Redriven { origin, copy, .. } if copy.is_empty() || copy == origin => {
                Some(origin)
            }
            _ => None,
        }
    }
}

/// A timestamped event (milliseconds since the campaign started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stamped {
    pub at_ms: u64,
    pub event: Event,
}

/// What Redis holds once the campaign has quiesced.
#[derive(Clone, Debug, Default)]
pub(crate) struct EndState {
    /// Every entry the stream held (every value, for the other forms): the roots.
    pub entries: Vec<String>,
    /// How many times each root's kept side effect ran (`HINCRBY` per ack).
    pub kept_effects: HashMap<String, i64>,
    /// How many times a discarded side effect ran (must stay empty).
    pub discarded_effects: HashMap<String, i64>,
    /// The dead letters: the root each is a dead letter of and its delivery count (those a
    /// redrive put back into their group are in the history's `Redriven` events).
    pub dead_letters: Vec<(String, u32)>,
    /// Entries not settled at the end: pending in the group or on processing lists, unread,
    /// or waiting in the delay set ([`crate::form::Form::unsettled`]); `held` says where.
    pub pending: u64,
    /// Retention by acknowledgement (streams): published numbers the second group, which
    /// reads every entry behind the workers, never read: gone before every group had them.
    pub unread_by_every_group: Vec<u64>,
    /// Retention: the stream's length once every group had acknowledged everything and the
    /// trim had time to run (None: not measured, or a group's position was unknown to Redis).
    pub retained_after_settling: Option<u64>,
    /// Redrives whose generation (the root and the times redriven) has more than one copy in
    /// the stream: a dead letter redriven twice.
    pub redriven_twice: Vec<(String, u32)>,
    /// Where each entry Redis still holds sits (read with the end state; it may miss one that
    /// moved meanwhile).
    pub held: Vec<Held>,
    /// The audit group's pending entries once its reader drained the stream: each entry's id,
    /// consumer and deliveries (must be none: the reader acknowledges all it reads, and nothing
    /// else may put an entry there).
    pub audit_pending: Vec<(String, String, u64)>,
}

/// An entry Redis still holds at the end, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    /// As the history names it: a stream id, a list value's or a message's number.
    pub entry: String,
    pub place: Place,
}

/// Where an entry still held at the end sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// On the list, with `ahead` entries to be read before it (0: it is read next).
    List { ahead: usize },
    /// In the delay set, due `due_in_ms` after the end state was read (negative: overdue,
    /// which only a promoter that does not run explains).
    Delayed { due_in_ms: i64 },
    /// On a reliable-list consumer's processing list.
    Processing { consumer: String },
    /// Pending in the stream's group on `consumer`: idle that long, delivered that often.
    Pending {
        consumer: String,
        idle_ms: u64,
        deliveries: u64,
    },
    /// In the stream after the group's last-delivered id.
    Unread,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::List { ahead: 0 } => f.write_str("on the list, read next"),
            Place::List { ahead: 1 } => f.write_str("on the list, 1 entry read before it"),
            Place::List { ahead } => write!(f, "on the list, {ahead} entries read before it"),
            Place::Delayed { due_in_ms } if *due_in_ms < 0 => {
                write!(f, "in the delay set, overdue by {} ms", -due_in_ms)
            }
            Place::Delayed { due_in_ms } => write!(f, "in the delay set, due in {due_in_ms} ms"),
            Place::Processing { consumer } => write!(f, "on {consumer}'s processing list"),
            Place::Pending {
                consumer,
                idle_ms,
                deliveries,
            } => write!(
                f,
                "pending on {consumer}, idle {idle_ms} ms, delivered {deliveries} times"
            ),
            Place::Unread => f.write_str("unread in the stream"),
        }
    }
}

/// What the campaign promised for the run being checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Promise {
    /// Atomic mode: a kept side effect runs at most once.
    pub exactly_once: bool,
    /// `max_deliveries`: no delivery past it, and a dead letter for what reaches it.
    pub max_deliveries: u32,
    /// A simple list or pub/sub: what was in flight at a crash may be lost, and a kept side
    /// effect runs at most once.
    pub at_most_once: bool,
    /// Entries are known by their payload (lists, pub/sub), and a publish retried after a
    /// reconnect may have written one twice (Publish is at least once): each delivery with
    /// count 1 is a copy of its own, which may be kept once more.
    pub by_payload: bool,
}

/// Something the history shows that the README does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Anomaly {
    pub root: Option<String>,
    pub what: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Some(root) => write!(f, "entry {root}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

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
    /// The refusals the nemesis injected, by kind, with the flush reports they touched.
    pub refusals: BTreeMap<String, Touched>,
    /// Requeued entries Redis refused, by reason, over the whole run (from the flush reports
    /// the workers got).
    pub requeue_refused: BTreeMap<String, usize>,
    /// Roots settled without their kept side effect because Redis refused it in pipeline mode,
    /// as their flush report said (Redis has no rollback).
    pub effects_refused: usize,
}

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

/// Checks the whole history against the end state: each invariant on its own, in this order,
/// over the facts one reading of the history gathered.
pub(crate) fn check(
    history: &[Stamped],
    end: &EndState,
    promise: Promise,
) -> (Vec<Anomaly>, Figures) {
    let facts = Facts::gather(history, end);
    let mut anomalies = Vec::new();
    anomalies.extend(lineage(history, end, &facts));
    anomalies.extend(counts_within_the_cap(history, &facts, promise));
    anomalies.extend(flushes_follow_reads(history));
    anomalies.extend(reads_in_order(history));
    anomalies.extend(retention(end));
    anomalies.extend(generations(history, end));
    anomalies.extend(counts_never_go_back(&facts));
    anomalies.extend(dead_letters_at_the_cap(end, &facts, promise));
    anomalies.extend(discarded_effects_never_ran(end));
    anomalies.extend(effects_follow_acks(end, &facts));
    anomalies.extend(once_in_atomic_mode(end, &facts, promise));
    anomalies.extend(at_most_once(end, &facts, promise));
    anomalies.extend(one_dead_letter_per_generation(&facts, promise));
    anomalies.extend(at_least_once(end, &facts, promise));
    anomalies.extend(nothing_left(history, end));
    let (out_of_order, checked) = order::check(
        history,
        promise.max_deliveries,
        |entry| facts.root(entry),
        |entry| facts.slow(entry),
    );
    anomalies.extend(out_of_order);
    // Streams keep a retried entry in place; a list or a channel puts a copy back.
    if !promise.by_payload {
        anomalies.extend(redelivery::check(
            history,
            promise.max_deliveries,
            |entry| facts.slow(entry) || facts.dead_letters(entry) > 0,
        ));
    }
    let (audited, audit) = audit::check(history, end);
    anomalies.extend(audited);
    let mut figures = figures(history, end, &facts, promise);
    figures.ordered_deliveries = checked.deliveries;
    figures.ordered_streams = checked.streams;
    figures.audit = audit;
    (anomalies, figures)
}

/// What one reading of the history (with the end state) says about each root, for the
/// invariants to check.
struct Facts {
    all_roots: BTreeSet<String>,
    /// Per root: its decisions in order.
    decisions: HashMap<String, Vec<Decision>>,
    /// Per root: when it was last decided an ack (or slow ack), and a drop.
    last_kept: HashMap<String, u64>,
    last_dropped: HashMap<String, u64>,
    /// Roots handled past `min_idle` (said so, or shown by the counts seen).
    late: BTreeSet<String>,
    /// Per (worker, entry, generation): the counts it saw, in order, with when.
    seen: HashMap<(u32, String, usize), Vec<(u64, u32)>>,
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
    redriven_dead: Vec<(String, u32)>,
    /// Roots acked whose flush report said Redis refused their side effect while the settle
    /// stood (pipeline mode).
    unwritten: BTreeSet<String>,
}

impl Facts {
    fn gather(history: &[Stamped], end: &EndState) -> Facts {
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
    fn root(&self, entry: &str) -> Option<String> {
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
        // Known by payload, a value's copies share one delivery count, so a second copy's
        // first delivery need not be fresh; but two deliveries of a value in one read are two
        // copies (a read takes each list element once).
        let mut in_read: HashMap<(u32, u32, u64, String), i64> = HashMap::new();
        let mut reading: HashMap<u32, (u32, u64)> = HashMap::new();
        let mut highest_count: HashMap<(String, usize), (u64, u32, u32)> = HashMap::new();
        for stamped in history {
            match &stamped.event {
                Event::Delivered {
                    worker,
                    entry,
                    count,
                } => {
                    let Some(r) = self.root(entry) else { continue };
                    if *count == 1 {
                        *self.first_deliveries.entry(r.clone()).or_default() += 1;
                    }
                    // A worker's deliveries follow the read they came in.
                    if let Some(&(stream, read_id)) = reading.get(worker) {
                        let n = in_read
                            .entry((*worker, stream, read_id, r.clone()))
                            .or_default();
                        *n += 1;
                        let most = self.same_read.entry(r.clone()).or_default();
                        *most = (*most).max(*n);
                    }
                    // A redrive starts the count again: each generation on its own.
                    let generation = self.generation(entry, stamped.at_ms);
                    let highest = highest_count.entry((entry.clone(), generation)).or_insert((
                        stamped.at_ms,
                        *count,
                        *worker,
                    ));
                    self.note_order(stamped.at_ms, *worker, *count, highest, &r);
                    self.seen
                        .entry((*worker, entry.clone(), generation))
                        .or_default()
                        .push((stamped.at_ms, *count));
                }
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
                    reading.insert(*worker, (*stream, *read_id));
                }
                Event::Refused { kept_unwritten, .. } => {
                    for entry in kept_unwritten {
                        if let Some(r) = self.root(entry) {
                            self.unwritten.insert(r);
                        }
                    }
                }
                Event::Flushed { .. }
                | Event::InOrder { .. }
                | Event::Fault(_)
                | Event::Undone(_)
                | Event::Settling
                | Event::Redriven { .. }
                | Event::Delayed { .. }
                | Event::Audited { .. }
                | Event::AuditAcked { .. } => {}
            }
        }
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

    fn decided(&self, root: &str) -> &[Decision] {
        self.decisions
            .get(root)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    fn dead_letters(&self, root: &str) -> usize {
        self.dead.get(root).copied().unwrap_or(0)
    }

    /// Handled past min_idle, an entry may be handled twice, or dead-lettered twice (once by
    /// the consumer that reclaimed it past the cap): the README allows it.
    fn slow(&self, root: &str) -> bool {
        self.decided(root).contains(&Decision::SlowAck) || self.late.contains(root)
    }

    /// How many copies of the root were written: one, unless known by payload, where each
    /// fresh delivery, or each delivery of one read, is a copy of its own.
    fn copies(&self, root: &str, promise: Promise) -> i64 {
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
    fn generations(&self, root: &str) -> i64 {
        1 + self.redrives.get(root).map_or(0, Vec::len) as i64
    }

    /// Neither its side effect ran, nor was it dropped or dead-lettered. Not the last drop
    /// decided: a worker whose stream broke, or whose entry another consumer reclaimed, may
    /// decide after the decision that took effect. Redriven back into its group, it must
    /// have been settled again since its last redrive: an ack or a drop decided since (with
    /// its side effect run, for an ack), or a dead letter still there.
    fn unsettled(&self, end: &EndState, root: &str) -> bool {
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
    fn effect_refused(&self, end: &EndState, root: &str) -> bool {
        self.unsettled(end, root) && self.unwritten.contains(root)
    }
}

/// How many times the root's kept side effect ran.
fn kept_runs(end: &EndState, root: &str) -> i64 {
    end.kept_effects.get(root).copied().unwrap_or(0)
}

fn anomaly(root: Option<String>, what: String) -> Anomaly {
    Anomaly { root, what }
}

/// Lineage: every entry delivered, redriven or dead-lettered is in the stream.
fn lineage(history: &[Stamped], end: &EndState, facts: &Facts) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = history
        .iter()
        .filter_map(|s| match &s.event {
            Event::Delivered { worker, entry, .. } if facts.root(entry).is_none() => Some(anomaly(
                None,
                format!("worker {worker} got {entry}, which is not in the stream"),
            )),
            Event::Redriven { dead, origin, .. } if s.event.in_place_redrive().is_some() => {
                facts.root(origin).is_none().then(|| {
                    anomaly(
                        None,
                        format!(
                            "dead letter {dead} was redriven back into its group as {origin}, \
                             which is not in the stream"
                        ),
                    )
                })
            }
            Event::Redriven { dead, copy, .. } if facts.root(copy).is_none() => Some(anomaly(
                None,
                format!("dead letter {dead} was redriven as {copy}, which no group read"),
            )),
            _ => None,
        })
        .collect();
    anomalies.extend(
        end.dead_letters
            .iter()
            .filter(|(copied_from, _)| facts.root(copied_from).is_none())
            .map(|(copied_from, _)| {
                anomaly(
                    None,
                    format!("a dead letter of {copied_from}, which is not in the stream"),
                )
            }),
    );
    anomalies
}

/// Every delivery's count is 1 to `max_deliveries`.
fn counts_within_the_cap(history: &[Stamped], facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    history
        .iter()
        .filter_map(|s| match &s.event {
            Event::Delivered { entry, count, .. }
                if *count == 0 || *count > promise.max_deliveries =>
            {
                Some(anomaly(
                    Some(facts.root(entry)?),
                    format!(
                        "delivered with count {count} (allowed 1 to max_deliveries {})",
                        promise.max_deliveries
                    ),
                ))
            }
            _ => None,
        })
        .collect()
}

/// The worker finishes its reads in the order they came, so their flushes must be reported in
/// that order on each subscription stream. Not on an ordered one: there a read's settled
/// deliveries whose key has a successor waiting are flushed ahead of the read, each part
/// reported with the read's id, so a later read's part may be reported before an earlier
/// read whose slow delivery is still out, and one read may be reported more than once.
fn flushes_follow_reads(history: &[Stamped]) -> Vec<Anomaly> {
    let ordered: BTreeSet<(u32, u32)> = history
        .iter()
        .filter_map(|s| match &s.event {
            Event::InOrder { worker, stream, .. } => Some((*worker, *stream)),
            _ => None,
        })
        .collect();
    let mut anomalies = Vec::new();
    let mut arrived: HashMap<(u32, u32), Vec<u64>> = HashMap::new();
    let mut flushed: HashMap<(u32, u32), Option<(usize, u64)>> = HashMap::new();
    for stamped in history {
        match &stamped.event {
            Event::Read {
                worker,
                stream,
                read_id,
            } => arrived
                .entry((*worker, *stream))
                .or_default()
                .push(*read_id),
            Event::Flushed {
                worker,
                stream,
                read_id,
                ..
            } if !ordered.contains(&(*worker, *stream)) => {
                let key = (*worker, *stream);
                let at = arrived
                    .get(&key)
                    .and_then(|reads| reads.iter().position(|r| r == read_id));
                let last = flushed.entry(key).or_default();
                match at {
                    // A read that delivered nothing (its entries went straight to the dead
                    // letter) is flushed all the same.
                    None => {}
                    Some(at) if last.is_some_and(|(last_at, _)| at <= last_at) => {
                        let (_, before) = last.expect("checked");
                        anomalies.push(anomaly(
                            None,
                            format!(
                                "worker {worker} got the flush report of read {read_id} after \
                                 that of read {before}, which came later, on its \
                                 subscription stream {stream}"
                            ),
                        ));
                    }
                    Some(at) => *last = Some((at, *read_id)),
                }
            }
            _ => {}
        }
    }
    anomalies
}

/// Read ids increase within a subscription (the proto's promise).
fn reads_in_order(history: &[Stamped]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    let mut last_read: HashMap<(u32, u32), u64> = HashMap::new();
    for stamped in history {
        let Event::Read {
            worker,
            stream,
            read_id,
        } = &stamped.event
        else {
            continue;
        };
        if let Some(last) = last_read
            .insert((*worker, *stream), *read_id)
            .filter(|last| read_id <= last)
        {
            anomalies.push(anomaly(
                None,
                format!(
                    "worker {worker} got read {read_id} after read {last} on its subscription \
                     stream {stream}"
                ),
            ));
        }
    }
    anomalies
}

/// Retention by acknowledgement: nothing leaves the stream before every group read it, and
/// once every group acknowledged everything, the trim leaves at most one entry.
fn retention(end: &EndState) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = end
        .unread_by_every_group
        .iter()
        .map(|n| {
            anomaly(
                None,
                format!("published entry {n} left the stream before every group had read it"),
            )
        })
        .collect();
    if let Some(left) = end.retained_after_settling.filter(|left| *left > 1) {
        anomalies.push(anomaly(
            None,
            format!("retention kept {left} entries once every group had acknowledged everything"),
        ));
    }
    anomalies
}

/// Generations: each dead letter is redriven at most once (the service said so once; a
/// fresh entry was written once).
fn generations(history: &[Stamped], end: &EndState) -> Vec<Anomaly> {
    let mut anomalies: Vec<Anomaly> = end
        .redriven_twice
        .iter()
        .map(|(r, times)| {
            anomaly(
                Some(r.clone()),
                format!("its dead letter was redriven twice (generation {times})"),
            )
        })
        .collect();
    let mut redriven: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    for stamped in history {
        if let Event::Redriven { dead, origin, .. } = &stamped.event {
            redriven.entry(dead).or_insert((origin, 0)).1 += 1;
        }
    }
    anomalies.extend(
        redriven
            .into_iter()
            .filter(|(_, (_, times))| *times > 1)
            .map(|(dead, (origin, times))| {
                anomaly(
                    Some(origin.to_owned()),
                    format!("its dead letter {dead} was redriven {times} times"),
                )
            }),
    );
    anomalies
}

/// A worker never sees an entry's count go back within a generation (a redrive starts it
/// again).
fn counts_never_go_back(facts: &Facts) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for ((worker, entry, _), seen) in &facts.seen {
        let backwards = seen.windows(2).any(|w| w[1].1 < w[0].1);
        if backwards {
            let counts: Vec<u32> = seen.iter().map(|(_, c)| *c).collect();
            anomalies.push(anomaly(
                facts.root(entry),
                format!("worker {worker} saw {entry}'s count go backwards: {counts:?}"),
            ));
        }
    }
    anomalies
}

/// An entry is dead-lettered only once it reached `max_deliveries`.
fn dead_letters_at_the_cap(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    end.dead_letters
        .iter()
        .chain(&facts.redriven_dead)
        .filter(|(_, count)| *count < promise.max_deliveries)
        .filter_map(|(copied_from, count)| {
            Some(anomaly(
                Some(facts.root(copied_from)?),
                format!(
                    "dead-lettered after {count} deliveries, below max_deliveries {}",
                    promise.max_deliveries
                ),
            ))
        })
        .collect()
}

/// Side effects: a dropped or retried delivery's never runs.
fn discarded_effects_never_ran(end: &EndState) -> Vec<Anomaly> {
    end.discarded_effects
        .iter()
        .filter(|(_, ran)| **ran != 0)
        .map(|(r, ran)| {
            anomaly(
                Some(r.clone()),
                format!("a discarded side effect ran {ran} times (drop, retry, retry_after)"),
            )
        })
        .collect()
}

/// Side effects: a kept one runs at most once per ack.
fn effects_follow_acks(end: &EndState, facts: &Facts) -> Vec<Anomaly> {
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let acks = facts.decided(r).iter().filter(|d| d.keeps()).count() as i64;
            let ran = kept_runs(end, r);
            (ran > acks).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("its side effect ran {ran} times for {acks} acks"),
                )
            })
        })
        .collect()
}

/// Atomic mode: a kept side effect runs once per copy, unless handled past min_idle.
fn once_in_atomic_mode(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    if !promise.exactly_once {
        return Vec::new();
    }
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let ran = kept_runs(end, r);
            (ran > facts.copies(r, promise) && !facts.slow(r)).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("its side effect ran {ran} times in atomic mode"),
                )
            })
        })
        .collect()
}

/// A simple list or pub/sub: a kept side effect runs at most once per copy.
fn at_most_once(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    if !promise.at_most_once {
        return Vec::new();
    }
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let ran = kept_runs(end, r);
            (ran > facts.copies(r, promise)).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("its side effect ran {ran} times, at most once promised"),
                )
            })
        })
        .collect()
}

/// One dead letter per copy and generation (a redrive puts an entry back into its group),
/// unless handled past min_idle.
fn one_dead_letter_per_generation(facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    facts
        .all_roots
        .iter()
        .filter_map(|r| {
            let dead_letters = facts.dead_letters(r);
            let allowed = facts.copies(r, promise) * facts.generations(r);
            (dead_letters as i64 > allowed && !facts.slow(r)).then(|| {
                anomaly(
                    Some(r.clone()),
                    format!("dead-lettered {dead_letters} times"),
                )
            })
        })
        .collect()
}

/// At least once: every entry's side effect ran, or it was dropped or dead-lettered. (At most
/// once forgives the loss: it is a figure.)
fn at_least_once(end: &EndState, facts: &Facts, promise: Promise) -> Vec<Anomaly> {
    if promise.at_most_once {
        return Vec::new();
    }
    facts
        .all_roots
        .iter()
        .filter(|r| facts.unsettled(end, r) && !facts.effect_refused(end, r))
        .map(|r| {
            anomaly(
                Some(r.clone()),
                format!(
                    "lost: neither its side effect ran, nor was it dropped or dead-lettered \
                     (decisions {:?})",
                    facts.decided(r)
                ),
            )
        })
        .collect()
}

/// Nothing pending in the group or left in the delay set at the end.
fn nothing_left(history: &[Stamped], end: &EndState) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    if end.pending != 0 {
        anomalies.push(anomaly(
            None,
            format!(
                "{} entries still pending at the end{}",
                end.pending,
                where_held(history, end)
            ),
        ));
    }
    anomalies
}

/// The run's figures: what happened, and what the promises allowed.
fn figures(history: &[Stamped], end: &EndState, facts: &Facts, promise: Promise) -> Figures {
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
            Event::Late { .. }
            | Event::Read { .. }
            | Event::InOrder { .. }
            | Event::Undone(_)
            | Event::Settling
            | Event::Delayed { .. }
            | Event::Audited { .. }
            | Event::AuditAcked { .. } => {}
        }
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

/// Each refusal kind's windows (from its fault to [`AFTER_UNDO_MS`] after its undo, the next
/// refusal or the end of the faults) and the
/// flush reports received within them. A refusal is a fault of one of
/// [`crate::refusal::Refusal::KINDS`]; one never undone lasts to the end of the history.
fn refusals_touched(history: &[Stamped]) -> BTreeMap<String, Touched> {
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

/// How many of the entries still held sit where, then one line per entry: where, and its last
/// events (deliveries and decisions), so that a pending anomaly says what happened to each.
fn where_held(history: &[Stamped], end: &EndState) -> String {
    /// The events shown per entry, the last ones.
    const EVENTS: usize = 6;
    if end.held.is_empty() {
        return " (where: not found when the end state was read)".to_owned();
    }
    let mut places: BTreeMap<&str, usize> = BTreeMap::new();
    for held in &end.held {
        let kind = match held.place {
            Place::List { .. } => "on the list",
            Place::Delayed { .. } => "in the delay set",
            Place::Processing { .. } => "on a processing list",
            Place::Pending { .. } => "pending in the group",
            Place::Unread => "unread",
        };
        *places.entry(kind).or_default() += 1;
    }
    let counts: Vec<String> = places.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut out = format!(" ({})", counts.join(", "));
    for held in &end.held {
        let r = &held.entry;
        let events: Vec<String> = history
            .iter()
            .filter_map(|s| {
                let (worker, entry, what) = match &s.event {
                    Event::Delivered {
                        worker,
                        entry,
                        count,
                    } => (worker, entry, format!("delivered #{count}")),
                    Event::Decided {
                        worker,
                        entry,
                        decision,
                    } => (worker, entry, format!("{decision:?}")),
                    _ => return None,
                };
                (entry == r).then(|| format!("{} ms w{worker} {what}", s.at_ms))
            })
            .collect();
        let last = &events[events.len().saturating_sub(EVENTS)..];
        let events = if last.is_empty() {
            "never delivered".to_owned()
        } else {
            last.join(", ")
        };
        out.push_str(&format!(
            "\n       {}: {}; {events}",
            held.entry, held.place
        ));
    }
    out
}

/// The events about `root` (its deliveries, decisions, redrives and what the audit group read
/// of it) and every fault within `window_ms` of them, for an anomaly's report.
pub(crate) fn around<'a>(history: &'a [Stamped], root: &str, window_ms: u64) -> Vec<&'a Stamped> {
    let own = |s: &Stamped| match &s.event {
        Event::Delivered { entry, .. }
        | Event::Decided { entry, .. }
        | Event::Late { entry }
        | Event::Delayed { entry, .. }
        | Event::Audited { entry, .. } => entry == root,
        Event::Redriven { origin, copy, .. } => origin == root || copy == root,
        Event::AuditAcked { entries } => entries.iter().any(|e| e == root),
        Event::Refused { kept_unwritten, .. } => kept_unwritten.iter().any(|e| e == root),
        Event::Fault(_)
        | Event::Undone(_)
        | Event::Settling
        | Event::Read { .. }
        | Event::Flushed { .. }
        | Event::InOrder { .. } => false,
    };
    let times: Vec<u64> = history
        .iter()
        .filter(|s| own(s) && !matches!(s.event, Event::Refused { .. }))
        .map(|s| s.at_ms)
        .collect();
    history
        .iter()
        .filter(|s| {
            own(s)
                || (matches!(
                    s.event,
                    Event::Fault(_) | Event::Undone(_) | Event::Redriven { .. }
                ) && times.iter().any(|t| s.at_ms.abs_diff(*t) <= window_ms))
        })
        .collect()
}

/// For an anomaly's report, what the workers that got `root` did before each delivery of it:
/// the read it came in (and that read's flush reports), and the slow acks the same worker
/// decided within `window_ms` before (a worker asleep past `min_idle` leaves the reads behind
/// that one waiting in its stream). Whether the entry was handled past `min_idle` shows here,
/// where its own events cannot tell.
pub(crate) fn workers_before<'a>(
    history: &'a [Stamped],
    root: &str,
    window_ms: u64,
) -> Vec<&'a Stamped> {
    let mut picked = BTreeSet::new();
    for (i, s) in history.iter().enumerate() {
        let Event::Delivered { worker, entry, .. } = &s.event else {
            continue;
        };
        if entry != root {
            continue;
        }
        let carried_by = history[..i]
            .iter()
            .rposition(|e| matches!(&e.event, Event::Read { worker: w, .. } if w == worker));
        picked.extend(carried_by);
        // The reports of that read: whether its flush failed, and what Redis refused.
        if let Some(Event::Read {
            stream, read_id, ..
        }) = carried_by.map(|at| &history[at].event)
        {
            picked.extend(history.iter().enumerate().skip(i).filter_map(|(j, e)| {
                let (w, st, r) = match &e.event {
                    Event::Flushed {
                        worker,
                        stream,
                        read_id,
                        ..
                    }
                    | Event::Refused {
                        worker,
                        stream,
                        read_id,
                        ..
                    } => (worker, stream, read_id),
                    _ => return None,
                };
                (w == worker && st == stream && r == read_id).then_some(j)
            }));
        }
        picked.extend(
            history[..i]
                .iter()
                .enumerate()
                .filter(|(_, e)| s.at_ms.saturating_sub(e.at_ms) <= window_ms)
                .filter(|(_, e)| {
                    matches!(&e.event, Event::Decided { worker: w, decision: Decision::SlowAck, .. }
                        if w == worker)
                })
                .map(|(j, _)| j),
        );
    }
    picked.into_iter().map(|i| &history[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMISE: Promise = Promise {
        exactly_once: false,
        max_deliveries: 4,
        at_most_once: false,
        by_payload: false,
    };

    fn at(at_ms: u64, event: Event) -> Stamped {
        Stamped { at_ms, event }
    }

    fn delivered(entry: &str, count: u32) -> Event {
        Event::Delivered {
            worker: 1,
            entry: entry.into(),
            count,
        }
    }

    fn decided(entry: &str, decision: Decision) -> Event {
        Event::Decided {
            worker: 1,
            entry: entry.into(),
            decision,
        }
    }

    fn end(entries: &[&str]) -> EndState {
        EndState {
            entries: entries.iter().map(|id| id.to_string()).collect(),
            ..EndState::default()
        }
    }

    #[test]
    fn an_ack_whose_side_effect_redis_refused_is_settled_only_when_its_report_says_so() {
        let e = end(&["1-0", "2-0"]);
        let read = |read_id| Event::Read {
            worker: 1,
            stream: 1,
            read_id,
        };
        let flushed = |read_id, ok| Event::Flushed {
            worker: 1,
            stream: 1,
            read_id,
            ok,
        };
        // Both acked, neither side effect ran: read 1's report said Redis refused 1-0's side
        // effect while its settle stood; read 2's said nothing of the kind.
        let history = vec![
            at(0, Event::Fault("oom [6379] for 900 ms".into())),
            at(1, read(1)),
            at(2, delivered("1-0", 1)),
            at(3, decided("1-0", Decision::Ack)),
            at(4, flushed(1, false)),
            at(
                4,
                Event::Refused {
                    worker: 1,
                    stream: 1,
                    read_id: 1,
                    error: "oom".into(),
                    requeues: vec!["oom".into()],
                    kept_unwritten: vec!["1-0".into()],
                },
            ),
            at(900, Event::Undone("oom".into())),
            at(5_000, flushed(9, true)),
            at(5_500, Event::Settling),
            at(5_600, flushed(11, true)),
            at(6_000, flushed(10, false)),
            at(6_100, read(2)),
            at(6_101, delivered("2-0", 1)),
            at(6_102, decided("2-0", Decision::Ack)),
            at(6_103, flushed(2, false)),
        ];
        let (anomalies, figures) = check(&history, &e, PROMISE);
        assert_eq!(anomalies.len(), 1, "{anomalies:?}");
        assert_eq!(anomalies[0].root.as_deref(), Some("2-0"));
        assert_eq!(figures.effects_refused, 1);
        assert_eq!(figures.requeue_refused["oom"], 1);
        // The window runs from the fault to a moment after its undo: read 9's report is in
        // it, read 10's and read 2's are not.
        let touched = &figures.refusals["oom"];
        assert_eq!(
            (
                touched.injected,
                touched.reports,
                touched.failed,
                touched.refused
            ),
            (1, 2, 1, 1)
        );
        assert_eq!(
            (
                touched.requeue_refused,
                touched.requeue_refused_entries,
                touched.effects_refused
            ),
            (1, 1, 1)
        );
        // The other faults are not refusals.
        let mut other = history;
        other[0] = at(0, Event::Fault("client-kill normal on 6379".into()));
        assert!(check(&other, &e, PROMISE).1.refusals.is_empty());
    }

    #[test]
    fn retention_and_redrive_anomalies_are_reported() {
        let mut e = end(&["1-0", "2-0"]);
        e.kept_effects = HashMap::from([("1-0".into(), 1), ("2-0".into(), 1)]);
        let acked = [
            at(1, delivered("1-0", 1)),
            at(2, decided("1-0", Decision::Ack)),
            at(3, delivered("2-0", 1)),
            at(4, decided("2-0", Decision::Ack)),
        ];
        assert!(check(&acked, &e, PROMISE).0.is_empty());
        e.unread_by_every_group = vec![7];
        e.retained_after_settling = Some(40);
        e.redriven_twice = vec![("1-0".into(), 1)];
        let mut history = acked.to_vec();
        history.push(at(
            5,
            Event::Redriven {
                dead: "9-0".into(),
                origin: "1-0".into(),
                deliveries: 4,
                copy: "8-0".into(),
            },
        ));
        let (anomalies, figures) = check(&history, &e, PROMISE);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        assert_eq!(figures.redriven, 1);
        assert_eq!(
            text,
            [
                "dead letter 9-0 was redriven as 8-0, which no group read",
                "published entry 7 left the stream before every group had read it",
                "retention kept 40 entries once every group had acknowledged everything",
                "entry 1-0: its dead letter was redriven twice (generation 1)",
            ]
        );
    }

    #[test]
    fn a_redrive_back_into_the_group_starts_a_generation_of_the_same_entry() {
        let mut state = end(&["1-0"]);
        state.kept_effects.insert("1-0".into(), 1);
        let redriven = |t| {
            at(
                t,
                Event::Redriven {
                    dead: "9-0".into(),
                    origin: "1-0".into(),
                    deliveries: 4,
                    copy: "1-0".into(),
                },
            )
        };
        // Dead-lettered at the cap, redriven back with its id, delivered from 1 again, acked.
        let mut history: Vec<Stamped> = (1..=4)
            .flat_map(|n| {
                [
                    at(10 * u64::from(n), delivered("1-0", n)),
                    at(10 * u64::from(n) + 1, decided("1-0", Decision::Retry)),
                ]
            })
            .collect();
        history.push(redriven(100));
        history.push(at(200, delivered("1-0", 1)));
        history.push(at(201, decided("1-0", Decision::Ack)));
        let (anomalies, figures) = check(&history, &state, PROMISE);
        assert_eq!(anomalies, vec![]);
        assert_eq!((figures.redriven, figures.redriven_in_place), (1, 1));
        assert_eq!(figures.dead_letters, 1);
        // Its generation must be settled again: an ack before the redrive does not count.
        let mut unsettled = history.clone();
        unsettled.truncate(unsettled.len() - 2);
        unsettled.insert(0, at(0, decided("1-0", Decision::Ack)));
        let (anomalies, _) = check(&unsettled, &state, PROMISE);
        assert!(
            anomalies.len() == 1 && anomalies[0].what.starts_with("lost"),
            "{anomalies:?}"
        );
        // The same dead letter redriven twice.
        let mut twice = history.clone();
        twice.insert(9, redriven(150));
        let (anomalies, _) = check(&twice, &state, PROMISE);
        assert!(
            anomalies
                .iter()
                .any(|a| a.what == "its dead letter 9-0 was redriven 2 times"),
            "{anomalies:?}"
        );
        // Without the redrive, the count going back is an anomaly.
        let mut no_redrive = history;
        no_redrive.retain(|s| !matches!(s.event, Event::Redriven { .. }));
        let (anomalies, _) = check(&no_redrive, &state, PROMISE);
        assert!(
            anomalies.iter().any(|a| a.what.contains("backwards")),
            "{anomalies:?}"
        );
    }

    #[test]
    fn a_history_that_keeps_every_promise_has_no_anomaly() {
        let mut state = end(&["1-0", "5-0", "6-0"]);
        state.kept_effects.insert("1-0".into(), 1);
        state.dead_letters.push(("6-0".into(), 4));
        let history = vec![
            at(0, delivered("1-0", 1)),
            at(1, decided("1-0", Decision::Retry)),
            at(2, Event::Fault("sigkill sidecar-0".into())),
            at(3, delivered("1-0", 2)),
            at(4, decided("1-0", Decision::Ack)),
            at(5, delivered("5-0", 1)),
            at(6, decided("5-0", Decision::Drop)),
            at(7, delivered("6-0", 4)),
            at(8, decided("6-0", Decision::Abandon)),
        ];
        let (anomalies, figures) = check(&history, &state, PROMISE);
        assert_eq!(anomalies, vec![]);
        assert_eq!(figures.roots, 3);
        assert_eq!(figures.deliveries, 4);
        assert_eq!(figures.faults["sigkill"], 1);
    }

    #[test]
    fn a_lost_entry_a_ran_drop_and_a_twice_run_atomic_effect_are_anomalies() {
        let mut state = end(&["1-0", "2-0", "3-0"]);
        state.discarded_effects.insert("2-0".into(), 1);
        state.kept_effects.insert("3-0".into(), 2);
        state.pending = 1;
        let history = vec![
            at(0, delivered("1-0", 1)),
            at(1, decided("1-0", Decision::Abandon)),
            at(2, delivered("2-0", 1)),
            at(3, decided("2-0", Decision::Drop)),
            at(4, delivered("3-0", 1)),
            at(5, decided("3-0", Decision::Ack)),
            at(6, delivered("3-0", 2)),
            at(7, decided("3-0", Decision::Ack)),
        ];
        let promise = Promise {
            exactly_once: true,
            ..PROMISE
        };
        let (anomalies, _) = check(&history, &state, promise);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        assert!(
            text.iter().any(|a| a.starts_with("entry 1-0: lost")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|a| a.contains("2-0: a discarded side effect ran")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|a| a.contains("3-0: its side effect ran 2 times in atomic"))
        );
        assert!(
            text.iter().any(|a| a.contains("1 entries still pending")),
            "{text:?}"
        );
        // At least once allows the second run.
        let (anomalies, figures) = check(&history, &state, PROMISE);
        assert!(!anomalies.iter().any(|a| a.what.contains("in atomic mode")));
        assert_eq!(figures.duplicate_effects, 1);
        // So does atomic mode when the entry's read was handled past min_idle.
        let mut late = history;
        late.push(at(
            8,
            Event::Late {
                entry: "3-0".into(),
            },
        ));
        let (anomalies, _) = check(&late, &state, promise);
        assert!(!anomalies.iter().any(|a| a.what.contains("in atomic mode")));
    }

    #[test]
    fn a_lower_count_seen_after_a_higher_one_was_handled_past_min_idle() {
        let mut state = end(&["3-0"]);
        state.kept_effects.insert("3-0".into(), 2);
        let promise = Promise {
            exactly_once: true,
            ..PROMISE
        };
        let on = |worker, event| match event {
            Event::Delivered { entry, count, .. } => Event::Delivered {
                worker,
                entry,
                count,
            },
            Event::Decided {
                entry, decision, ..
            } => Event::Decided {
                worker,
                entry,
                decision,
            },
            other => other,
        };
        // Worker 1 claimed it (count 2) while worker 2's first delivery was still on its way.
        let history = vec![
            at(0, on(1, delivered("3-0", 2))),
            at(1, on(1, decided("3-0", Decision::Ack))),
            at(100, on(2, delivered("3-0", 1))),
            at(101, on(2, decided("3-0", Decision::Ack))),
        ];
        let (anomalies, _) = check(&history, &state, promise);
        assert_eq!(anomalies, vec![]);
        // After a failover too: the sidecar makes every count it delivers durable.
        let mut failover = history.clone();
        failover.insert(2, at(50, Event::Fault("primary-kill 7000".into())));
        let (anomalies, _) = check(&failover, &state, promise);
        assert_eq!(anomalies, vec![]);
        // Nor in the order Redis counts: the second delivery is the claim of a quick one.
        let mut in_order = history;
        in_order.swap(0, 2);
        in_order.swap(1, 3);
        let (anomalies, _) = check(&in_order, &state, promise);
        assert!(
            anomalies.iter().any(|a| a.what.contains("in atomic mode")),
            "{anomalies:?}"
        );
    }

    #[test]
    fn counts_past_the_cap_backwards_or_an_effect_without_an_ack_are_anomalies() {
        let mut state = end(&["1-0", "2-0"]);
        state.kept_effects.insert("2-0".into(), 1);
        state.dead_letters.push(("1-0".into(), 2));
        state.dead_letters.push(("1-0".into(), 4));
        let history = vec![
            at(0, delivered("1-0", 3)),
            at(1, delivered("1-0", 2)),
            at(2, delivered("1-0", 5)),
            at(3, delivered("2-0", 1)),
            at(4, decided("2-0", Decision::Drop)),
        ];
        let (anomalies, _) = check(&history, &state, PROMISE);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        // Across a Redis restart too: the sidecar makes every count it delivers durable.
        let mut restarted = history;
        restarted.insert(
            1,
            at(0, Event::Fault("redis-restart (SIGKILL, AOF)".into())),
        );
        let (restarted, _) = check(&restarted, &state, PROMISE);
        assert!(
            restarted.iter().any(|a| a.what.contains("backwards")),
            "{restarted:?}"
        );
        for want in [
            "1-0: delivered with count 5",
            "1-0's count go backwards",
            "1-0: dead-lettered after 2 deliveries",
            "1-0: dead-lettered 2 times",
            "2-0: its side effect ran 1 times for 0 acks",
        ] {
            assert!(
                text.iter().any(|a| a.contains(want)),
                "{want:?} not in {text:?}"
            );
        }
    }

    #[test]
    fn at_most_once_forgives_a_loss_but_not_a_second_run_unless_the_value_was_written_twice() {
        let promise = Promise {
            at_most_once: true,
            by_payload: true,
            ..PROMISE
        };
        let mut state = end(&["1", "2", "3"]);
        state.kept_effects.insert("2".into(), 2);
        state.kept_effects.insert("3".into(), 2);
        let history = vec![
            // 1 was popped and lost with its sidecar: at most once allows it.
            at(0, delivered("1", 1)),
            at(1, decided("1", Decision::Abandon)),
            // 2 ran twice for one copy.
            at(2, delivered("2", 1)),
            at(3, decided("2", Decision::Ack)),
            at(4, delivered("2", 2)),
            at(5, decided("2", Decision::Ack)),
            // 3 was published twice (a retried publish): two fresh copies, each kept once.
            at(6, delivered("3", 1)),
            at(7, decided("3", Decision::Ack)),
            at(8, delivered("3", 1)),
            at(9, decided("3", Decision::Ack)),
        ];
        let (anomalies, figures) = check(&history, &state, promise);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            ["entry 2: its side effect ran 2 times, at most once promised"]
        );
        assert_eq!(figures.lost_at_most_once, 1);
        assert_eq!(figures.duplicate_publishes, 1);
    }

    #[test]
    fn two_deliveries_of_a_value_in_one_read_are_two_copies_whatever_their_count() {
        let promise = Promise {
            at_most_once: true,
            by_payload: true,
            ..PROMISE
        };
        let mut state = end(&["775", "776"]);
        state.kept_effects.insert("775".into(), 2);
        state.dead_letters.push(("776".into(), 4));
        state.dead_letters.push(("776".into(), 4));
        let read = |worker, read_id| Event::Read {
            worker,
            stream: 3,
            read_id,
        };
        // A publish written twice (its reply lost to a reconnect, then resent): two copies of
        // 775 side by side. Both went to a worker that never saw them and came back counted,
        // each raising the count the copies share, so neither is ever delivered fresh. Both
        // then come in one read: two copies, each kept once. Same for two dead letters of 776.
        let history = vec![
            at(0, read(1, 9)),
            at(1, delivered("775", 3)),
            at(1, delivered("775", 3)),
            at(1, delivered("776", 4)),
            at(1, delivered("776", 4)),
            at(2, decided("775", Decision::Ack)),
            at(2, decided("775", Decision::Ack)),
            at(2, decided("776", Decision::Retry)),
            at(2, decided("776", Decision::Retry)),
        ];
        let (anomalies, figures) = check(&history, &state, promise);
        assert_eq!(anomalies, vec![]);
        assert_eq!(figures.duplicate_publishes, 2);
        // One copy delivered twice, in two reads, is no second copy.
        let history = vec![
            at(0, read(1, 9)),
            at(1, delivered("775", 3)),
            at(2, decided("775", Decision::Ack)),
            at(3, read(1, 10)),
            at(4, delivered("775", 4)),
            at(5, decided("775", Decision::Ack)),
        ];
        let (anomalies, _) = check(&history, &state, promise);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "entry 775: its side effect ran 2 times, at most once promised",
                "entry 776: dead-lettered 2 times"
            ]
        );
        // Another worker's read in between does not join the two.
        let history = vec![
            at(0, read(1, 9)),
            at(1, read(2, 4)),
            at(2, delivered("775", 3)),
            at(
                3,
                Event::Delivered {
                    worker: 2,
                    entry: "775".into(),
                    count: 3,
                },
            ),
        ];
        let (anomalies, _) = check(&history, &state, promise);
        assert!(
            anomalies.iter().any(|a| a.what.contains("ran 2 times")),
            "{anomalies:?}"
        );
    }

    #[test]
    fn flush_reports_follow_the_order_reads_came_in() {
        let state = end(&[]);
        let read = |read_id| Event::Read {
            worker: 1,
            stream: 7,
            read_id,
        };
        let flushed = |read_id| Event::Flushed {
            worker: 1,
            stream: 7,
            read_id,
            ok: true,
        };
        let in_order = vec![
            at(0, read(1)),
            at(1, read(2)),
            // Read 0 delivered nothing (dead-lettered on the way): reported, never received.
            at(2, flushed(0)),
            at(3, flushed(1)),
            at(4, flushed(2)),
        ];
        let (anomalies, figures) = check(&in_order, &state, PROMISE);
        assert_eq!(anomalies, vec![]);
        assert_eq!(figures.flushes, 3);
        let swapped = vec![
            at(0, read(1)),
            at(1, read(2)),
            at(2, flushed(2)),
            at(3, flushed(1)),
            at(4, read(2)),
        ];
        let (anomalies, _) = check(&swapped, &state, PROMISE);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "worker 1 got the flush report of read 1 after that of read 2, which came later, \
                 on its subscription stream 7",
                "worker 1 got read 2 after read 2 on its subscription stream 7",
            ]
        );
    }

    #[test]
    fn a_count_going_back_is_an_anomaly_across_a_failover_too() {
        let state = end(&["1-0"]);
        let failover = |t| {
            at(
                t,
                Event::Fault("primary-kill 7000 (replica takes over)".into()),
            )
        };
        // Read before the failover, seen after it: the sidecar made the count durable (with
        // `--wait-replicas`, on the replica before delivering), so it never goes back.
        let waited = vec![
            failover(1_000),
            at(1_700, delivered("1-0", 2)),
            at(3_000, delivered("1-0", 1)),
        ];
        let (anomalies, _) = check(&waited, &state, PROMISE);
        assert!(anomalies.iter().any(|a| a.what.contains("backwards")));
    }

    #[test]
    fn a_pending_anomaly_says_where_each_entry_sits_and_what_happened_to_it() {
        let promise = Promise {
            at_most_once: true,
            by_payload: true,
            ..PROMISE
        };
        let mut state = end(&["7", "8", "9"]);
        state.kept_effects.insert("9".into(), 1);
        state.pending = 3;
        state.held = vec![
            Held {
                entry: "8".into(),
                place: Place::List { ahead: 0 },
            },
            Held {
                entry: "7".into(),
                place: Place::List { ahead: 1 },
            },
            Held {
                entry: "9".into(),
                place: Place::Delayed { due_in_ms: -5_000 },
            },
        ];
        let history = vec![
            at(100, delivered("7", 1)),
            at(101, decided("7", Decision::SlowAck)),
            at(200, delivered("9", 1)),
            at(201, decided("9", Decision::RetryAfter)),
            at(900, delivered("9", 2)),
            at(901, decided("9", Decision::Ack)),
        ];
        let (anomalies, _) = check(&history, &state, promise);
        let text: Vec<String> = anomalies.iter().map(ToString::to_string).collect();
        println!("{}", text.join("\n"));
        assert_eq!(
            text,
            [
                "3 entries still pending at the end (1 in the delay set, 2 on the list)\n       \
                 8: on the list, read next; never delivered\n       \
                 7: on the list, 1 entry read before it; 100 ms w1 delivered #1, 101 ms w1 \
                 SlowAck\n       \
                 9: in the delay set, overdue by 5000 ms; 200 ms w1 delivered #1, 201 ms w1 \
                 RetryAfter, 900 ms w1 delivered #2, 901 ms w1 Ack"
            ]
        );
        // Nothing found where it sits: said so.
        state.held.clear();
        let (anomalies, _) = check(&history, &state, promise);
        assert_eq!(
            anomalies[0].what,
            "3 entries still pending at the end (where: not found when the end state was read)"
        );
    }

    #[test]
    fn the_events_around_an_entry_are_its_own_and_the_faults_near_them() {
        let history = vec![
            at(0, Event::Fault("pause redis".into())),
            at(100, delivered("1-0", 1)),
            at(5_000, Event::Fault("sigkill sidecar-0".into())),
            at(9_000, delivered("9-0", 1)),
            at(9_100, delivered("1-0", 2)),
        ];
        let near = around(&history, "1-0", 500);
        let times: Vec<u64> = near.iter().map(|s| s.at_ms).collect();
        assert_eq!(times, [0, 100, 9_100]);
    }

    #[test]
    fn a_report_shows_the_read_an_entry_came_in_and_its_worker_s_slow_acks_before() {
        let read = |worker, read_id| Event::Read {
            worker,
            stream: 0,
            read_id,
        };
        let history = vec![
            at(0, decided("6-0", Decision::SlowAck)),
            at(1_000, read(1, 1)),
            at(1_000, decided("5-0", Decision::SlowAck)),
            at(1_100, read(2, 7)),
            at(1_200, Event::Fault("sigterm sidecar-1".into())),
            at(5_500, read(1, 2)),
            at(5_500, delivered("1-0", 1)),
            at(5_500, decided("1-0", Decision::Ack)),
        ];
        let before = workers_before(&history, "1-0", 5_000);
        let times: Vec<u64> = before.iter().map(|s| s.at_ms).collect();
        // Worker 1's read 2 that carried it and its slow ack at 1,000 ms; not the one 5.5 s
        // before, nor worker 2's read, nor the fault (the report's other half shows faults).
        assert_eq!(times, [1_000, 5_500]);
        assert!(matches!(before[1].event, Event::Read { read_id: 2, .. }));
    }
}
