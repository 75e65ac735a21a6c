//! The engine against a model of Redis, the reader, the flusher and a client ([`model`]),
//! driven by random interleavings of every event for every form, with the invariants checked
//! after each step and at the end; and the rules each defect of the old subscription task
//! broke, one test each.

mod model;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::window::{Outcome, SlotError, SlotId};
use model::{COUNT, E, RENEW, World, config};

fn kinds() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Stream),
        Just(Kind::ReliableList),
        Just(Kind::SimpleList),
        Just(Kind::PubSub),
    ]
}

proptest! {
    /// Ordered subscriptions, with few keys so they collide: besides every invariant above,
    /// a key's deliveries go out one at a time and in the order read, through retries kept in
    /// place, failed and unknown flushes, lost read replies, the client leaving and shutdown.
    #[test]
    fn every_ordered_interleaving_keeps_each_keys_order(
        kind in prop_oneof![Just(Kind::Stream), Just(Kind::ReliableList)],
        entries in 1u64..20,
        steps in prop::collection::vec((any::<u8>(), any::<u8>()), 0..300),
    ) {
        let mut world = World::ordered(kind, entries);
        for (choice, pick) in steps {
            if world.done {
                break;
            }
            world.step(choice, pick);
        }
        world.check_progress();
        world.finish();
        world.check_end();
    }

    /// A partition's subscription, fenced by its lease: besides every invariant above, nothing
    /// is written once the lease may have run out, and what it held stays pending.
    #[test]
    fn every_fenced_interleaving_writes_nothing_past_the_fence(
        kind in prop_oneof![Just(Kind::Stream), Just(Kind::ReliableList)],
        ordered in any::<bool>(),
        entries in 1u64..20,
        steps in prop::collection::vec((any::<u8>(), any::<u8>()), 0..300),
    ) {
        let mut world = World::fenced(kind, entries, ordered);
        for (choice, pick) in steps {
            if world.done {
                break;
            }
            world.step(choice, pick);
        }
        world.check_progress();
        world.finish();
        world.check_end();
    }

    #[test]
    fn every_interleaving_keeps_the_invariants(
        kind in kinds(),
        entries in 1u64..20,
        steps in prop::collection::vec((any::<u8>(), any::<u8>()), 0..300),
    ) {
        let mut world = World::new(kind, entries);
        for (choice, pick) in steps {
            if world.done {
                break;
            }
            world.step(choice, pick);
        }
        world.check_progress();
        world.finish();
        world.check_end();
    }
}

/// What the flusher answers for a flush that ended with `status`.
pub(super) fn answered(status: FlushStatus) -> (PlanCounts, FlushResult) {
    let result = match status {
        FlushStatus::Ok => FlushResult::default(),
        FlushStatus::Failed { settle_failed } => FlushResult {
            failed: 1,
            settle_failed,
            ..FlushResult::default()
        },
        FlushStatus::Unknown => FlushResult {
            failed: 1,
            unknown: true,
            ..FlushResult::default()
        },
    };
    assert_eq!(result.status(), status);
    (PlanCounts::default(), result)
}

fn settle(slot: SlotId, outcome: Outcome) -> Result<SettleRequest, SlotError> {
    Ok(SettleRequest {
        slot,
        outcome,
        reason: None,
    })
}

fn entry(id: u64, count: u32) -> E {
    E {
        id,
        count,
        key: None,
    }
}

#[test]
fn a_full_window_still_renews_its_lease() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::ReliableList), start);
    assert!(matches!(engine.take_actions()[..], [Action::Read { .. }]));
    let held: Vec<E> = (1..=5).map(|id| entry(id, 1)).collect();
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(held)));
    assert!(matches!(
        engine.take_actions()[..],
        [Action::Deliver { .. }]
    ));
    assert_eq!(engine.next_deadline(), Some(start + RENEW));
    let later = start + RENEW;
    engine.tick(later);
    assert_eq!(engine.take_actions(), vec![Action::RenewLease]);
    engine.lease_renewed(later, LeaseRenewal::Held);
    assert_eq!(engine.next_deadline(), Some(later + RENEW));
}

#[test]
fn a_read_blocks_no_longer_than_the_next_recovery() {
    let start = Instant::now();
    let config = Config {
        lease_renewal: None,
        ..config(Kind::ReliableList)
    };
    let mut engine: Engine<E> = Engine::new(config, start);
    // A reliable list recovers on its first read, then every interval.
    assert_eq!(
        engine.take_actions(),
        vec![Action::Read {
            count: COUNT,
            lane: Lane::Reader {
                block: Duration::from_secs(1),
                reread: false,
                recover: true,
            },
        }]
    );
    let later = start + Duration::from_millis(400);
    engine.read_returned(later, ReadFrom::Reader, Ok(Read::new(Vec::new())));
    assert_eq!(
        engine.take_actions(),
        vec![Action::Read {
            count: COUNT,
            lane: Lane::Reader {
                block: Duration::from_millis(600),
                reread: false,
                recover: false,
            },
        }]
    );
}

#[test]
fn a_claimed_entry_past_the_cap_goes_to_the_dead_letter_unread() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    let read = Read {
        entries: vec![entry(1, 1), entry(3, 7)],
        redelivery: true,
        lost: 0,
        delayed: Vec::new(),
    };
    engine.read_returned(start, ReadFrom::Reader, Ok(read));
    let actions = engine.take_actions();
    assert!(
        matches!(&actions[0], Action::DeadLetter { entries, .. } if entries == &vec![entry(3, 7)])
    );
    assert!(
        matches!(&actions[1], Action::Deliver { entries, .. } if entries == &vec![entry(1, 1)])
    );
}

#[test]
fn what_the_last_read_takes_after_the_client_left_goes_back_uncounted() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.client_closed(start);
    assert_eq!(
        engine.take_actions(),
        vec![Action::InterruptRead, Action::EndStream(None)]
    );
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(9, 1)])));
    assert_eq!(
        engine.take_actions(),
        vec![
            Action::GiveBack {
                entries: vec![entry(9, 1)],
                seen: false
            },
            Action::Done
        ]
    );
}

/// A drained client that half-closes once its started work is settled ends the drain at once,
/// its stream ending as the drain said it would (shutdown), not as a client's own close; what it
/// never started stays pending.
#[test]
fn a_half_close_while_draining_ends_at_once_with_the_shutdown() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1)])),
    );
    engine.take_actions();
    engine.shutdown(start);
    assert!(matches!(
        engine.take_actions()[..],
        [Action::Draining { outstanding: 2, .. }, ..]
    ));
    engine.client_closed(start);
    let actions = engine.take_actions();
    assert!(
        actions.contains(&Action::EndStream(Some(Stop::Shutdown))),
        "{actions:?}"
    );
    assert_eq!(engine.view().closed.left_pending, 2);
}

#[test]
fn a_simple_list_gives_back_the_read_under_way_before_what_the_client_held() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::SimpleList), start);
    engine.take_actions();
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    engine.take_actions();
    engine.client_closed(start);
    // The close waits for the read under way, which it cuts short.
    assert_eq!(engine.take_actions(), vec![Action::InterruptRead]);
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(2, 1)])));
    let actions = engine.take_actions();
    assert_eq!(
        actions[..2],
        [
            Action::GiveBack {
                entries: vec![entry(2, 1)],
                seen: false
            },
            Action::GiveBack {
                entries: vec![entry(1, 1)],
                seen: true
            },
        ]
    );
    assert_eq!(actions[2..], [Action::EndStream(None), Action::Done]);
}

