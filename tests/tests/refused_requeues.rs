//! Redis refusing the requeue step of a flush: a retry, a delay or a dead letter whose write
//! Redis refuses (out of memory, an ACL without the write or without scripts, a key of the
//! wrong type, a script running long) never settles its entry. The flush report names the
//! entries left pending and why, the refusal counter counts them, the binary warns with what an
//! operator needs, and once Redis accepts writes again the entries come back and are requeued
//! as asked. Every form that requeues, in both modes. A stream's retries write no copy: they
//! stay pending in their group, their due time in the group's delay set; a refused one is a
//! failed command of the flush (not a refused requeue: nothing was to be written elsewhere),
//! and the entry, still pending, comes back all the same. Writes paused, a flushed script cache
//! and a refused promotion of due delays lose nothing either.

use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, DeadLetter, Retry};
use window_sidecar::proto::{self, subscribe_response::Kind};
use window_sidecar_harness::refusals::{
    DELAY, Fault, Form, SHARED_DELAYED, admin, deliveries, due_time_written,
    due_times_leave_once_settled, requeues, stream_entries_come_back_as_asked, unix_ms, zcard,
};
use window_sidecar_harness::*;

/// The report names the entries whose requeue was refused (those at `refused_at` in the
/// read), with Redis's error, and the counter counts them under the fault's reason.
async fn refused_as_reported(
    report: &proto::FlushReport,
    read: &proto::Read,
    fault: Fault,
    refused_at: &[usize],
    metrics: &str,
) {
    let (_, reason) = fault.refused();
    let refused_slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
    let expected: Vec<u64> = refused_at
        .iter()
        .map(|&i| read.deliveries[i].slot)
        .collect();
    assert_eq!(refused_slots, expected, "{report:?}");
    for refusal in &report.requeue_refused {
        assert!(fault.worded(&refusal.error), "{refusal:?}");
        // A stream's entry id; a list value has none, on either side.
        let delivery = read.deliveries.iter().find(|d| d.slot == refusal.slot);
        assert_eq!(refusal.entry_id, delivery.unwrap().entry_id);
    }
    let exposition = scrape(metrics).await;
    let counted = metric_sum(
        &exposition,
        "window_sidecar_requeue_refused_total",
        &format!("reason=\"{reason}\""),
    );
    assert_eq!(counted, refused_at.len() as f64, "{exposition}");
}

