//! The requeue step on a cluster whose slot is on the move when the deliveries are answered:
//! its migration begun, its keys split between two nodes (for a moment, or past
//! `--redis-timeout`), or the slot moved for good. The step declares every key it writes, so a
//! node serving only some of them refuses it whole (`TRYAGAIN`): either it runs once where its
//! keys live, or every entry stays pending, comes back once the slot has moved, and is requeued
//! then, once.

use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar::proto::OutcomeKind::{DeadLetter, Retry};
use window_sidecar_harness::refusals::{
    DELAY, Form, SHARED_DELAYED, admin, deliveries, due_time_written, due_times_leave_once_settled,
    requeues, stream_entries_come_back_as_asked, unix_ms,
};
use window_sidecar_harness::*;

/// Where the slot of the subscription's keys stands when its deliveries are answered.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SlotMove {
    /// `MIGRATING`/`IMPORTING`, no key moved yet: the old owner still serves them all.
    Begun,
    /// The stream moved, its delay set and dead-letter stream not yet (`TRYAGAIN` for the
    /// requeue step, which declares all three), for 400 ms; then the rest moves.
    Split,
    /// Split as above for longer than `--redis-timeout`; then the rest moves.
    SplitPastTimeout,
    /// The slot moved for good: the old owner answers `MOVED`.
    Moved,
}

/// `errorstat_<code>`'s count on a node.
fn errors(port: u16, code: &str) -> u64 {
    let prefix = format!("errorstat_{code}:count=");
    resp::call_text(port, &["INFO", "errorstats"])
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|n| n.trim().parse().ok()))
        .unwrap_or(0)
}

/// An integer reply of a node, as a count.
fn count_on(port: u16, args: &[&str]) -> u64 {
    let reply = resp::call(port, args).unwrap_or_else(|e| panic!("{args:?} on {port}: {e}"));
    reply
        .as_int()
        .unwrap_or_else(|| panic!("{args:?}: {reply:?}")) as u64
}