#[test]
fn a_close_without_a_read_under_way_interrupts_nothing() {
    let start = Instant::now();
    let mut engine: Engine<E> = Engine::new(config(Kind::SimpleList), start);
    engine.take_actions();
    // A failed read: the next waits for its backoff, so none is under way at the close.
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Err(ReadError::Retry { unknown: false }),
    );
    assert_eq!(engine.take_actions(), vec![]);
    engine.client_closed(start);
    assert_eq!(
        engine.take_actions(),
        vec![Action::EndStream(None), Action::Done]
    );
}

#[test]
fn a_deleted_group_ends_the_subscription_after_its_flushes() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    engine.take_actions();
    let applied = engine.apply(start, vec![], vec![settle(1, Outcome::Ack)], |_, _| None);
    assert!(applied.rejected.is_empty());
    let flush = match &engine.take_actions()[..] {
        [Action::Flush { flush, .. }] => *flush,
        other => panic!("{other:?}"),
    };
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Err(ReadError::Fatal(Stop::GroupDeleted)),
    );
    assert_eq!(engine.take_actions(), vec![]);
    engine.flushed(start, flush, answered(FlushStatus::Ok), None);
    let actions = engine.take_actions();
    assert!(
        matches!(
            &actions[..],
            [
                Action::Report(report),
                Action::EndStream(Some(Stop::GroupDeleted)),
                Action::Done
            ] if report.read_id == 1 && report.result.ok()
        ),
        "{actions:?}"
    );
}

#[test]
fn closing_counts_what_it_flushed_and_left_pending() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    // One read of three: one acked, two still out when the client goes.
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1), entry(3, 1)])),
    );
    engine.take_actions();
    engine.apply(start, vec![], vec![settle(1, Outcome::Ack)], |_, _| None);
    assert_eq!(engine.view().closed, ClosedCounts::default());
    engine.client_gone(start);
    assert_eq!(
        engine.view().closed,
        ClosedCounts {
            flushed_at_close: 1,
            left_pending: 2
        }
    );
}

#[test]
fn a_lost_lease_ends_the_subscription() {
    let start = Instant::now();
    let mut engine: Engine<E> = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.tick(start + RENEW);
    assert_eq!(engine.take_actions(), vec![Action::RenewLease]);
    engine.lease_renewed(start + RENEW, LeaseRenewal::Lost);
    assert_eq!(
        engine.take_actions(),
        vec![
            Action::InterruptRead,
            Action::EndStream(Some(Stop::LeaseLost))
        ]
    );
}

/// A partition's subscription whose renewals went unanswered past its fence (its process
/// paused, say): the ack its client sends then is not flushed, and the read that returns is not
/// given back; both stay pending for the replica that holds the name now.
#[test]
fn past_its_fence_a_subscription_flushes_nothing_it_owes() {
    let start = Instant::now();
    let fence = RENEW * 3;
    let config = Config {
        fence_after: Some(fence),
        ..config(Kind::Stream)
    };
    let mut engine = Engine::new(config, start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1)])),
    );
    let slot = match &engine.take_actions()[..] {
        [Action::Deliver { read, .. }, Action::Read { .. }] => read.first_slot,
        other => panic!("expected a delivery and the next read: {other:?}"),
    };
    // The renewal goes out, and its answer comes only after the fence.
    engine.tick(start + RENEW);
    assert_eq!(engine.take_actions(), vec![Action::RenewLease]);
    let late = start + fence;
    assert_eq!(engine.next_deadline(), Some(late));
    let applied = engine.apply(
        late,
        Vec::new(),
        vec![settle(slot, Outcome::Ack), settle(slot + 1, Outcome::Ack)],
        |_, _| None,
    );
    assert_eq!(
        applied.rejected,
        vec![
            SlotError::AlreadySettled(slot),
            SlotError::AlreadySettled(slot + 1)
        ]
    );
    assert_eq!(
        engine.take_actions(),
        vec![
            Action::InterruptRead,
            Action::EndStream(Some(Stop::LeaseLost))
        ],
        "no flush of what was settled"
    );
    engine.lease_renewed(late, LeaseRenewal::Held);
    engine.read_returned(late, ReadFrom::Reader, Ok(Read::new(vec![entry(3, 1)])));
    assert_eq!(
        engine.take_actions(),
        vec![Action::Done],
        "what the last read took stays pending, not given back"
    );
}

#[test]
fn flushes_leave_in_the_order_reads_complete() {
    let start = Instant::now();
    let mut engine = Engine::new(
        Config {
            count: 1,
            ..config(Kind::Stream)
        },
        start,
    );
    engine.take_actions();
    for id in 1..=3 {
        engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(id, 1)])));
        engine.take_actions();
    }
    let mut order = Vec::new();
    for slot in [3, 1, 2] {
        engine.apply(start, vec![], vec![settle(slot, Outcome::Ack)], |_, _| None);
        for action in engine.take_actions() {
            if let Action::Flush { batch, .. } = action {
                order.push(batch.read_id);
            }
        }
    }
    assert_eq!(order, [3, 1, 2]);
}

/// A delivery the client is still working on: a stream's entries are extended at most once per
/// `extend_every` each, a reliable list renews its lease at once, forms nothing can take from
/// do nothing, and slots that are not outstanding are refused.
#[test]
fn extending_deliveries_keeps_them_from_others_at_a_bounded_rate() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1)])),
    );
    engine.take_actions();
    assert!(engine.extend(start, &[1, 2, 1]).is_empty());
    assert_eq!(
        engine.take_actions(),
        vec![Action::Extend(vec![entry(1, 1), entry(2, 1)])]
    );
    // Again within extend_every: taken, nothing more reaches Redis.
    let soon = start + model::EXTEND_EVERY / 2;
    assert!(engine.extend(soon, &[1]).is_empty());
    assert!(
        !engine
            .take_actions()
            .iter()
            .any(|a| matches!(a, Action::Extend(_)))
    );
    let later = start + model::EXTEND_EVERY;
    engine.apply(later, vec![], vec![settle(2, Outcome::Ack)], |_, _| None);
    engine.take_actions();
    // A settled slot, and one never handed out, are refused.
    assert_eq!(
        engine.extend(later, &[1, 2, 9]),
        vec![SlotError::AlreadySettled(2), SlotError::UnknownSlot(9)]
    );
    assert_eq!(
        engine.take_actions(),
        vec![Action::Extend(vec![entry(1, 1)])]
    );

    let mut list = Engine::new(config(Kind::ReliableList), start);
    list.take_actions();
    list.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    list.take_actions();
    assert!(list.extend(start + RENEW / 3, &[1]).is_empty());
    assert_eq!(list.take_actions(), vec![Action::RenewLease]);

    let mut simple = Engine::new(config(Kind::SimpleList), start);
    simple.take_actions();
    simple.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    simple.take_actions();
    assert!(simple.extend(start, &[1]).is_empty());
    assert_eq!(simple.take_actions(), vec![]);
}