/// The whole story for one list form, mode and fault: the refused requeues leave every entry
/// held and nothing written; once Redis takes writes again the entries come back with a higher
/// count, and their requeues are written as asked.
async fn refused_requeues_stay_pending(form: Form, mode: proto::Mode, fault: Fault) {
    let redis = RedisServer::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    form.add(&inspect, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(mode))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);

    fault.apply(&inspect, redis.port(), &form).await;
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    let (refused_at, _) = fault.refused();
    fault.undo(&inspect, redis.port(), &form).await;

    // The report names the entries whose requeue was refused, with Redis's error.
    assert!(!report.ok, "{report:?}");
    if fault == Fault::Busy && report.error.starts_with("not sent") {
        // A server that answers BUSY to the client's health check too (Valkey 9.1, and Redis
        // when the check lands inside the script) has the connection dropped and the flush not
        // sent at all: refused by nobody, every entry still pending, which is what the rest
        // checks. Its settles failed if it had any: a simple list's requeue step settles
        // nothing (its entries left the list when read).
        assert!(report.requeue_refused.is_empty(), "{report:?}");
        assert_eq!(report.settle_failed, report.settles > 0, "{report:?}");
    } else {
        assert!(report.settle_failed, "{report:?}");
        refused_as_reported(&report, &read, fault, refused_at, &metrics).await;
    }

    // Only what Redis accepted was written: the refused entries have no copy, no delay-set
    // member and no dead letter, and they are still this consumer's.
    let written = |i: usize| !refused_at.contains(&i);
    let (copies, refused) = (u64::from(written(0)), refused_at.len() as u64);
    assert_eq!(form.delayed_members(&inspect).await, u64::from(written(1)));
    assert_eq!(form.dead_letters(&inspect).await, u64::from(written(2)));
    // A copy written may be read already (then it is held too).
    let held = form.held(&inspect).await;
    if !matches!(form, Form::SimpleList) {
        assert!(held == refused || held == refused + copies, "held {held}");
    }
    match form {
        Form::Stream => unreachable!("a stream's story: refused_retries_stay_pending_in_the_group"),
        Form::ReliableList => {
            assert_eq!(form.length(&inspect).await + held, refused + copies)
        }
        // Refused entries the sidecar gave back already wait in the list, or were read.
        Form::SimpleList => assert!(form.length(&inspect).await <= refused + copies),
    }

    // They come back, counted once more, and are requeued as asked now that Redis takes them.
    // The retry's copy, written then or now, comes back once and is acked.
    let mut left: Vec<String> = refused_at.iter().map(|&i| values[i].clone()).collect();
    let mut copies = 0;
    while !left.is_empty() || copies == 0 {
        let read = sub.read().await;
        let mut outcomes = Vec::new();
        for delivery in &read.deliveries {
            let value = value(delivery);
            let Some(at) = left.iter().position(|v| *v == value) else {
                assert_eq!(value, "a", "only the retry is copied: {delivery:?}");
                copies += 1;
                outcomes.push(outcome(delivery.slot, proto::OutcomeKind::Ack));
                continue;
            };
            left.remove(at);
            assert_eq!(delivery.delivery_count, 2, "{delivery:?}");
            outcomes.push(match values.iter().position(|v| *v == value) {
                Some(0) => outcome(delivery.slot, Retry),
                Some(1) => retry_after(delivery.slot, DELAY),
                _ => outcome(delivery.slot, DeadLetter),
            });
        }
        sub.send(vec![], outcomes).await;
        let report = sub.flush().await;
        assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    }
    // Each requeue written once: one copy (read and acked above), one delay-set member, one
    // dead letter; nothing else comes, and nothing is held.
    assert_eq!(copies, 1);
    assert_eq!(form.delayed_members(&inspect).await, 1);
    assert_eq!(form.dead_letters(&inspect).await, 1);
    assert!(
        sub.message_within(Duration::from_millis(600))
            .await
            .is_none(),
        "nothing more is delivered"
    );
    assert_eq!(form.held(&inspect).await, 0);
    sub.close();
    sidecar.stop().await;
}