/// The requeue step of a stream or a reliable list on a 3-primary cluster whose slot is moving
/// when the deliveries are answered retry, retry_after and dead_letter. The step declares the
/// source (a stream, or a list's processing list), the delay set and the dead letter, so a node
/// serving only some of them refuses it whole; the sidecar runs it again where the keys live.
/// Either it runs once (each entry settled with exactly one copy, delay-set member or dead
/// letter) or it is refused and every entry stays pending, comes back once the slot has moved,
/// and is requeued once then. On a stream the retries write no copy: they stay pending in the
/// group, each kept by a script of its own that declares the stream and the group's delay set,
/// and come back themselves. The delay set and the dead letter exist beforehand (a marker
/// each), so that a migration can split them from the source.
async fn requeues_while_the_slot_moves(form: Form, stage: SlotMove) {
    let cluster = RedisCluster::start(3, 0);
    let sidecar = Sidecar::start(&cluster.url(), &["--redis-timeout", "1s"]).await;
    let inspect = cluster.client().await;
    let mut client = sidecar.client().await;
    let slot = slot_of("orders");
    for key in [form.dead_letter(), &form.delayed()] {
        assert_eq!(slot_of(key), slot, "{key}");
    }
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    if let Form::Stream = form {
        let _: String = inspect
            .xadd(form.dead_letter(), false, None, "*", ("marker", "1"))
            .await
            .unwrap();
    } else {
        let _: i64 = inspect.lpush(form.dead_letter(), "marker").await.unwrap();
    }
    let _: i64 = inspect
        .zadd(form.delayed(), None, None, false, false, (9e15, "marker"))
        .await
        .unwrap();
    form.add(&inspect, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);

    let migration = tokio::task::block_in_place(|| match stage {
        SlotMove::Moved => {
            cluster.migrate_slot(slot, to);
            None
        }
        SlotMove::Begun => Some(cluster.begin_slot_migration(slot, to)),
        SlotMove::Split | SlotMove::SplitPastTimeout => {
            let migration = cluster.begin_slot_migration(slot, to);
            let port = to.to_string();
            // The source: a stream, or the list with its processing list.
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &port,
                "",
                "0",
                "10000",
                "KEYS",
                "orders",
            ];
            if let Form::ReliableList = form {
                args.push("{orders}:window:processing:c");
            }
            admin(from, &args);
            Some(migration)
        }
    });
    let tryagain_before = errors(from, "TRYAGAIN") + errors(to, "TRYAGAIN");
    let (asked, asked_ms) = (Instant::now(), unix_ms());
    sub.send(vec![], requeues(form, &read)).await;
    if stage == SlotMove::Split {
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::task::block_in_place(|| cluster.finish_slot_migration(migration.unwrap()));
    }
    let report = sub.flush().await;
    let replied_ms = unix_ms();
    eprintln!("{stage:?}: {report:?}");
    if let Some(migration) = migration.filter(|_| stage != SlotMove::Split) {
        tokio::task::block_in_place(|| cluster.finish_slot_migration(migration));
    }
    assert_eq!(cluster.primary_for_slot(slot), to);
    let tryagain = errors(from, "TRYAGAIN") + errors(to, "TRYAGAIN") - tryagain_before;
    if matches!(stage, SlotMove::Split | SlotMove::SplitPastTimeout) {
        assert!(tryagain > 0, "{stage:?}: the step met the split keys");
    }

    // What the new owner holds, with the markers: a stream keeps its entries, a list's leave
    // it when read (and wait on the processing list until settled).
    let length = if let Form::Stream = form {
        "XLEN"
    } else {
        "LLEN"
    };
    let stream = || count_on(to, &[length, "orders"]);
    let delay_set = form.delayed();
    let delayed = || count_on(to, &["ZCARD", &delay_set]);
    let dead = || count_on(to, &[length, "{orders}:dead"]);
    let held = || match form {
        Form::Stream => {
            let reply = resp::call(to, &["XPENDING", "orders", "g"]).unwrap();
            reply.items()[0].as_int().unwrap() as u64
        }
        _ => count_on(to, &["LLEN", "{orders}:window:processing:c"]),
    };
    // What the source itself holds of the three entries: all of a stream's, none of a list's.
    let kept = if let Form::Stream = form { 3 } else { 0 };
    let mut copies = 0;
    if stage == SlotMove::SplitPastTimeout {
        assert!(!report.ok, "keys split past --redis-timeout: {report:?}");
    }
    if let Form::Stream = form {
        // The retries stay pending in the group (each kept by a script that declares the
        // stream and the group's delay set), the dead letter goes through the requeue step
        // (the stream and the dead letter): each refused whole by a node serving only some of
        // its keys, or run once where they live. Nothing is appended to the stream.
        let due_set = form.delayed();
        let shared = || count_on(to, &["EXISTS", SHARED_DELAYED]);
        let taken = if report.ok {
            assert!(report.requeue_refused.is_empty(), "{stage:?}: {report:?}");
            assert_eq!((stream(), delayed(), dead()), (3, 2, 2), "{stage:?}");
            assert_eq!(held(), 2, "{stage:?}: the retries stay pending");
            let id = &read.deliveries[1].entry_id;
            due_time_written(&inspect, &due_set, id, (asked_ms, replied_ms)).await;
            [true; 3]
        } else {
            // Refused (given up on at `--redis-timeout`): nothing written, nothing settled;
            // each a refused requeue, the dead letter's step first, all TRYAGAIN.
            let split = matches!(stage, SlotMove::Split | SlotMove::SplitPastTimeout);
            assert!(split, "{stage:?}: {report:?}");
            assert!(report.settle_failed, "{stage:?}: {report:?}");
            assert_eq!(report.failed, 3, "{stage:?}: {report:?}");
            assert!(report.error.starts_with("TRYAGAIN "), "{report:?}");
            let slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
            let expected = [2, 0, 1].map(|i| read.deliveries[i].slot);
            assert_eq!(slots, expected, "{stage:?}: {report:?}");
            for refusal in &report.requeue_refused {
                assert!(refusal.error.starts_with("TRYAGAIN "), "{refusal:?}");
            }
            assert_eq!((stream(), delayed(), dead()), (3, 1, 1), "{stage:?}");
            assert_eq!(held(), 3, "{stage:?}");
            [false; 3]
        };
        assert_eq!(shared(), 0, "{stage:?}: no copy in the delay set of copies");
        // Each comes back (now from the new owner) and ends as asked, once.
        let reread = report.settle_failed;
        stream_entries_come_back_as_asked(&mut sub, &inspect, &read, (taken, reread), asked).await;
        assert_eq!((stream(), dead(), held()), (3, 2, 0), "{stage:?}");
        assert_eq!(shared(), 0, "{stage:?}");
        due_times_leave_once_settled(&inspect, &due_set, 1).await;
        sub.close();
        let _ = inspect.quit().await;
        sidecar.stop().await;
        return;
    }
    if report.ok {
        // Run once, where the keys were: each requeue written once, each entry settled.
        assert!(report.requeue_refused.is_empty(), "{stage:?}: {report:?}");
        assert_eq!((delayed(), dead()), (2, 2), "{stage:?}");
        // The copy is in the source, or read already and held.
        assert!(held() <= 1, "{stage:?}: only the copy may be held");
        let copy_in = match form {
            Form::Stream => stream(),
            _ => stream() + held(),
        };
        assert_eq!(copy_in, kept + 1, "{stage:?}");
    } else {
        // Refused (given up on at `--redis-timeout`): nothing written, nothing settled, and
        // the report names every entry with Redis's error.
        // A list's step also declares its counts hash, which no retry wrote yet: while the
        // slot migrates Redis cannot tell whether a missing key moved, and refuses the step
        // (TRYAGAIN) until the slot has.
        let split = matches!(stage, SlotMove::Split | SlotMove::SplitPastTimeout)
            || (stage == SlotMove::Begun && matches!(form, Form::ReliableList));
        assert!(split, "{stage:?}: {report:?}");
        assert!(report.settle_failed, "{stage:?}: {report:?}");
        let slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
        let expected: Vec<u64> = read.deliveries.iter().map(|d| d.slot).collect();
        assert_eq!(slots, expected, "{stage:?}: {report:?}");
        for refusal in &report.requeue_refused {
            assert!(refusal.error.starts_with("TRYAGAIN "), "{refusal:?}");
        }
        assert_eq!((stream(), delayed(), dead()), (kept, 1, 1), "{stage:?}");
        assert_eq!(held(), 3, "{stage:?}");
        // They come back, and are requeued now that the keys have settled on the new owner.
        let mut left = values.clone();
        while !left.is_empty() {
            let read = sub.read().await;
            let mut outcomes = Vec::new();
            for delivery in &read.deliveries {
                let value = value(delivery);
                if let Some(at) = left.iter().position(|v| *v == value) {
                    left.remove(at);
                    outcomes.push(match value.as_str() {
                        "a" => outcome(delivery.slot, Retry),
                        "b" => retry_after(delivery.slot, DELAY),
                        _ => outcome(delivery.slot, DeadLetter),
                    });
                } else {
                    assert_eq!(value, "a", "{stage:?}: only the retry is copied");
                    copies += 1;
                    outcomes.push(outcome(delivery.slot, proto::OutcomeKind::Ack));
                }
            }
            sub.send(vec![], outcomes).await;
            let report = sub.flush().await;
            assert!(report.ok, "{stage:?}: {report:?}");
        }
    }
    // The retry's copy comes back once and is acked.
    while copies == 0 {
        let read = sub.read().await;
        let mut acks = Vec::new();
        for delivery in &read.deliveries {
            assert_eq!(value(delivery), "a", "{stage:?}: {delivery:?}");
            copies += 1;
            acks.push(outcome(delivery.slot, proto::OutcomeKind::Ack));
        }
        sub.send(vec![], acks).await;
        assert!(sub.flush().await.ok, "{stage:?}");
    }
    assert_eq!(copies, 1, "{stage:?}");
    assert!(
        sub.message_within(Duration::from_millis(600))
            .await
            .is_none(),
        "{stage:?}: nothing more is delivered"
    );
    let copy = u64::from(kept > 0);
    assert_eq!(
        (stream(), delayed(), dead(), held()),
        (kept + copy, 2, 2, 0),
        "{stage:?}"
    );
    sub.close();
    let _ = inspect.quit().await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_while_the_slot_migrates_run_on_the_old_owner() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::Begun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_while_the_slot_migrates_run_on_the_old_owner_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::Begun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_run_once_they_moved() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::Split).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_run_once_they_moved_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::Split).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_too_long_stay_pending() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::SplitPastTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_too_long_stay_pending_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::SplitPastTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_after_the_slot_moved_run_on_the_new_owner() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::Moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_after_the_slot_moved_run_on_the_new_owner_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::Moved).await;
}