/// Under a backlog, with a window of four reads, the reader reads only until the window is
/// full: from then on every read rides on the flush of the one before, also while the client
/// settles a read before the flush of the previous one is back. One round trip per read.
#[test]
fn under_a_backlog_every_read_rides_on_a_flush() {
    let start = Instant::now();
    let config = Config {
        count: 2,
        max_in_flight: 8,
        lease_renewal: None,
        ..config(Kind::Stream)
    };
    let mut engine = Engine::new(config, start);
    let mut next_id = 0;
    let mut full_read = || {
        let entries = (0..2).map(|_| {
            next_id += 1;
            entry(next_id, 1)
        });
        Read::new(entries.collect())
    };
    let mut reader_reads = 0;
    let mut held: Vec<SlotId> = Vec::new();
    let mut riding: Vec<(FlushId, u32)> = Vec::new();
    let take = |engine: &mut Engine<E>, held: &mut Vec<SlotId>, riding: &mut Vec<_>| {
        let mut reads = 0;
        for action in engine.take_actions() {
            match action {
                Action::Read { count, .. } => {
                    assert_eq!(count, 2);
                    reads += 1;
                }
                Action::Deliver { read, entries, .. } => {
                    held.extend((0..entries.len() as u64).map(|i| read.first_slot + i));
                }
                Action::Flush {
                    flush, read_ahead, ..
                } => riding.push((flush, read_ahead.expect("a read rides on every flush"))),
                _ => {}
            }
        }
        reads
    };
    reader_reads += take(&mut engine, &mut held, &mut riding);
    // The reader fills the window: four reads, one after the other.
    for _ in 0..4 {
        engine.read_returned(start, ReadFrom::Reader, Ok(full_read()));
        reader_reads += take(&mut engine, &mut held, &mut riding);
    }
    assert_eq!((reader_reads, held.len()), (4, 8));
    for round in 0..50 {
        // The client settles two reads; then the flushes come back, each with its read.
        for _ in 0..2 {
            let read: Vec<_> = held.drain(..2).collect();
            let outcomes = read.iter().map(|&s| settle(s, Outcome::Ack)).collect();
            engine.apply(start, Vec::new(), outcomes, |_, _| None);
            reader_reads += take(&mut engine, &mut held, &mut riding);
        }
        assert_eq!(riding.len(), 2, "round {round}: both flushes carry a read");
        for (flush, count) in std::mem::take(&mut riding) {
            assert_eq!(count, 2);
            engine.flushed(
                start,
                flush,
                answered(FlushStatus::Ok),
                Some(Ok(full_read())),
            );
            reader_reads += take(&mut engine, &mut held, &mut riding);
        }
        assert_eq!(held.len(), 8, "round {round}: the window is full again");
    }
    assert_eq!(reader_reads, 4, "the reader read only to fill the window");
}

/// An ordered subscription under a backlog reads on its read lane, two reads out at once,
/// answered in the order asked; its flushes carry none (a read riding on one could pass the
/// lane's). The reader reads once, before the backlog is known.
#[test]
fn under_a_backlog_an_ordered_subscription_reads_on_its_lane() {
    let start = Instant::now();
    let config = Config {
        count: 2,
        max_in_flight: 8,
        lease_renewal: None,
        ..model::ordered_config(Kind::Stream)
    };
    let mut engine = Engine::new(config, start);
    let mut next_id = 0;
    let mut full_read = || {
        let entries = (0..2).map(|_| {
            next_id += 1;
            keyed(next_id, next_id as u8)
        });
        Read::new(entries.collect())
    };
    let (mut reader_reads, mut lane_reads) = (0, 0);
    let mut held: Vec<SlotId> = Vec::new();
    let mut lane: VecDeque<LaneReadId> = VecDeque::new();
    let mut flushes: Vec<FlushId> = Vec::new();
    let mut take = |engine: &mut Engine<E>,
                    held: &mut Vec<SlotId>,
                    lane: &mut VecDeque<LaneReadId>,
                    flushes: &mut Vec<FlushId>| {
        for action in engine.take_actions() {
            match action {
                Action::Read {
                    lane: Lane::Reader { .. },
                    ..
                } => reader_reads += 1,
                Action::Read {
                    count,
                    lane: Lane::InOrder(read),
                } => {
                    assert_eq!(count, 2);
                    lane_reads += 1;
                    lane.push_back(read);
                    assert!(lane.len() <= 2, "more than two reads out on the lane");
                }
                Action::Deliver { read, entries, .. } => {
                    held.extend((0..entries.len() as u64).map(|i| read.first_slot + i));
                }
                Action::Flush {
                    flush, read_ahead, ..
                } => {
                    assert_eq!(read_ahead, None, "a read riding on an ordered flush");
                    flushes.push(flush);
                }
                _ => {}
            }
        }
        (reader_reads, lane_reads)
    };
    take(&mut engine, &mut held, &mut lane, &mut flushes);
    engine.read_returned(start, ReadFrom::Reader, Ok(full_read()));
    take(&mut engine, &mut held, &mut lane, &mut flushes);
    assert_eq!(lane.len(), 2, "two reads out on the lane at once");
    // The window fills with the lane's reads, answered in the order asked.
    while let Some(read) = lane.pop_front() {
        engine.read_returned(start, ReadFrom::Lane(read), Ok(full_read()));
        take(&mut engine, &mut held, &mut lane, &mut flushes);
    }
    let (_, filled_by) = take(&mut engine, &mut held, &mut lane, &mut flushes);
    assert_eq!((filled_by, held.len()), (3, 8));
    for round in 0..50 {
        for _ in 0..2 {
            let read: Vec<_> = held.drain(..2).collect();
            let outcomes = read.iter().map(|&s| settle(s, Outcome::Ack)).collect();
            engine.apply(start, Vec::new(), outcomes, |_, _| None);
            take(&mut engine, &mut held, &mut lane, &mut flushes);
        }
        assert_eq!(flushes.len(), 2, "round {round}: a flush per read");
        for flush in std::mem::take(&mut flushes) {
            engine.flushed(start, flush, answered(FlushStatus::Ok), None);
            take(&mut engine, &mut held, &mut lane, &mut flushes);
        }
        assert!(!lane.is_empty(), "round {round}: the lane reads again");
        while let Some(read) = lane.pop_front() {
            engine.read_returned(start, ReadFrom::Lane(read), Ok(full_read()));
            take(&mut engine, &mut held, &mut lane, &mut flushes);
        }
        assert_eq!(held.len(), 8, "round {round}: the window is full again");
    }
    let (reader_reads, _) = take(&mut engine, &mut held, &mut lane, &mut flushes);
    assert_eq!(
        reader_reads, 1,
        "the reader read only before the backlog was known"
    );
}