/// The whole story for a stream, one mode and fault. A retry and a retry_after stay pending
/// in their group (`KEEP_IN_PLACE`), a dead letter goes through the requeue step: what Redis
/// refuses of them leaves that entry pending and writes nothing (the dead letter a refused
/// requeue, the others a failed command of the flush), what it takes is written as asked, and
/// nothing is appended to the stream. Once Redis takes writes again every entry comes back
/// (the same three, by id) and each ends as asked, exactly once: the retry delivered again,
/// the retry_after again when due and not before, its due time in the group's delay set, the
/// dead letter written once; nothing else delivered, nothing left pending.
async fn refused_retries_stay_pending_in_the_group(mode: proto::Mode, fault: Fault) {
    let form = Form::Stream;
    let redis = RedisServer::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    form.add(&inspect, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(mode))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);

    fault.apply(&inspect, redis.port(), &form).await;
    let (asked, asked_ms) = (Instant::now(), unix_ms());
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    let replied_ms = unix_ms();
    fault.undo(&inspect, redis.port(), &form).await;

    assert!(!report.ok, "{report:?}");
    let mut refused_at = fault.refused_on_stream();
    if fault == Fault::Busy && report.error.starts_with("not sent") {
        // A server that answers BUSY to the client's health check too (Valkey 9.1; Redis 7.0
        // now and then) has the connection dropped and the flush not sent at all: refused by
        // nobody, every entry still pending, which is what the rest checks.
        assert!(report.requeue_refused.is_empty(), "{report:?}");
        refused_at = &[0, 1, 2];
    } else {
        // One failed command per refused write, each with the fault's error, and each a
        // refused requeue: the dead letter's step comes first in the flush, then the retries
        // kept in place. Only the dead letter's refusal leaves the read's settle undone.
        assert_eq!(report.failed as usize, refused_at.len(), "{report:?}");
        assert!(fault.worded(&report.error), "{report:?}");
        let dead_letter_refused = refused_at.contains(&2);
        assert_eq!(report.settle_failed, dead_letter_refused, "{report:?}");
        let in_flush_order: Vec<usize> = [2, 0, 1]
            .into_iter()
            .filter(|i| refused_at.contains(i))
            .collect();
        refused_as_reported(&report, &read, fault, &in_flush_order, &metrics).await;
    }

    // Only what Redis accepted was written, and nothing anywhere else: no copy in the stream
    // or in the delay set of copies, a due time only for a retry_after Redis took, a dead
    // letter only if Redis took it. Every entry but a written dead letter is still pending.
    let taken = [0, 1, 2].map(|i| !refused_at.contains(&i));
    assert_eq!(form.length(&inspect).await, 3, "nothing appended");
    assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 0);
    if taken[1] {
        let id = &read.deliveries[1].entry_id;
        due_time_written(&inspect, &form.delayed(), id, (asked_ms, replied_ms)).await;
    } else {
        assert_eq!(form.delayed_members(&inspect).await, 0);
    }
    assert_eq!(form.dead_letters(&inspect).await, u64::from(taken[2]));
    assert_eq!(form.held(&inspect).await, 3 - u64::from(taken[2]));

    // Every entry comes back and ends as asked; after a settle that failed, the re-read that
    // brings them back counts a delivery of its own.
    let reread = report.settle_failed;
    stream_entries_come_back_as_asked(&mut sub, &inspect, &read, (taken, reread), asked).await;
    assert_eq!(form.length(&inspect).await, 3, "nothing appended");
    assert_eq!(form.dead_letters(&inspect).await, 1);
    assert_eq!(form.held(&inspect).await, 0);
    assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 0);
    due_times_leave_once_settled(&inspect, &form.delayed(), 0).await;
    sub.close();
    sidecar.stop().await;
}

#[tokio::test]
async fn out_of_memory_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::OutOfMemory).await;
}

#[tokio::test]
async fn out_of_memory_stream_atomic() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Atomic, Fault::OutOfMemory).await;
}

#[tokio::test]
async fn out_of_memory_reliable_list() {
    refused_requeues_stay_pending(
        Form::ReliableList,
        proto::Mode::Pipeline,
        Fault::OutOfMemory,
    )
    .await;
}

#[tokio::test]
async fn out_of_memory_reliable_list_atomic() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::OutOfMemory)
        .await;
}

#[tokio::test]
async fn no_permission_for_the_writes_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_the_writes_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_scripts_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Atomic, Fault::NoScripts).await;
}

#[tokio::test]
async fn no_permission_for_scripts_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Pipeline, Fault::NoScripts)
        .await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::DeadLetterWrongType)
        .await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_reliable_list() {
    refused_requeues_stay_pending(
        Form::ReliableList,
        proto::Mode::Atomic,
        Fault::DeadLetterWrongType,
    )
    .await;
}

/// The group's delay set (`{orders}:window:delayed:g`) holds a string.
#[tokio::test]
async fn delay_set_of_the_wrong_type_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Atomic, Fault::DelaySetWrongType).await;
}

