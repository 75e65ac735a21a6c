use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

const LIMITS: Limits = Limits {
    max_commands_per_slot: 8,
};

fn incr(key: &str) -> Result<Command, CommandError> {
    Command::new("INCR", vec![Bytes::copy_from_slice(key.as_bytes())])
}

fn window_with_read(entries: &[&'static str]) -> (Window<&'static str>, OpenedRead) {
    let mut window = Window::new(LIMITS);
    let read = window.open_read(entries.to_vec()).unwrap();
    (window, read)
}

#[test]
fn the_seed_diagram_acked_segments_in_commit_order_then_every_settle() {
    let (mut w, read) = window_with_read(&["1-0", "2-0", "3-0"]);
    let s = read.first_slot;
    for (slot, key) in [(s, "a"), (s + 1, "b"), (s + 2, "c")] {
        w.queue(slot, incr(key)).unwrap();
    }
    assert_eq!(w.settle(s + 2, Outcome::Ack, None).unwrap(), None);
    assert_eq!(w.settle(s + 1, Outcome::Drop, None).unwrap(), None);
    let batch = w
        .settle(s, Outcome::Ack, None)
        .unwrap()
        .expect("read complete");
    assert_eq!(batch.read_id, 1);
    let kept: Vec<_> = batch
        .kept
        .iter()
        .map(|k| (k.slot, k.commands.clone()))
        .collect();
    // Commit order is the order of the acks: 3-0 was acked first.
    assert_eq!(
        kept,
        vec![
            (s + 2, vec![incr("c").unwrap()]),
            (s, vec![incr("a").unwrap()])
        ]
    );
    let settled: Vec<_> = batch.settles.iter().map(|x| (x.entry, x.outcome)).collect();
    assert_eq!(
        settled,
        vec![
            ("1-0", Outcome::Ack),
            ("2-0", Outcome::Drop),
            ("3-0", Outcome::Ack)
        ]
    );
    assert_eq!(batch.settles[batch.kept[0].settle].entry, "3-0");
    assert_eq!(batch.dropped_segments(), 1);
    assert_eq!(w.outstanding(), 0);
    assert_eq!(w.open_reads(), 0);
}

#[test]
fn a_numbered_window_hands_out_ids_above_its_base_and_knows_no_other() {
    let base = 7 << 36;
    let mut w = Window::numbered_from(LIMITS, base);
    let read = w.open_read(vec!["1-0", "2-0"]).unwrap();
    assert_eq!((read.read_id, read.first_slot), (base + 1, base + 1));
    assert_eq!(
        w.settle(1, Outcome::Ack, None),
        Err(SlotError::UnknownSlot(1))
    );
    assert_eq!(
        w.settle(base, Outcome::Ack, None),
        Err(SlotError::UnknownSlot(base))
    );
    w.settle(base + 2, Outcome::Ack, None).unwrap();
    let batch = w
        .settle(base + 1, Outcome::Ack, None)
        .unwrap()
        .expect("read complete");
    assert_eq!(batch.read_id, base + 1);
}

#[test]
fn slots_are_never_reused() {
    let mut w = Window::new(LIMITS);
    let a = w.open_read(vec!["1", "2"]).unwrap();
    w.settle(a.first_slot, Outcome::Ack, None).unwrap();
    w.settle(a.first_slot + 1, Outcome::Ack, None).unwrap();
    let b = w.open_read(vec!["3"]).unwrap();
    assert_eq!(b.first_slot, a.first_slot + 2);
    assert_eq!(b.read_id, a.read_id + 1);
    // A late command for a flushed slot is refused, never queued into the new delivery.
    assert_eq!(
        w.queue(a.first_slot, incr("late")),
        Err(SlotError::AlreadySettled(a.first_slot))
    );
}

#[test]
fn refuses_unknown_and_settled_slots() {
    let (mut w, read) = window_with_read(&["1", "2"]);
    assert_eq!(w.queue(0, incr("k")), Err(SlotError::UnknownSlot(0)));
    assert_eq!(
        w.settle(99, Outcome::Ack, None),
        Err(SlotError::UnknownSlot(99))
    );
    w.settle(read.first_slot, Outcome::Drop, None).unwrap();
    assert_eq!(
        w.settle(read.first_slot, Outcome::Ack, None),
        Err(SlotError::AlreadySettled(read.first_slot))
    );
    assert_eq!(
        w.queue(read.first_slot, incr("k")),
        Err(SlotError::AlreadySettled(read.first_slot))
    );
}

#[test]
fn a_refused_command_makes_the_segment_incomplete() {
    let (mut w, read) = window_with_read(&["1"]);
    let slot = read.first_slot;
    w.queue(slot, incr("a")).unwrap();
    let err = w.queue(slot, Command::new("FLUSHALL", vec![])).unwrap_err();
    assert!(matches!(err, SlotError::InvalidCommand { .. }));
    assert_eq!(
        w.settle(slot, Outcome::Ack, None),
        Err(SlotError::IncompleteSegment(slot))
    );
    // It is still open: the client can settle it another way.
    let batch = w.settle(slot, Outcome::Retry, None).unwrap().unwrap();
    assert!(batch.kept.is_empty());
    assert_eq!(batch.settles[0].outcome, Outcome::Retry);
}

#[test]
fn a_segment_holds_a_bounded_number_of_commands() {
    let (mut w, read) = window_with_read(&["1"]);
    for _ in 0..LIMITS.max_commands_per_slot {
        w.queue(read.first_slot, incr("a")).unwrap();
    }
    assert_eq!(
        w.queue(read.first_slot, incr("a")),
        Err(SlotError::TooManyCommands {
            slot: read.first_slot,
            limit: LIMITS.max_commands_per_slot
        })
    );
}

#[test]
fn abandoned_deliveries_are_never_settled() {
    let (mut w, read) = window_with_read(&["1", "2", "3"]);
    w.queue(read.first_slot, incr("a")).unwrap();
    w.queue(read.first_slot + 1, incr("b")).unwrap();
    w.settle(read.first_slot, Outcome::Ack, None).unwrap();
    let batches = w.abandon_all();
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    assert_eq!(batch.abandoned, 2);
    assert_eq!(batch.settles.len(), 1);
    assert_eq!(batch.settles[0].entry, "1");
    assert_eq!(batch.kept.len(), 1);
    assert_eq!(w.outstanding(), 0);
}

#[test]
fn a_read_that_is_entirely_abandoned_sends_nothing() {
    let (mut w, _) = window_with_read(&["1", "2"]);
    assert!(w.abandon_all().is_empty());
    assert_eq!(w.open_reads(), 0);
}

#[test]
fn reads_flush_independently() {
    let mut w = Window::new(LIMITS);
    let a = w.open_read(vec!["a1", "a2"]).unwrap();
    let b = w.open_read(vec!["b1"]).unwrap();
    assert_eq!(w.outstanding(), 3);
    let batch = w.settle(b.first_slot, Outcome::Ack, None).unwrap().unwrap();
    assert_eq!(batch.read_id, b.read_id);
    assert_eq!(w.outstanding(), 2);
    assert_eq!(
        w.outstanding_entries().copied().collect::<Vec<_>>(),
        vec!["a1", "a2"]
    );
    w.settle(a.first_slot + 1, Outcome::Ack, None).unwrap();
    let batch = w
        .settle(a.first_slot, Outcome::Drop, None)
        .unwrap()
        .unwrap();
    assert_eq!(batch.read_id, a.read_id);
}

#[test]
fn the_mixed_window_keeps_thirteen_of_twenty() {
    let entries: Vec<u32> = (0..20).collect();
    let mut w = Window::new(LIMITS);
    let read = w.open_read(entries).unwrap();
    let mut batch = None;
    for i in 0..20u64 {
        let slot = read.first_slot + i;
        w.queue(slot, incr(&format!("k{i}"))).unwrap();
        let outcome = if i % 3 == 0 {
            Outcome::Drop
        } else {
            Outcome::Ack
        };
        batch = w.settle(slot, outcome, None).unwrap();
    }
    let batch = batch.unwrap();
    assert_eq!(batch.kept.len(), 13);
    assert_eq!(batch.command_count(), 13);
    assert_eq!(batch.settles.len(), 20);
    assert_eq!(batch.dropped_segments(), 7);
}

#[test]
fn settled_deliveries_flush_ahead_of_their_read_and_the_rest_after() {
    let (mut w, read) = window_with_read(&["1", "2", "3", "4"]);
    let s = read.first_slot;
    for i in 0..4 {
        w.queue(s + i, incr(&format!("k{i}"))).unwrap();
    }
    w.settle(s + 2, Outcome::Ack, None).unwrap();
    w.settle(s, Outcome::Ack, None).unwrap();
    w.settle(s + 1, Outcome::Drop, None).unwrap();
    assert_eq!(w.held(), 4);
    let early = w.flush_settled(s + 2).expect("three settled");
    assert_eq!(early.read_id, read.read_id);
    assert!(early.early, "another batch of the read follows");
    assert_eq!(early.deliveries, 3);
    let kept: Vec<_> = early.kept.iter().map(|k| k.slot).collect();
    assert_eq!(kept, vec![s + 2, s], "commit order");
    let settled: Vec<_> = early.settles.iter().map(|x| x.entry).collect();
    assert_eq!(settled, vec!["1", "2", "3"]);
    assert_eq!(early.settles[early.kept[0].settle].entry, "3");
    // Flushed is gone from the window: not held, not settled again, nothing left to flush.
    assert_eq!(w.held(), 1);
    assert_eq!(w.held_entries().copied().collect::<Vec<_>>(), vec!["4"]);
    assert_eq!(
        w.settle(s, Outcome::Ack, None),
        Err(SlotError::AlreadySettled(s))
    );
    assert_eq!(w.queue(s, incr("late")), Err(SlotError::AlreadySettled(s)));
    assert!(w.flush_settled(s).is_none());
    // The read's own batch carries the rest.
    let rest = w
        .settle(s + 3, Outcome::Ack, None)
        .unwrap()
        .expect("read complete");
    assert_eq!(rest.deliveries, 1);
    assert!(!rest.early);
    assert_eq!(rest.settles.len(), 1);
    assert_eq!(rest.settles[0].entry, "4");
    assert_eq!(rest.kept.len(), 1);
    assert_eq!(rest.settles[rest.kept[0].settle].entry, "4");
    assert_eq!(w.held(), 0);
    assert_eq!(w.open_reads(), 0);
}

#[test]
fn a_read_flushed_early_and_then_abandoned_sends_nothing_more() {
    let (mut w, read) = window_with_read(&["1", "2"]);
    w.settle(read.first_slot, Outcome::Ack, None).unwrap();
    assert!(w.flush_settled(read.first_slot).is_some());
    assert!(w.abandon_all().is_empty());
    assert_eq!(w.held(), 0);
}

/// One step of a random interleaving.
#[derive(Clone, Debug)]
enum Op {
    Read(u8),
    Queue { pick: usize, key: u8 },
    Settle { pick: usize, outcome: u8 },
    FlushSettled { pick: usize },
    AbandonAll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u8..5).prop_map(Op::Read),
        (any::<usize>(), any::<u8>()).prop_map(|(pick, key)| Op::Queue { pick, key }),
        (any::<usize>(), 0u8..6).prop_map(|(pick, outcome)| Op::Settle { pick, outcome }),
        any::<usize>().prop_map(|pick| Op::FlushSettled { pick }),
        Just(Op::AbandonAll),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// For any interleaving of reads, queued commands, outcomes and abandons: every entry is
    /// settled at most once, kept commands flush in commit order within their read's batch,
    /// dropped segments never flush, and abandoned entries are never settled.
    #[test]
    fn window_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        let mut w: Window<u64> = Window::new(LIMITS);
        let mut next_entry = 0u64;
        // Slots the model believes are open, with their entry.
        let mut open: Vec<(SlotId, u64)> = Vec::new();
        let mut slot_of_entry = HashMap::new();
        let mut queued: HashMap<SlotId, Vec<Command>> = HashMap::new();
        let mut acked_in_order: Vec<SlotId> = Vec::new();
        let mut not_acked: HashSet<SlotId> = HashSet::new();
        let mut abandoned: HashSet<u64> = HashSet::new();
        let mut settled_entries: HashSet<u64> = HashSet::new();
        let mut batches: Vec<FlushBatch<u64>> = Vec::new();
        let mut seen_slots = HashSet::new();
        let mut incomplete: HashSet<SlotId> = HashSet::new();

        for op in ops {
            let op_was_abandon = matches!(op, Op::AbandonAll);
            match op {
                Op::Read(n) => {
                    let entries: Vec<u64> = (0..n as u64).map(|i| next_entry + i).collect();
                    next_entry += n as u64;
                    let read = w.open_read(entries.clone()).unwrap();
                    for (i, entry) in entries.into_iter().enumerate() {
                        let slot = read.first_slot + i as u64;
                        prop_assert!(seen_slots.insert(slot), "slot {} reused", slot);
                        open.push((slot, entry));
                        slot_of_entry.insert(entry, slot);
                    }
                }
                Op::Queue { pick, key } => {
                    if open.is_empty() { continue; }
                    let (slot, _) = open[pick % open.len()];
                    let command = incr(&format!("k{key}"));
                    let full = queued.get(&slot).map_or(0, Vec::len) >= LIMITS.max_commands_per_slot;
                    let result = w.queue(slot, command.clone());
                    if full {
                        prop_assert!(result.is_err());
                        incomplete.insert(slot);
                    } else {
                        prop_assert!(result.is_ok());
                        queued.entry(slot).or_default().push(command.unwrap());
                    }
                }
                Op::Settle { pick, outcome } => {
                    if open.is_empty() {
                        // Settling something already gone is refused.
                        if let Some(&slot) = seen_slots.iter().next() {
                            prop_assert!(w.settle(slot, Outcome::Ack, None).is_err());
                        }
                        continue;
                    }
                    let index = pick % open.len();
                    let (slot, _) = open[index];
                    let outcome = match outcome {
                        0 | 1 => Outcome::Ack,
                        2 => Outcome::Drop,
                        3 => Outcome::Retry,
                        4 => Outcome::RetryAfter(Duration::from_millis(5)),
                        _ => Outcome::DeadLetter,
                    };
                    // An ack of a slot one of whose commands was refused is refused.
                    if incomplete.contains(&slot) && outcome == Outcome::Ack {
                        prop_assert_eq!(w.settle(slot, outcome, None), Err(SlotError::IncompleteSegment(slot)));
                        continue;
                    }
                    let result = w.settle(slot, outcome, None).unwrap();
                    open.remove(index);
                    if outcome == Outcome::Ack { acked_in_order.push(slot) } else { not_acked.insert(slot); }
                    batches.extend(result);
                }
                Op::FlushSettled { pick } => {
                    let slots: Vec<SlotId> = seen_slots.iter().copied().collect();
                    if slots.is_empty() { continue; }
                    batches.extend(w.flush_settled(slots[pick % slots.len()]));
                }
                Op::AbandonAll => {
                    for (_, entry) in open.drain(..) { abandoned.insert(entry); }
                    batches.extend(w.abandon_all());
                }
            }
            prop_assert_eq!(w.outstanding(), open.len());
            // Batches carry each delivery at most once, early flushes included; the window
            // holds at least what is outstanding, and nothing once everything was abandoned.
            let carried: usize = batches.iter().map(|b| b.deliveries).sum();
            prop_assert!(carried + w.held() <= next_entry as usize);
            prop_assert!(w.held() >= w.outstanding());
            if op_was_abandon {
                prop_assert_eq!(w.held(), 0);
            }
        }

        for batch in &batches {
            for settle in &batch.settles {
                prop_assert!(settled_entries.insert(settle.entry), "entry {} settled twice", settle.entry);
                prop_assert!(!abandoned.contains(&settle.entry), "abandoned entry {} settled", settle.entry);
                prop_assert_eq!(slot_of_entry[&settle.entry], settle.slot);
            }
            // Kept segments: exactly the acked ones, in ack order, with every queued command.
            let kept: Vec<SlotId> = batch.kept.iter().map(|k| k.slot).collect();
            let expected: Vec<SlotId> = acked_in_order
                .iter()
                .copied()
                .filter(|s| batch.settles.iter().any(|x| x.slot == *s))
                .collect();
            prop_assert_eq!(&kept, &expected);
            for segment in &batch.kept {
                prop_assert!(!not_acked.contains(&segment.slot), "dropped segment {} flushed", segment.slot);
                prop_assert_eq!(batch.settles[segment.settle].slot, segment.slot);
                prop_assert_eq!(batch.settles[segment.settle].outcome, Outcome::Ack);
                let queued = queued.get(&segment.slot).cloned().unwrap_or_default();
                prop_assert_eq!(&segment.commands, &queued);
            }
        }
    }
}