/// A hot key frees the bound of waiting entries one place at a time; reads wait until a whole
/// COUNT fits rather than asking for one entry per place freed (here with nothing parked past
/// the bound: a reliable list's, or a stream's with `max_parked` 0).
#[test]
fn behind_a_hot_key_a_read_waits_for_a_whole_count_of_room() {
    let start = Instant::now();
    let config = Config {
        count: 2,
        max_in_flight: 4,
        max_parked: 0,
        ..model::ordered_config(Kind::Stream)
    };
    let mut engine = Engine::new(config, start);
    engine.take_actions();
    let reads = |actions: &[Action<E>]| -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Read { count, .. } => Some(*count),
                _ => None,
            })
            .collect()
    };
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(1, 0), keyed(2, 0)])),
    );
    let actions = engine.take_actions();
    assert_eq!(delivered(&actions), vec![1]);
    let Some(&Action::Read {
        count: 2,
        lane: Lane::InOrder(read),
    }) = actions.last()
    else {
        panic!("a read of 2 while 3 places are free: {actions:?}");
    };
    engine.read_returned(
        start,
        ReadFrom::Lane(read),
        Ok(Read::new(vec![keyed(3, 0), keyed(4, 0)])),
    );
    // Three wait: one place left, less than a read.
    assert_eq!(reads(&engine.take_actions()), Vec::<u32>::new());
    engine.apply(start, Vec::new(), vec![settle(1, Outcome::Ack)], |_, _| {
        None
    });
    let actions = engine.take_actions();
    let flushed = flushes(&actions);
    assert_eq!(flushed.len(), 1, "{actions:?}");
    engine.flushed(start, flushed[0].0, answered(FlushStatus::Ok), None);
    let actions = engine.take_actions();
    assert_eq!(delivered(&actions), vec![2]);
    assert_eq!(reads(&actions), vec![2], "two places free: one read of two");
}

fn keyed(id: u64, key: u8) -> E {
    E {
        id,
        count: 1,
        key: Some(key),
    }
}

/// The flushes among `actions`, with the ids each settles.
fn flushes(actions: &[Action<E>]) -> Vec<(FlushId, Vec<u64>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Flush { flush, batch, .. } => {
                Some((*flush, batch.settles.iter().map(|s| s.entry.id).collect()))
            }
            _ => None,
        })
        .collect()
}

/// The ids handed out among `actions`.
fn delivered(actions: &[Action<E>]) -> Vec<u64> {
    handed_out(actions).into_iter().map(|(_, id)| id).collect()
}

/// The slots handed out among `actions`, with their entries' ids.
fn handed_out(actions: &[Action<E>]) -> Vec<(SlotId, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Deliver { read, entries, .. } => Some(
                entries
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (read.first_slot + i as u64, e.id)),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Key 1's second entry waits for its first, which shares a read with key 2's slow entry:
/// the first is flushed ahead of the slow one, and the second handed out once that flush
/// succeeded, while the slow one is still out.
#[test]
fn a_slow_key_does_not_hold_back_a_key_read_beside_it() {
    let start = Instant::now();
    let mut engine = Engine::new(model::ordered_config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(1, 1), keyed(2, 2)])),
    );
    assert_eq!(delivered(&engine.take_actions()), vec![1, 2]);
    // The next read brings key 1's second entry: it waits.
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![keyed(3, 1)])));
    assert_eq!(delivered(&engine.take_actions()), Vec::<u64>::new());
    // Entry 1 acked, entry 2 (key 2) still out: entry 1 is flushed on its own.
    let applied = engine.apply(start, Vec::new(), vec![settle(1, Outcome::Ack)], |_, _| {
        None
    });
    assert!(applied.rejected.is_empty());
    let actions = engine.take_actions();
    let flushed = flushes(&actions);
    assert_eq!(flushed.len(), 1, "{actions:?}");
    assert_eq!(flushed[0].1, vec![1]);
    assert_eq!(
        delivered(&actions),
        Vec::<u64>::new(),
        "not before its flush"
    );
    engine.flushed(start, flushed[0].0, answered(FlushStatus::Ok), None);
    assert_eq!(delivered(&engine.take_actions()), vec![3]);
    // The slow entry settles later; its read's batch carries it alone.
    engine.apply(start, Vec::new(), vec![settle(2, Outcome::Ack)], |_, _| {
        None
    });
    let flushed = flushes(&engine.take_actions());
    assert_eq!(flushed.len(), 1);
    assert_eq!(flushed[0].1, vec![2]);
}

/// A retry of a keyed entry comes back before its key's next entry, counted, with no copy.
#[test]
fn a_retried_keyed_entry_comes_back_first_in_its_place() {
    let start = Instant::now();
    let mut engine = Engine::new(model::ordered_config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(1, 1), keyed(2, 1)])),
    );
    assert_eq!(delivered(&engine.take_actions()), vec![1]);
    engine.apply(
        start,
        Vec::new(),
        vec![settle(1, Outcome::Retry)],
        |_, _| None,
    );
    let actions = engine.take_actions();
    let Some(Action::Flush { flush, batch, .. }) =
        actions.iter().find(|a| matches!(a, Action::Flush { .. }))
    else {
        panic!("a flush: {actions:?}");
    };
    assert_eq!(batch.in_place, vec![0], "kept in place");
    engine.flushed(start, *flush, answered(FlushStatus::Ok), None);
    let actions = engine.take_actions();
    let again: Vec<&E> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Deliver { entries, .. } => Some(entries.iter()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        again,
        vec![&E {
            id: 1,
            count: 2,
            key: Some(1)
        }]
    );
}

/// An ordered stream's engine that parks a hot key's entries (up to 100), reading on the
/// reader (no read-ahead), its first actions taken.
fn parking_engine(count: u32, max_in_flight: u32, now: Instant) -> Engine<E> {
    let config = Config {
        count,
        max_in_flight,
        max_parked: 100,
        read_ahead: false,
        ..model::ordered_config(Kind::Stream)
    };
    let mut engine = Engine::new(config, now);
    engine.take_actions();
    engine
}

/// The COUNT of the read asked for, if one was.
fn read_asked(actions: &[Action<E>]) -> Option<u32> {
    actions.iter().find_map(|a| match a {
        Action::Read { count, .. } => Some(*count),
        _ => None,
    })
}