/// Done when: while the group's delay set holds a string (the sidecar's own key, as a stray
/// `SET` leaves it), a re-read of the consumer's pending entries fails and counts nothing: the
/// subscription stays open and reads again (backing off), the entry keeps the deliveries a
/// client saw, and it comes on the same stream, counted one more, once the key is gone.
#[tokio::test]
async fn a_read_refused_by_a_delay_set_of_the_wrong_type_counts_nothing() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &[]);
    let inspect = redis.client().await;
    let mut client = connect_client(&listen).await;
    publish(&mut client, "orders", vec![vec![("order", "1".into())]]).await;
    let open = capped(3, "c");
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    assert_eq!(sub.read().await.deliveries[0].delivery_count, 1);
    drop(sub);
    let _: () = inspect
        .set("{orders}:window:delayed:g", "a string", None, None, false)
        .await
        .unwrap();
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    // Reads at about 0, 0.2, 0.6, 1.4 and 3.0 s, each refused.
    match sub.message_within(Duration::from_secs(4)).await {
        None => {}
        other => panic!("nothing comes while the reads are refused: {other:?}"),
    }
    assert_eq!(
        pending_count(&inspect, "orders", "g").await,
        1,
        "the refused reads counted no delivery"
    );
    // What an operator reads: the key to remove and what it holds.
    sidecar.wait_for(
        "the delay set {orders}:window:delayed:g holds a string, not a sorted set: delete it or rename it",
    );
    let _: () = inspect.del("{orders}:window:delayed:g").await.unwrap();
    let d = sub.read().await.deliveries.remove(0);
    assert_eq!(d.delivery_count, 2, "delivered again on the same stream");
}

#[tokio::test]
async fn delay_set_of_the_wrong_type_reliable_list() {
    refused_requeues_stay_pending(
        Form::ReliableList,
        proto::Mode::Pipeline,
        Fault::DelaySetWrongType,
    )
    .await;
}

#[tokio::test]
async fn a_long_script_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::Busy).await;
}

#[tokio::test]
async fn a_long_script_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::Busy).await;
}

#[tokio::test]
async fn out_of_memory_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Pipeline, Fault::OutOfMemory)
        .await;
}

#[tokio::test]
async fn out_of_memory_simple_list_atomic() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Atomic, Fault::OutOfMemory).await;
}

/// The give-back is refused too (no `RPUSH`) until the ACL is restored.
#[tokio::test]
async fn no_permission_for_the_writes_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Pipeline, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_scripts_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Atomic, Fault::NoScripts).await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_simple_list() {
    refused_requeues_stay_pending(
        Form::SimpleList,
        proto::Mode::Pipeline,
        Fault::DeadLetterWrongType,
    )
    .await;
}

#[tokio::test]
async fn delay_set_of_the_wrong_type_simple_list() {
    refused_requeues_stay_pending(
        Form::SimpleList,
        proto::Mode::Atomic,
        Fault::DelaySetWrongType,
    )
    .await;
}

#[tokio::test]
async fn a_long_script_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Pipeline, Fault::Busy).await;
}