/// Past a fetch's worth waiting in memory (COUNT), a hot key's entries are parked by id and
/// the reads go on for the other keys. Each parked entry is fetched back by id as its lane
/// runs short, in order: a failed fetch is tried again after a backoff, and an entry gone from
/// the stream is skipped.
#[test]
fn past_a_fetchs_worth_a_hot_keys_entries_are_parked_and_the_reads_go_on() {
    let mut now = Instant::now();
    let mut engine = parking_engine(2, 4, now);
    // Ten reads, each of a hot entry (key 0, odd ids) and one of another key (even ids),
    // which the client acks at once; the hot key's first delivery stays out meanwhile.
    let mut hot_out = None;
    for n in 0..10u64 {
        let read = vec![keyed(2 * n + 1, 0), keyed(2 * n + 2, (n + 1) as u8)];
        engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(read)));
        let actions = engine.take_actions();
        assert!(
            actions.iter().any(|a| matches!(a, Action::Read { .. })),
            "read {n}: the next read goes on"
        );
        let Some(Action::Deliver { read, entries, .. }) =
            actions.iter().find(|a| matches!(a, Action::Deliver { .. }))
        else {
            panic!("read {n} delivered nothing: {actions:?}");
        };
        let mut other = None;
        for (i, e) in entries.iter().enumerate() {
            let slot = read.first_slot + i as u64;
            if e.key == Some(0) {
                hot_out = Some(slot);
            } else {
                other = Some(slot);
            }
        }
        engine.apply(
            now,
            Vec::new(),
            vec![settle(other.expect("the other key's"), Outcome::Ack)],
            |_, _| None,
        );
        // The first read's flushes once the hot key's first delivery is settled too.
        if let Some(&(flush, _)) = flushes(&engine.take_actions()).first() {
            engine.flushed(now, flush, answered(FlushStatus::Ok), None);
            engine.take_actions();
        }
    }
    assert_eq!(engine.lanes.waiting(), 2, "3 and 5 wait in memory");
    assert_eq!(engine.lanes.parked(), 7, "7 to 19 are parked");
    assert_eq!(engine.view().waiting_for_key, 9);

    // The client acks each hot delivery as it comes; entry 13 is gone from the stream.
    let mut hot = vec![1];
    let (mut out, mut flushing, mut fetching) = (hot_out, Vec::new(), None);
    let (mut failed, mut fetched) = (false, Vec::new());
    let mut actions: Vec<Action<E>> = Vec::new();
    for _ in 0..200 {
        for action in std::mem::take(&mut actions) {
            match action {
                Action::Deliver { read, entries, .. } => {
                    for (i, e) in entries.iter().enumerate() {
                        assert_eq!(e.key, Some(0));
                        assert!(out.is_none(), "two of the hot key's out at once");
                        hot.push(e.id);
                        out = Some(read.first_slot + i as u64);
                    }
                }
                Action::Flush { flush, .. } => flushing.push(flush),
                Action::Fetch { fetch, parked } => {
                    assert!(fetching.is_none(), "one fetch at a time for one lane");
                    fetching = Some((fetch, parked));
                }
                _ => {}
            }
        }
        if let Some(flush) = flushing.pop() {
            engine.flushed(now, flush, answered(FlushStatus::Ok), None);
        } else if let Some(slot) = out.take() {
            engine.apply(now, Vec::new(), vec![settle(slot, Outcome::Ack)], |_, _| {
                None
            });
        } else if let Some((fetch, parked)) = fetching.take() {
            if !failed {
                failed = true;
                engine.fetched(now, fetch, Err(ReadError::Retry { unknown: false }));
                let again = engine.take_actions();
                assert!(
                    !again.iter().any(|a| matches!(a, Action::Fetch { .. })),
                    "a failed fetch goes again after a backoff, not at once"
                );
                now += Duration::from_secs(1);
                engine.tick(now);
            } else {
                fetched.extend(parked.iter().map(|&(id, _)| id));
                let found = parked
                    .iter()
                    .map(|&(id, count)| {
                        (id != 13).then_some(E {
                            id,
                            count,
                            key: Some(0),
                        })
                    })
                    .collect();
                engine.fetched(now, fetch, Ok(found));
            }
        } else {
            break;
        }
        actions = engine.take_actions();
    }
    assert!(failed);
    assert_eq!(
        fetched,
        vec![7, 9, 11, 13, 15, 17, 19],
        "fetched once each, in order"
    );
    assert_eq!(hot, vec![1, 3, 5, 7, 9, 11, 15, 17, 19]);
    assert_eq!((engine.lanes.waiting(), engine.lanes.parked()), (0, 0));
}

/// Where many keys are busy with an entry or two waiting each, nothing parks: they wait in
/// memory and the reads stop at the bound there, rather than read on and fetch nearly every
/// entry back by a round trip of its own. As keys free, their entries go out and the reads
/// go on.
#[test]
fn keys_waiting_for_few_entries_each_stop_the_reads_at_the_bound_unparked() {
    let now = Instant::now();
    let mut engine = parking_engine(2, 4, now);
    // Keys 1 and 2 go out; two more reads bring two entries of each.
    engine.read_returned(
        now,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(1, 1), keyed(2, 2)])),
    );
    let actions = engine.take_actions();
    let out = handed_out(&actions);
    assert_eq!(delivered(&actions), vec![1, 2]);
    assert!(read_asked(&actions).is_some());
    engine.read_returned(
        now,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(3, 1), keyed(4, 2)])),
    );
    assert!(
        read_asked(&engine.take_actions()).is_some(),
        "room for more in memory"
    );
    engine.read_returned(
        now,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(5, 1), keyed(6, 2)])),
    );
    let actions = engine.take_actions();
    assert_eq!(
        read_asked(&actions),
        None,
        "the bound in memory is full: the reads stop"
    );
    assert!(!actions.iter().any(|a| matches!(a, Action::Fetch { .. })));
    assert_eq!((engine.lanes.waiting(), engine.lanes.parked()), (4, 0));

    // Both keys settle: their next entries go out, and the reads go on.
    let acks = out
        .iter()
        .map(|&(slot, _)| settle(slot, Outcome::Ack))
        .collect();
    engine.apply(now, Vec::new(), acks, |_, _| None);
    let flush = flushes(&engine.take_actions())[0].0;
    engine.flushed(now, flush, answered(FlushStatus::Ok), None);
    let actions = engine.take_actions();
    let mut next = delivered(&actions);
    next.sort_unstable();
    assert_eq!(next, vec![3, 4], "each key's next, keys in no order");
    assert!(read_asked(&actions).is_some(), "room in memory again");
    assert_eq!((engine.lanes.waiting(), engine.lanes.parked()), (2, 0));
}

/// Beside a hot key whose entries are parked, a read asks Redis for enough entries that about
/// COUNT go out; a read that brings more free entries than the window has room for hands out
/// only the room and keeps the rest waiting (each keyed one in its free lane, one without a key
/// in the loose queue), handed out as the room frees, each once.
#[test]
fn beside_a_parked_hot_key_reads_ask_for_more_and_hand_out_no_more_than_the_room() {
    let now = Instant::now();
    let mut engine = parking_engine(4, 8, now);
    let mut out = Vec::new();
    // Half of the first read is the hot key's (key 0): 3 of 4 go out, so the next asks 6.
    let first = vec![keyed(1, 0), keyed(2, 1), keyed(3, 0), keyed(4, 2)];
    engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(first)));
    let actions = engine.take_actions();
    assert_eq!(delivered(&actions), vec![1, 2, 4]);
    out.extend(handed_out(&actions));
    assert_eq!(
        read_asked(&actions),
        Some(6),
        "5 places free: 4 and the 2 held back"
    );
    let second = vec![
        keyed(5, 0),
        keyed(6, 3),
        keyed(7, 0),
        keyed(8, 4),
        keyed(9, 0),
        keyed(10, 5),
    ];
    engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(second)));
    let actions = engine.take_actions();
    assert_eq!(delivered(&actions), vec![6, 8, 10]);
    out.extend(handed_out(&actions));
    assert_eq!(
        read_asked(&actions),
        Some(6),
        "2 places free and the 4 the hot key holds back"
    );
    // The hot key went quiet: six free entries, room for two. One has no key.
    let third = vec![
        keyed(11, 6),
        entry(12, 1),
        keyed(13, 7),
        keyed(14, 8),
        keyed(15, 6),
        keyed(16, 9),
    ];
    engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(third)));
    let actions = engine.take_actions();
    assert_eq!(delivered(&actions), vec![11, 12], "no more than the room");
    out.extend(handed_out(&actions));
    assert_eq!(engine.window.outstanding(), 8);

    // The client settles whatever it holds, flushes succeed and fetches find every entry:
    // each entry is handed out once, never more than 8 at a time, each key's in order.
    let mut seen: Vec<u64> = out.iter().map(|&(_, id)| id).collect();
    let mut actions: Vec<Action<E>> = Vec::new();
    for _ in 0..100 {
        for action in std::mem::take(&mut actions) {
            match action {
                Action::Deliver { read, entries, .. } => {
                    for (i, e) in entries.iter().enumerate() {
                        seen.push(e.id);
                        out.push((read.first_slot + i as u64, e.id));
                    }
                }
                Action::Flush { flush, .. } => {
                    engine.flushed(now, flush, answered(FlushStatus::Ok), None);
                }
                Action::Fetch { fetch, parked } => {
                    let found = parked
                        .iter()
                        .map(|&(id, count)| {
                            Some(E {
                                id,
                                count,
                                key: Some(0),
                            })
                        })
                        .collect();
                    engine.fetched(now, fetch, Ok(found));
                }
                _ => {}
            }
            assert!(
                engine.window.outstanding() <= 8,
                "more than max_in_flight out"
            );
        }
        for &(slot, _) in &out {
            engine.apply(now, Vec::new(), vec![settle(slot, Outcome::Ack)], |_, _| {
                None
            });
        }
        out.clear();
        actions = engine.take_actions();
    }
    let mut all = seen.clone();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), seen.len(), "each handed out once: {seen:?}");
    assert_eq!(
        all,
        (1..=16).collect::<Vec<u64>>(),
        "every entry handed out"
    );
    let hot: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|id| [1, 3, 5, 7, 9].contains(id))
        .collect();
    assert_eq!(hot, vec![1, 3, 5, 7, 9], "the hot key's in order");
    let six: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|id| [11, 15].contains(id))
        .collect();
    assert_eq!(six, vec![11, 15], "key 6's in order");
    assert_eq!((engine.lanes.waiting(), engine.lanes.parked()), (0, 0));
}

/// Reads ask for more than COUNT only while the stream has a backlog: once a read comes back
/// short, the next asks for COUNT (within the room) again.
#[test]
fn once_the_backlog_ends_reads_ask_for_count_again() {
    let now = Instant::now();
    let mut engine = parking_engine(4, 16, now);
    // Half of a full read is the hot key's: the next asks for 6 so that about 4 go out.
    let first = vec![keyed(1, 0), keyed(2, 1), keyed(3, 0), keyed(4, 2)];
    engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(first)));
    assert_eq!(read_asked(&engine.take_actions()), Some(6));
    // It brings two: the backlog is over.
    engine.read_returned(
        now,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(5, 3), keyed(6, 4)])),
    );
    let actions = engine.take_actions();
    assert_eq!(delivered(&actions), vec![5, 6]);
    assert_eq!(
        read_asked(&actions),
        Some(4),
        "COUNT, not COUNT and the extra"
    );
}

/// The end-to-end shape of a hot key: its first delivery held all along, half the stream its,
/// reads riding on flushes. Every other key's entry is handed out.
#[test]
fn beside_a_held_hot_key_every_other_key_is_handed_out() {
    let now = Instant::now();
    let config = Config {
        count: 4,
        max_in_flight: 8,
        max_parked: 100_000,
        ..model::ordered_config(Kind::Stream)
    };
    let mut engine = Engine::new(config, now);
    let mut stream: std::collections::VecDeque<E> = (0..42u64)
        .map(|n| keyed(n + 1, if n % 2 == 0 { 0 } else { (n % 200) as u8 }))
        .collect();
    let mut take = |count: u32| -> Read<E> {
        let n = (count as usize).min(stream.len());
        Read::new(stream.drain(..n).collect())
    };
    let mut others = Vec::new();
    let mut actions = engine.take_actions();
    for _ in 0..500 {
        let mut acks = Vec::new();
        for action in std::mem::take(&mut actions) {
            match action {
                Action::Read {
                    count,
                    lane: Lane::Reader { .. },
                } => engine.read_returned(now, ReadFrom::Reader, Ok(take(count))),
                Action::Read {
                    count,
                    lane: Lane::InOrder(read),
                } => engine.read_returned(now, ReadFrom::Lane(read), Ok(take(count))),
                Action::Flush {
                    flush, read_ahead, ..
                } => {
                    let read = read_ahead.map(|count| Ok(take(count)));
                    engine.flushed(now, flush, answered(FlushStatus::Ok), read);
                }
                Action::Deliver { read, entries, .. } => {
                    for (i, e) in entries.iter().enumerate() {
                        if e.key != Some(0) {
                            others.push(e.id);
                            acks.push(settle(read.first_slot + i as u64, Outcome::Ack));
                        }
                    }
                }
                _ => {}
            }
        }
        if !acks.is_empty() {
            engine.apply(now, Vec::new(), acks, |_, _| None);
        }
        actions = engine.take_actions();
        if actions.is_empty() {
            break;
        }
    }
    assert_eq!(others.len(), 21, "{others:?}, {:?}", engine.view());
}

/// The first flush among `actions`: its id and the indexes of the settles it keeps in place.
fn first_flush(actions: &[Action<E>]) -> (FlushId, Vec<usize>) {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Flush { flush, batch, .. } => Some((*flush, batch.in_place.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a flush: {actions:?}"))
}

/// The count of due retries asked among `actions`, with its entries.
fn count_asked(actions: &[Action<E>]) -> Option<(FetchId, Vec<E>)> {
    actions.iter().find_map(|a| match a {
        Action::Count { count, entries } => Some((*count, entries.clone())),
        _ => None,
    })
}

/// The entries handed out among `actions`.
fn delivered_entries(actions: &[Action<E>]) -> Vec<E> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Deliver { entries, .. } => Some(entries.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// On an unordered stream a retry stays pending in its group (a copy appended to the stream
/// would reach every other group): kept in place, and handed out again, counted once more,
/// before anything read after it.
#[test]
fn an_unordered_streams_retry_is_kept_in_place_and_comes_first_again() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1)])),
    );
    assert_eq!(delivered(&engine.take_actions()), vec![1, 2]);
    let outcomes = vec![settle(1, Outcome::Retry), settle(2, Outcome::Ack)];
    engine.apply(start, Vec::new(), outcomes, |_, _| None);
    let (flush, in_place) = first_flush(&engine.take_actions());
    assert_eq!(
        in_place,
        vec![0],
        "the retry kept in place, the ack settled"
    );
    engine.flushed(start, flush, answered(FlushStatus::Ok), None);
    let actions = engine.take_actions();
    assert_eq!(
        delivered_entries(&actions),
        vec![entry(1, 2)],
        "{actions:?}"
    );
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Deliver {
                redelivery: true,
                ..
            }
        )),
        "handed out as a redelivery: {actions:?}"
    );
}