/// Writes paused (`CLIENT PAUSE … WRITE`, as during a failover's hand-over): the requeue step
/// (and a stream's retries kept in place) waits for the pause to end and then runs whole;
/// nothing is refused or lost.
#[tokio::test]
async fn paused_writes_delay_the_requeues_and_lose_nothing() {
    for form in [Form::Stream, Form::ReliableList, Form::SimpleList] {
        let redis = RedisServer::start();
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let inspect = redis.client().await;
        let mut client = sidecar.client().await;
        form.add(&inspect, &["a", "b", "c"]).await;
        let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
            .await
            .unwrap();
        let read = deliveries(&mut sub, 3).await;
        admin(redis.port(), &["CLIENT", "PAUSE", "1000", "WRITE"]);
        let (asked, asked_ms) = (Instant::now(), unix_ms());
        sub.send(vec![], requeues(form, &read)).await;
        let report = sub.flush().await;
        assert!(
            report.ok && report.requeue_refused.is_empty(),
            "{form:?}: {report:?}"
        );
        if let Form::Stream = form {
            // The retries stay pending in the group, the retry_after's due time in its delay
            // set; the dead letter is written and its entry settled; nothing is appended.
            let id = &read.deliveries[1].entry_id;
            due_time_written(&inspect, &form.delayed(), id, (asked_ms, unix_ms())).await;
            assert_eq!(form.dead_letters(&inspect).await, 1);
            assert_eq!(form.held(&inspect).await, 2);
            let taken = ([true; 3], false);
            stream_entries_come_back_as_asked(&mut sub, &inspect, &read, taken, asked).await;
            assert_eq!(form.length(&inspect).await, 3, "nothing appended");
            assert_eq!(form.dead_letters(&inspect).await, 1);
            assert_eq!(form.held(&inspect).await, 0);
            sub.close();
            sidecar.stop().await;
            continue;
        }
        assert_eq!(form.delayed_members(&inspect).await, 1, "{form:?}");
        assert_eq!(form.dead_letters(&inspect).await, 1, "{form:?}");
        let copy = deliveries(&mut sub, 1).await;
        assert_eq!(value(&copy.deliveries[0]), "a", "{form:?}");
        let slot = copy.deliveries[0].slot;
        sub.send(vec![], vec![outcome(slot, proto::OutcomeKind::Ack)])
            .await;
        assert!(sub.flush().await.ok);
        assert_eq!(form.held(&inspect).await, 0, "{form:?}");
        sub.close();
        sidecar.stop().await;
    }
}

/// A script cache flushed under the sidecar (`SCRIPT FLUSH`) costs nothing: the requeue step
/// is sent with its text, and the promotion of due delays loads its script again.
#[tokio::test]
async fn a_flushed_script_cache_refuses_nothing() {
    for form in [Form::Stream, Form::ReliableList, Form::SimpleList] {
        a_flushed_script_cache_refuses_nothing_on(form).await;
    }
}

async fn a_flushed_script_cache_refuses_nothing_on(form: Form) {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    form.add(&inspect, &["a", "b"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 2).await;
    admin(redis.port(), &["SCRIPT", "FLUSH"]);
    let outcomes = vec![
        outcome(read.deliveries[0].slot, Retry),
        retry_after(read.deliveries[1].slot, Duration::from_millis(100)),
    ];
    sub.send(vec![], outcomes).await;
    let report = sub.flush().await;
    assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    let mut back: Vec<String> = Vec::new();
    while back.len() < 2 {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => {
                back.extend(read.deliveries.iter().map(value));
                let acks = read
                    .deliveries
                    .iter()
                    .map(|d| outcome(d.slot, proto::OutcomeKind::Ack))
                    .collect();
                sub.send(vec![], acks).await;
            }
            Some(Kind::Flush(report)) => assert!(report.ok, "{report:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    back.sort();
    assert_eq!(back, ["a", "b"]);
    sub.close();
    sidecar.stop().await;
}

/// A promotion of due delays that Redis refuses keeps its member. The delay set is a stream's
/// shared one of copies an earlier version wrote for retry_after (this version writes none, but
/// still promotes them after an upgrade, appending the copy to the stream as then): out of
/// memory (the script is refused whole) and an ACL without `XADD` (the copy is refused inside
/// it), each held past the member's due time; once Redis takes the write the copy comes back,
/// once, counted as the earlier version counted it.
#[tokio::test]
async fn a_refused_promotion_keeps_the_delayed_entry() {
    for (fault, undo) in [
        (
            &["CONFIG", "SET", "maxmemory", "1"][..],
            &["CONFIG", "SET", "maxmemory", "0"][..],
        ),
        (
            &["ACL", "SETUSER", "default", "-xadd"][..],
            &["ACL", "SETUSER", "default", "+@all"][..],
        ),
    ] {
        let redis = RedisServer::start();
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let inspect = redis.client().await;
        let mut client = sidecar.client().await;
        let form = Form::Stream;
        form.add(&inspect, &["a"]).await;
        let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
            .await
            .unwrap();
        let read = deliveries(&mut sub, 1).await;
        let first = &read.deliveries[0];
        sub.send(vec![], vec![outcome(first.slot, Ack)]).await;
        assert!(sub.flush().await.ok);
        // What an earlier version left of a retry_after of it after one delivery: the entry
        // settled, and its copy in the shared delay set, due in 500 ms.
        let member = window_sidecar::redis::delay::encode(
            first.entry_id.as_bytes(),
            [
                "_payload",
                "a",
                "h:x-window-attempts",
                "1",
                "h:x-window-original-id",
                &first.entry_id,
            ]
            .map(|part| bytes::Bytes::copy_from_slice(part.as_bytes())),
        );
        let due = (unix_ms() + 500) as f64;
        let _: i64 = inspect
            .zadd(SHARED_DELAYED, None, None, false, false, (due, member))
            .await
            .unwrap();
        admin(redis.port(), fault);
        // Well past the due time, with a promotion every 100 ms: still delayed.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 1, "{fault:?}");
        assert_eq!(form.length(&inspect).await, 1, "{fault:?}");
        admin(redis.port(), undo);
        let back = deliveries(&mut sub, 1).await;
        let copy = &back.deliveries[0];
        assert_eq!(value(copy), "a", "{fault:?}");
        assert_ne!(copy.entry_id, first.entry_id, "{fault:?}: a copy, as then");
        assert_eq!(copy.delivery_count, 2, "{fault:?}");
        assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 0, "{fault:?}");
        assert_eq!(form.length(&inspect).await, 2, "{fault:?}");
        sub.send(vec![], vec![outcome(copy.slot, Ack)]).await;
        assert!(sub.flush().await.ok);
        assert!(
            sub.message_within(Duration::from_millis(600))
                .await
                .is_none(),
            "{fault:?}: the copy comes once"
        );
        sub.close();
        sidecar.stop().await;
    }
}

/// The binary's warning for a refused requeue carries what an operator needs to act: the
/// subscription, the first entry left pending and Redis's error (documented fields).
// Multi-threaded: the harness waits for the binary's exit on this thread, while the dropped
// stream's connection closes on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_requeue_is_logged_with_the_subscription_the_entry_and_the_error() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = Launch::new()
        .args([
            "--redis-url",
            &redis.url(),
            "--listen",
            &listen,
            "--log-format",
            "json",
            "--shutdown-grace",
            "2s",
        ])
        .env("RUST_LOG", "info")
        .capture_stdout()
        .start();
    sidecar.wait_for("Redis answers: SERVING");
    let inspect = redis.client().await;
    let mut client = connect_client(&listen).await;
    Form::Stream.add(&inspect, &["a", "b", "c"]).await;
    let open = Form::Stream.open(proto::Mode::Pipeline);
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = deliveries(&mut sub, 3).await;
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "1"]);
    sub.send(vec![], requeues(Form::Stream, &read)).await;
    assert!(!sub.flush().await.ok);
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "0"]);
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("Redis refused to write a retry")).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["subscription"], "orders/g", "{line}");
    // All three refused: the dead letter (the third delivery) first, its step coming first in
    // the flush, then the two retries kept in place.
    assert_eq!(line["entries"], 3, "{line}");
    let dead_letter = &read.deliveries[2];
    assert_eq!(line["entry_id"], dead_letter.entry_id.as_str(), "{line}");
    assert_eq!(line["slot"], dead_letter.slot, "{line}");
    assert!(
        line["error"].as_str().unwrap().starts_with("OOM "),
        "{line}"
    );
    drop((sub, client));
    sidecar.terminate();
}