/// A flush whose settle Redis refused leaves its entries pending, to be read again: not at
/// once, but after a wait that grows with each refusal in a row (as after failed reads), and
/// that a flush Redis takes starts over.
#[test]
fn reads_after_refused_settles_wait_longer_each_time() {
    // Entry `id` read, settled with `outcome`, its flush answered `status`; the read under
    // way meanwhile comes back empty. How long until the next read is asked.
    fn round(
        engine: &mut Engine<E>,
        now: Instant,
        (id, outcome, status): (u64, Outcome, FlushStatus),
    ) -> Duration {
        engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(vec![entry(id, 1)])));
        let slot = handed_out(&engine.take_actions())[0].0;
        engine.apply(now, Vec::new(), vec![settle(slot, outcome)], |_, _| None);
        let (flush, _) = first_flush(&engine.take_actions());
        engine.flushed(now, flush, answered(status), None);
        engine.read_returned(now, ReadFrom::Reader, Ok(Read::new(Vec::new())));
        let mut at = now;
        let mut actions = engine.take_actions();
        // Through the other timers (the lease's renewals) until the read goes.
        while read_asked(&actions).is_none() {
            at = engine.next_deadline().expect("a read is due later");
            engine.tick(at);
            actions = engine.take_actions();
        }
        at - now
    }
    let refused = FlushStatus::Failed {
        settle_failed: true,
    };
    let mut now = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), now);
    engine.take_actions();
    let mut waits = Vec::new();
    for id in 1..=3 {
        let wait = round(&mut engine, now, (id, Outcome::Retry, refused));
        waits.push(wait);
        now += wait;
    }
    assert!(
        waits[0] > Duration::ZERO && waits.windows(2).all(|w| w[0] < w[1]),
        "each refusal in a row waits longer: {waits:?}"
    );
    let wait = round(&mut engine, now, (9, Outcome::Ack, FlushStatus::Ok));
    assert_eq!(wait, Duration::ZERO, "a flush Redis takes: read on at once");
    let wait = round(&mut engine, now, (10, Outcome::Retry, refused));
    assert_eq!(wait, waits[0], "and the waits start over");
}

/// Past the cap a retry is no longer kept in place: it goes to the dead letter.
#[test]
fn an_unordered_streams_retry_at_the_cap_is_not_kept_in_place() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    let capped = entry(1, model::CAP);
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![capped])));
    engine.take_actions();
    engine.apply(
        start,
        Vec::new(),
        vec![settle(1, Outcome::Retry)],
        |_, _| None,
    );
    let (_, in_place) = first_flush(&engine.take_actions());
    assert!(in_place.is_empty());
}

/// A retry_after kept in place waits in memory until it is due, made idle again meanwhile so
/// that no other consumer reclaims it, uncounted; then its delivery is counted in Redis, and
/// it is handed out once that count is back, not before.
#[test]
fn an_unordered_streams_retry_after_waits_until_due() {
    let start = Instant::now();
    let delay = Duration::from_secs(5);
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    engine.take_actions();
    let outcomes = vec![settle(1, Outcome::RetryAfter(delay))];
    engine.apply(start, Vec::new(), outcomes, |_, _| None);
    let (flush, in_place) = first_flush(&engine.take_actions());
    assert_eq!(in_place, vec![0]);
    engine.flushed(start, flush, answered(FlushStatus::Ok), None);
    assert!(
        delivered(&engine.take_actions()).is_empty(),
        "not before due"
    );
    assert_eq!(engine.view().waiting_for_key, 1);
    let early = start + delay - Duration::from_millis(1);
    engine.tick(early);
    assert!(
        delivered(&engine.take_actions()).is_empty(),
        "not before due"
    );
    assert!(engine.next_deadline().is_some_and(|at| at <= start + delay));
    let due = start + delay;
    engine.tick(due);
    let actions = engine.take_actions();
    assert!(delivered(&actions).is_empty(), "not before it is counted");
    let (count, entries) = count_asked(&actions).expect("its count asked");
    assert_eq!(entries, vec![entry(1, 1)]);
    assert_eq!(engine.next_deadline(), None, "nothing to wake up for");
    engine.counted(due, count, Ok(vec![Some(entry(1, 2))]));
    assert_eq!(delivered_entries(&engine.take_actions()), vec![entry(1, 2)]);
}

/// A count that fails asks again after a backoff; an entry the count finds no longer this
/// consumer's (settled, or claimed by another) is forgotten; one counted past the cap goes to
/// the dead letter instead of the client.
#[test]
fn a_due_retry_is_counted_again_forgotten_or_dead_lettered() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    let read = vec![entry(1, 1), entry(2, 1), entry(3, 2)];
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(read)));
    engine.take_actions();
    let delay = Duration::from_millis(100);
    let outcomes = (1..=3)
        .map(|id| settle(id, Outcome::RetryAfter(delay)))
        .collect();
    engine.apply(start, Vec::new(), outcomes, |_, _| None);
    let (flush, _) = first_flush(&engine.take_actions());
    engine.flushed(start, flush, answered(FlushStatus::Ok), None);
    engine.take_actions();
    let due = start + delay;
    engine.tick(due);
    let (count, entries) = count_asked(&engine.take_actions()).expect("a count");
    assert_eq!(entries.len(), 3);
    engine.counted(due, count, Err(ReadError::Retry { unknown: false }));
    let actions = engine.take_actions();
    assert!(count_asked(&actions).is_none() && delivered(&actions).is_empty());
    let again = engine.next_deadline().expect("a retry of the count");
    assert!(again > due);
    engine.tick(again);
    let (count, entries) = count_asked(&engine.take_actions()).expect("asked again");
    assert_eq!(entries.len(), 3);
    let cap = config(Kind::Stream).max_deliveries;
    let found = vec![Some(entry(1, 2)), None, Some(entry(3, cap + 1))];
    engine.counted(again, count, Ok(found));
    let actions = engine.take_actions();
    assert_eq!(delivered_entries(&actions), vec![entry(1, 2)]);
    assert!(
        actions.iter().any(
            |a| matches!(a, Action::DeadLetter { entries, .. } if entries == &vec![entry(3, cap + 1)])
        ),
        "{actions:?}"
    );
    assert_eq!(engine.view().waiting_for_key, 0, "entry 2 forgotten");
}

/// A re-read or a reclaim that returns an entry whose retry_after is not due holds it until
/// then; one the window holds already goes back uncounted.
#[test]
fn a_redelivered_entry_not_yet_due_is_held_until_due() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    let wait = Duration::from_secs(3);
    let read = Read {
        entries: vec![entry(1, 2)],
        redelivery: true,
        lost: 0,
        delayed: vec![(entry(2, 2), wait)],
    };
    engine.read_returned(start, ReadFrom::Reader, Ok(read));
    assert_eq!(delivered(&engine.take_actions()), vec![1]);
    engine.tick(start + wait / 2);
    assert!(delivered(&engine.take_actions()).is_empty());
    engine.tick(start + wait);
    let (count, entries) = count_asked(&engine.take_actions()).expect("its count asked");
    assert_eq!(entries, vec![entry(2, 2)]);
    engine.counted(start + wait, count, Ok(vec![Some(entry(2, 3))]));
    assert_eq!(delivered_entries(&engine.take_actions()), vec![entry(2, 3)]);
    // Out already: a later re-read that returns it again gives it back as it is (the read's
    // count of it was taken back with the read: taken back again, it would run behind).
    let read = Read {
        entries: Vec::new(),
        redelivery: true,
        lost: 0,
        delayed: vec![(entry(2, 4), wait)],
    };
    engine.read_returned(start + wait, ReadFrom::Reader, Ok(read));
    let actions = engine.take_actions();
    assert!(
        actions.iter().any(
            |a| matches!(a, Action::GiveBack { entries, seen: true } if entries == &vec![entry(2, 4)])
        ),
        "{actions:?}"
    );
}

/// A retry the flush could not keep in place because another consumer holds the entry now is
/// theirs: not delivered again here.
#[test]
fn a_retry_left_to_another_consumer_is_not_delivered_again() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1)])),
    );
    engine.take_actions();
    let outcomes = vec![settle(1, Outcome::Retry), settle(2, Outcome::Retry)];
    engine.apply(start, Vec::new(), outcomes, |_, _| None);
    let (flush, in_place) = first_flush(&engine.take_actions());
    assert_eq!(in_place, vec![0, 1]);
    engine.left_to_others(flush, &[1]);
    engine.flushed(start, flush, answered(FlushStatus::Ok), None);
    assert_eq!(delivered_entries(&engine.take_actions()), vec![entry(2, 2)]);
}

/// At close a retry_after still waiting uncounted stays as it is (whoever reads it next
/// counts that delivery, once), where a counted one waiting goes back uncounted.
#[test]
fn a_waiting_retry_after_goes_back_as_it_is_at_close() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    engine.take_actions();
    let outcomes = vec![settle(1, Outcome::RetryAfter(Duration::from_secs(60)))];
    engine.apply(start, Vec::new(), outcomes, |_, _| None);
    let (flush, _) = first_flush(&engine.take_actions());
    engine.flushed(start, flush, answered(FlushStatus::Ok), None);
    engine.take_actions();
    engine.client_gone(start);
    let actions = engine.take_actions();
    assert!(
        actions.iter().any(
            |a| matches!(a, Action::GiveBack { entries, seen: true } if entries == &vec![entry(1, 1)])
        ),
        "{actions:?}"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::GiveBack { seen: false, .. })),
        "nothing to take back: {actions:?}"
    );
}

/// A retry that falls due while a blocking read of new entries holds the room it needs cuts
/// that read short, once: on a quiet stream it would otherwise wait for all of its BLOCK.
#[test]
fn a_due_retry_cuts_a_blocking_read_short() {
    let start = Instant::now();
    let delay = Duration::from_secs(1);
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(1, 1), entry(2, 1), entry(3, 1)])),
    );
    engine.take_actions();
    // The window's other two places: the reader reads them.
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![entry(4, 1), entry(5, 1)])),
    );
    engine.take_actions();
    engine.apply(
        start,
        Vec::new(),
        vec![
            settle(1, Outcome::RetryAfter(delay)),
            settle(2, Outcome::Ack),
            settle(3, Outcome::Ack),
        ],
        |_, _| None,
    );
    let actions = engine.take_actions();
    let Some((flush, read_ahead)) = actions.iter().find_map(|a| match a {
        Action::Flush {
            flush, read_ahead, ..
        } => Some((*flush, read_ahead.is_some())),
        _ => None,
    }) else {
        panic!("a flush: {actions:?}");
    };
    // Nothing new in the stream: the reader blocks for new entries in the room left.
    let nothing = read_ahead.then(|| Ok(Read::new(Vec::new())));
    engine.flushed(start, flush, answered(FlushStatus::Ok), nothing);
    let actions = engine.take_actions();
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Read {
                lane: Lane::Reader {
                    reread: false,
                    recover: false,
                    ..
                },
                ..
            }
        )),
        "{actions:?}"
    );
    let interrupts = |actions: &[Action<E>]| {
        actions
            .iter()
            .filter(|a| matches!(a, Action::InterruptRead))
            .count()
    };
    let due = start + delay;
    engine.tick(due);
    let actions = engine.take_actions();
    assert_eq!(interrupts(&actions), 0, "not before it is counted");
    let (count, _) = count_asked(&actions).expect("its count asked");
    engine.counted(due, count, Ok(vec![Some(entry(1, 2))]));
    assert_eq!(interrupts(&engine.take_actions()), 1);
    engine.tick(due + Duration::from_millis(10));
    assert_eq!(interrupts(&engine.take_actions()), 0, "once per read");
    // The read comes back empty, cut short: the retry goes out.
    engine.read_returned(due, ReadFrom::Reader, Ok(Read::new(Vec::new())));
    assert_eq!(delivered_entries(&engine.take_actions()), vec![entry(1, 2)]);
}

/// A retry Redis refused to keep in place is pending with its count as its delivery left it:
/// not handed out from memory (counted one ahead of Redis), but read again.
#[test]
fn a_retry_redis_refused_to_keep_is_read_again() {
    let start = Instant::now();
    let mut engine = Engine::new(config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(vec![entry(1, 1)])));
    engine.take_actions();
    engine.apply(
        start,
        Vec::new(),
        vec![settle(1, Outcome::Retry)],
        |_, _| None,
    );
    let (flush, _) = first_flush(&engine.take_actions());
    engine.not_kept(flush, &[1]);
    let failed = FlushStatus::Failed {
        settle_failed: false,
    };
    engine.flushed(start, flush, answered(failed), None);
    let actions = engine.take_actions();
    assert!(delivered(&actions).is_empty(), "{actions:?}");
    // The reader is busy with its read of new entries; once it answers, the re-read goes.
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(Vec::new())));
    let actions = engine.take_actions();
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Read {
                lane: Lane::Reader { reread: true, .. },
                ..
            }
        )),
        "{actions:?}"
    );
}

/// On an ordered stream a retry Redis refused to keep in place holds its key, as a failed
/// flush does: the key's next entry waits until the re-read has brought the retried one back.
#[test]
fn a_retry_redis_refused_to_keep_holds_its_key_until_the_reread() {
    let start = Instant::now();
    let mut engine = Engine::new(model::ordered_config(Kind::Stream), start);
    engine.take_actions();
    engine.read_returned(
        start,
        ReadFrom::Reader,
        Ok(Read::new(vec![keyed(1, 1), keyed(2, 1)])),
    );
    assert_eq!(delivered(&engine.take_actions()), vec![1]);
    engine.apply(
        start,
        Vec::new(),
        vec![settle(1, Outcome::Retry)],
        |_, _| None,
    );
    let (flush, in_place) = first_flush(&engine.take_actions());
    assert_eq!(in_place, vec![0]);
    engine.not_kept(flush, &[1]);
    let failed = FlushStatus::Failed {
        settle_failed: false,
    };
    engine.flushed(start, flush, answered(failed), None);
    let actions = engine.take_actions();
    assert!(delivered(&actions).is_empty(), "2 overtook 1: {actions:?}");
    // The read under way answers (nothing new); the re-read goes next.
    engine.read_returned(start, ReadFrom::Reader, Ok(Read::new(Vec::new())));
    let actions = engine.take_actions();
    assert!(delivered(&actions).is_empty(), "2 overtook 1: {actions:?}");
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Read {
                lane: Lane::Reader { reread: true, .. },
                ..
            }
        )),
        "{actions:?}"
    );
    // The re-read brings 1 back, counted by that read: 1 goes out, 2 still waits.
    let again = E {
        id: 1,
        count: 2,
        key: Some(1),
    };
    let read = Read {
        entries: vec![again.clone()],
        redelivery: true,
        lost: 0,
        delayed: Vec::new(),
    };
    engine.read_returned(start, ReadFrom::Reader, Ok(read));
    assert_eq!(delivered_entries(&engine.take_actions()), vec![again]);
}