/// Done when: while Redis refuses the dead letter (its key holds a string), an entry at the
/// cap stays pending, read again after every refused flush and found past the cap each time,
/// and none of those reads, which delivered nothing, raises its count: Redis keeps the
/// deliveries a client saw. The dead letter written once Redis takes it says the same: the
/// cap.
#[tokio::test]
async fn a_refused_dead_letter_counts_no_reads_that_delivered_nothing() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let _: () = inspect
        .set("orders:dead", "a string", None, None, false)
        .await
        .unwrap();
    publish(&mut client, "orders", vec![vec![("order", "1".into())]]).await;
    let open = capped(2, "c");
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    retry_to_the_cap(&mut sub, 2).await;
    // The second retry is at the cap: a dead letter, refused. From then on each re-read finds
    // the entry past the cap and tries the dead letter again, refused again.
    let refused = refused_for(&mut sub, Duration::from_secs(3)).await;
    assert!(
        refused >= 3,
        "the dead letter was tried again and again: {refused}"
    );
    let count = pending_count(&inspect, "orders", "g").await;
    assert_eq!(
        count, 2,
        "the deliveries a client saw, however often read again past the cap"
    );
    let _: () = inspect.del("orders:dead").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead: Vec<(String, std::collections::HashMap<String, String>)> =
            inspect.xrange("orders:dead", "-", "+", None).await.unwrap();
        if !dead.is_empty() || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead.len(), 1, "dead-lettered once Redis takes it");
    assert_eq!(dead[0].1["h:x-window-deliveries"], "2");
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

/// Done when: replicas that take over an entry past the cap while Redis refuses its dead letter
/// count nothing either, though none of them was the reader that first found it past the cap:
/// each claims it once idle, finds it past the cap, is refused the dead letter, and is killed
/// before it could give anything back (a replica SIGKILLed, or fenced, in the middle of a
/// refusal). The count stays at the deliveries a client saw however many hand-overs it sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_dead_letter_is_not_counted_again_by_each_replica_that_claims_it() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let _: () = inspect
        .set("orders:dead", "a string", None, None, false)
        .await
        .unwrap();
    let open = |consumer: &str| {
        let mut open = capped(2, consumer);
        if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
            stream.min_idle = Some(duration(Duration::from_millis(300)));
        }
        open
    };
    let replica = || {
        let listen = format!("127.0.0.1:{}", free_port());
        let process =
            SidecarProcess::serve(&redis.url(), &listen, &["--reclaim-interval", "100ms"]);
        (process, listen)
    };
    let (first, listen) = replica();
    let mut client = connect_client(&listen).await;
    publish(&mut client, "orders", vec![vec![("order", "1".into())]]).await;
    let (mut sub, _) = Subscription::open(&mut client, open("pod-0"))
        .await
        .unwrap();
    retry_to_the_cap(&mut sub, 2).await;
    // Refused at the cap, then found past it on the re-read and refused again.
    refused_once(&mut sub).await;
    refused_once(&mut sub).await;
    first.kill9();
    assert_eq!(pending_count(&inspect, "orders", "g").await, 2);
    for consumer in ["pod-1", "pod-2", "pod-3"] {
        let (process, listen) = replica();
        let mut client = connect_client(&listen).await;
        let (mut sub, _) = Subscription::open(&mut client, open(consumer))
            .await
            .unwrap();
        refused_once(&mut sub).await;
        process.kill9();
        let rows: Vec<(String, String, u64, u64)> = inspect
            .xpending("orders", "g", ("-", "+", 10))
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].1, consumer, "{consumer} claimed it: {rows:?}");
        assert_eq!(
            rows[0].3, 2,
            "{consumer}'s claim of an entry past the cap counted nothing: {rows:?}"
        );
    }
}

/// Waits (bounded) for the first flush report naming a refused requeue: the dead letter of the
/// subscription's entry past the cap, refused.
async fn refused_once(sub: &mut Subscription) {
    let until = Instant::now() + Duration::from_secs(10);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match sub.message_within(left).await {
            Some(Ok(Some(proto::SubscribeResponse {
                kind: Some(Kind::Flush(report)),
            }))) if !report.requeue_refused.is_empty() => return,
            Some(Ok(Some(proto::SubscribeResponse {
                kind: Some(Kind::Flush(_)),
            }))) => {}
            Some(Ok(Some(other))) => panic!("only flush reports while refused: {other:?}"),
            other => panic!("no refused dead letter within 10 s: {other:?}"),
        }
    }
    panic!("no refused dead letter within 10 s");
}

/// A subscription of consumer `consumer` in group `g` of stream `orders`, one entry a read,
/// its deliveries capped at `max_deliveries` with the dead letter `orders:dead`.
fn capped(max_deliveries: u32, consumer: &str) -> proto::Open {
    proto::Open {
        max_deliveries,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..stream_open("orders", "g", consumer, 1)
    }
}

/// Retries the subscription's one entry as often as `cap` allows, each delivery counted one
/// more: the last retry is at the cap, a dead letter.
async fn retry_to_the_cap(sub: &mut Subscription, cap: u32) {
    for delivery in 1..=cap {
        let d = sub.read().await.deliveries.remove(0);
        assert_eq!(d.delivery_count, delivery);
        sub.send(vec![], vec![outcome(d.slot, Retry)]).await;
    }
}

/// The requeues the flush reports of `wait` say Redis refused; nothing but flush reports may
/// come meanwhile.
async fn refused_for(sub: &mut Subscription, wait: Duration) -> usize {
    let mut refused = 0;
    let until = Instant::now() + wait;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match sub.message_within(left).await {
            Some(Ok(Some(proto::SubscribeResponse {
                kind: Some(Kind::Flush(report)),
            }))) => refused += report.requeue_refused.len(),
            Some(Ok(Some(other))) => panic!("only flush reports while refused: {other:?}"),
            _ => break,
        }
    }
    refused
}

/// The delivery count of the one entry pending in `group` of `key`.
async fn pending_count(client: &Client, key: &str, group: &str) -> u64 {
    let rows: Vec<(String, String, u64, u64)> =
        client.xpending(key, group, ("-", "+", 10)).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows[0].3
}

/// Done when: the same holds for a reliable list, whose re-read of its processing list records
/// each value's delivery in the counts hash: while Redis refuses the dead letter, a value past
/// the cap is recorded once past it, whichever reader re-reads it, and its dead letter carries
/// the deliveries a client saw.
#[tokio::test]
async fn a_refused_dead_letter_counts_no_reads_that_delivered_nothing_reliable_list() {
    use window_sidecar_harness::forms::{push, reliable};
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let _: () = inspect
        .set("jobs:dead", "a string", None, None, false)
        .await
        .unwrap();
    push(&inspect, "jobs", ["poison".to_string()]).await;
    let open = proto::Open {
        max_deliveries: 2,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::List("jobs:dead".into())),
        }),
        ..reliable("jobs", "c1", 1)
    };
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    retry_to_the_cap(&mut sub, 2).await;
    let refused = refused_for(&mut sub, Duration::from_secs(3)).await;
    assert!(
        refused >= 3,
        "the dead letter was tried again and again: {refused}"
    );
    for _ in 0..3 {
        drop(sub);
        sub = Subscription::open(&mut client, open.clone())
            .await
            .unwrap()
            .0;
        let refused = refused_for(&mut sub, Duration::from_millis(700)).await;
        assert!(
            refused >= 1,
            "the new reader tried the dead letter: {refused}"
        );
    }
    let _: () = inspect.del("jobs:dead").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead: Vec<bytes::Bytes> = inspect.lrange("jobs:dead", 0, -1).await.unwrap();
        if !dead.is_empty() || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead.len(), 1, "dead-lettered once Redis takes it");
    let letter = window_sidecar::domain::frame::decode(&dead[0]).expect("a frame");
    let deliveries = letter
        .iter()
        .find(|(f, _)| f.as_ref() == b"h:x-window-deliveries")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    assert_eq!(deliveries.as_deref(), Some("2"), "{letter:?}");
    sidecar.stop().await;
}
