use std::time::Duration;

use bytes::Bytes;
use fred::prelude::Value;
use fred::types::Resp3Frame;

use super::read::{counted, read_ahead_batch};
use super::*;
use crate::domain::{Entry, Mode, StreamSource};
use crate::redis::flush::{FlushPlan, PlanContext, Role, plan_flush};
use crate::window::{Command, FlushBatch, Limits, Outcome, Window};

fn plan(keys: &StreamKeys, batch: &FlushBatch<Entry>, mode: Mode, now_ms: u64) -> FlushPlan {
    let ctx = PlanContext {
        mode,
        now_ms,
        max_deliveries: 3,
    };
    plan_flush(keys, &mut batch.clone(), &ctx)
}

fn keys() -> StreamKeys {
    StreamKeys::new(&StreamSource {
        key: "orders".into(),
        group: "g".into(),
        consumer: "c".into(),
        start_id: "0".into(),
        min_idle: Duration::from_secs(60),
    })
}

fn entry(id: &str) -> Entry {
    Entry {
        id: Bytes::copy_from_slice(id.as_bytes()),
        fields: vec![(Bytes::from_static(b"f"), Bytes::from_static(b"v"))],
        delivery_count: 1,
        ..Default::default()
    }
}

fn incr(key: &str) -> Result<Command, crate::window::CommandError> {
    Command::new("INCR", vec![Bytes::copy_from_slice(key.as_bytes())])
}

/// The seed's diagram: 1-0 and 3-0 acked, 2-0 dropped.
fn diagram() -> FlushBatch<Entry> {
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w
        .open_read(vec![entry("1-0"), entry("2-0"), entry("3-0")])
        .unwrap();
    let s = read.first_slot;
    for i in 0..3 {
        w.queue(s + i, incr(&format!("k{}", i + 1))).unwrap();
    }
    w.settle(s, Outcome::Ack, None).unwrap();
    w.settle(s + 1, Outcome::Drop, None).unwrap();
    w.settle(s + 2, Outcome::Ack, None).unwrap().unwrap()
}

#[test]
fn a_read_ahead_reads_new_entries_without_block_on_the_stream_slot() {
    let keys = keys();
    let read = read_ahead(&keys, 64);
    assert_eq!(read.role, Role::ReadAhead);
    assert_eq!(read.hash_slot, Some(keys.slot));
    let plan = FlushPlan {
        commands: vec![read],
        ..Default::default()
    };
    assert_eq!(
        plan.render(),
        ["XREADGROUP GROUP g c COUNT 64 STREAMS orders >"]
    );
}

#[test]
fn a_read_ahead_reply_is_a_read_of_first_deliveries() {
    let b = |s: &str| Resp3Frame::BlobString {
        data: Bytes::copy_from_slice(s.as_bytes()),
        attributes: None,
    };
    let array = |data| Resp3Frame::Array {
        data,
        attributes: None,
    };
    let entry = |id: &str, fields: Vec<Resp3Frame>| array(vec![b(id), array(fields)]);
    let reply = array(vec![array(vec![
        b("orders"),
        array(vec![
            entry("1-0", vec![b("_payload"), b("{}")]),
            // A retry copy carries its earlier attempts.
            entry(
                "2-0",
                vec![b("_payload"), b("{}"), b("h:x-window-attempts"), b("2")],
            ),
        ]),
    ])]);
    let batch = read_ahead_batch(reply).unwrap();
    let ids: Vec<_> = batch.entries.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        ids,
        [Bytes::from_static(b"1-0"), Bytes::from_static(b"2-0")]
    );
    let counts: Vec<_> = batch.entries.iter().map(|e| e.delivery_count).collect();
    assert_eq!(counts, [1, 3]);
    assert!(!batch.redelivery);
    assert_eq!(batch.reads, 0, "it made no round trip of its own");
    // Nothing new: nil.
    assert!(
        read_ahead_batch(Resp3Frame::Null)
            .unwrap()
            .entries
            .is_empty()
    );
}

#[test]
fn under_retention_with_xackdel_the_settle_deletes_what_every_group_acked() {
    let keys = StreamKeys {
        ack_delete: true,
        ..keys()
    };
    let plan = plan(&keys, &diagram(), Mode::Pipeline, 0);
    assert_eq!(
        plan.render(),
        vec![
            "INCR k1",
            "INCR k3",
            "XACKDEL orders g ACKED IDS 3 1-0 2-0 3-0"
        ]
    );
    assert_eq!(plan.settles, 3);

    // A dead letter's step settles with XACKDEL too.
    let keys = StreamKeys {
        dead_letter: Some(Bytes::from_static(b"orders:dead")),
        ..keys
    };
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w.open_read(vec![entry("1-0")]).unwrap();
    let batch = w
        .settle(read.first_slot, Outcome::DeadLetter, None)
        .unwrap()
        .unwrap();
    let dead = self::plan(&keys, &batch, Mode::Pipeline, 0);
    assert_eq!(dead.render()[0], "OWNED orders orders:dead | g c XACKDEL");
}

#[test]
fn pipeline_mode_is_the_kept_segments_then_one_xack() {
    let plan = plan(&keys(), &diagram(), Mode::Pipeline, 0);
    assert_eq!(
        plan.render(),
        vec!["INCR k1", "INCR k3", "XACK orders g 1-0 2-0 3-0"]
    );
    assert_eq!(plan.side_effects, 2);
    assert_eq!(plan.settles, 3);
}

#[test]
fn atomic_mode_wraps_each_kept_segment_with_its_own_settle() {
    let plan = plan(&keys(), &diagram(), Mode::Atomic, 0);
    assert_eq!(
        plan.render(),
        vec![
            "SEGMENT orders | INCR k1 | XACK orders g 1-0",
            "SEGMENT orders | INCR k3 | XACK orders g 3-0",
            "XACK orders g 2-0",
        ]
    );
}

/// On a cluster the commands carry their keys (admitted in atomic mode): the call declares
/// them after the settle key, each once, so a migrating slot refuses it whole.
#[test]
fn atomic_mode_on_a_cluster_declares_every_key_of_its_segments() {
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w.open_read(vec![entry("1-0"), entry("2-0")]).unwrap();
    let s = read.first_slot;
    let keyed = |key: &str| {
        let mut command = incr(key).unwrap();
        command.keys = vec![Bytes::copy_from_slice(key.as_bytes())];
        command
    };
    w.queue(s, Ok(keyed("{orders}:a"))).unwrap();
    w.queue(s, Ok(keyed("{orders}:b"))).unwrap();
    w.queue(s + 1, Ok(keyed("{orders}:a"))).unwrap();
    w.settle(s, Outcome::Ack, None).unwrap();
    let batch = w.settle(s + 1, Outcome::Ack, None).unwrap().unwrap();
    let plan = plan(&keys(), &batch, Mode::Atomic, 0);
    assert_eq!(
        plan.render(),
        vec![
            "SEGMENT orders {orders}:a {orders}:b | INCR {orders}:a; INCR {orders}:b | XACK orders g 1-0",
            "SEGMENT orders {orders}:a {orders}:b | INCR {orders}:a | XACK orders g 2-0",
        ]
    );
}

/// The requeue step is the stream's script, run on the stream's node.
fn assert_owned_step(planned: &crate::redis::flush::Planned) {
    assert_eq!(planned.args[0], settle::SETTLE_OWNED.as_bytes());
    assert_eq!(planned.hash_slot, Some(keys().slot));
}

#[test]
fn at_the_delivery_cap_a_retry_becomes_a_dead_letter_with_the_settle() {
    let mut keys = keys();
    keys.dead_letter = Some(Bytes::from_static(b"orders:dead"));
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let tired = Entry {
        delivery_count: 3,
        ..entry("1-0")
    };
    let read = w.open_read(vec![tired, entry("2-0")]).unwrap();
    w.settle(read.first_slot, Outcome::Retry, Some("boom".into()))
        .unwrap();
    let mut batch = w
        .settle(read.first_slot + 1, Outcome::Retry, None)
        .unwrap()
        .unwrap();
    // The engine keeps the retry below the cap in place, not the one at it.
    batch.in_place = vec![1];
    let plan = plan(&keys, &batch, Mode::Pipeline, 0);
    assert_eq!(plan.dead_lettered, 1);
    assert_eq!(plan.commands.len(), 2);
    assert_owned_step(&plan.commands[0]);
    let rendered = plan.render();
    assert_eq!(rendered[0], "OWNED orders orders:dead | g c XACK");
    assert_eq!(
        rendered[1],
        "1-0 d: XADD orders:dead * f v h:x-window-original-id 1-0 h:x-window-subscription orders/g h:x-window-deliveries 3 h:x-ruststream-retry-count 3 h:x-window-reason boom"
    );
    let script = format!("EVAL {} 2", settle::KEEP_IN_PLACE);
    assert_eq!(
        rendered[2],
        format!("{script} orders {{orders}}:window:delayed:g g c 2-0 2")
    );
    assert_eq!(rendered.len(), 3);
}

#[test]
fn a_dead_letter_outcome_writes_the_dead_letter_with_the_settle_below_the_cap() {
    let mut keys = keys();
    keys.dead_letter = Some(Bytes::from_static(b"orders:dead"));
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w.open_read(vec![entry("1-0"), entry("2-0")]).unwrap();
    w.queue(read.first_slot, incr("k1")).unwrap();
    w.settle(read.first_slot, Outcome::DeadLetter, Some("bad".into()))
        .unwrap();
    let batch = w
        .settle(read.first_slot + 1, Outcome::Ack, None)
        .unwrap()
        .unwrap();
    let plan = plan(&keys, &batch, Mode::Pipeline, 0);
    assert_eq!(plan.dead_lettered, 1);
    assert_eq!(plan.commands.len(), 1);
    assert_owned_step(&plan.commands[0]);
    assert_eq!(
        plan.render(),
        [
            "OWNED orders orders:dead | g c XACK",
            "1-0 d: XADD orders:dead * f v h:x-window-original-id 1-0 h:x-window-subscription orders/g h:x-window-deliveries 1 h:x-ruststream-retry-count 1 h:x-window-reason bad",
            "2-0",
        ]
    );
}

#[test]
fn a_redelivered_entry_settled_before_its_count_was_looked_up_is_not_delivered_again() {
    let entry = |id: &'static str| Entry {
        id: Bytes::from_static(id.as_bytes()),
        ..Entry::default()
    };
    let entries = vec![entry("1-0"), entry("2-0"), entry("3-0"), entry("4-0")];
    let pair = |count, wait| Value::Array(vec![Value::Integer(count), Value::Integer(wait)]);
    let counts = vec![pair(3, 0), Value::Null, pair(0, 0), pair(2, 1_500)];
    let (kept, delayed) = counted(entries, counts);
    let ids: Vec<_> = kept.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, [Bytes::from_static(b"1-0")]);
    assert_eq!(kept[0].delivery_count, 3);
    // Pending, its retry_after due in 1.5 s: held until then.
    assert_eq!(delayed.len(), 1);
    assert_eq!(delayed[0].0.id, Bytes::from_static(b"4-0"));
    assert_eq!(delayed[0].0.delivery_count, 2);
    assert_eq!(delayed[0].1, Duration::from_millis(1_500));
}

#[test]
fn a_retry_kept_in_place_is_neither_copied_nor_acked_but_counted() {
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w
        .open_read(vec![entry("1-0"), entry("2-0"), entry("3-0")])
        .unwrap();
    let s = read.first_slot;
    w.queue(s, incr("k1")).unwrap();
    w.settle(s, Outcome::Ack, None).unwrap();
    w.settle(s + 1, Outcome::Retry, None).unwrap();
    let mut batch = w
        .settle(s + 2, Outcome::RetryAfter(Duration::from_millis(250)), None)
        .unwrap()
        .unwrap();
    // What the engine marks on every stream subscription.
    batch.in_place = vec![1, 2];
    let plan = plan(&keys(), &batch, Mode::Pipeline, 1_000);
    let rendered = plan.render();
    assert_eq!(rendered[..2], ["INCR k1", "XACK orders g 1-0"]);
    // Each kept pending on this consumer, never counted lower than Redis has: the retry with
    // its next delivery counted; the retry_after as it is, its delay kept in the group's
    // delay set (counted once due). Nothing is appended to the stream, which the other
    // groups read.
    let script = format!("EVAL {} 2", settle::KEEP_IN_PLACE);
    let due = "{orders}:window:delayed:g";
    assert_eq!(rendered[2], format!("{script} orders {due} g c 2-0 2"));
    assert_eq!(rendered[3], format!("{script} orders {due} g c 3-0 1 250"));
    assert_eq!(rendered.len(), 4);
    assert_eq!(plan.commands[2].role, Role::KeepInPlace);
    let kept: Vec<_> = plan.in_place.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(
        kept,
        [Bytes::from_static(b"2-0"), Bytes::from_static(b"3-0")]
    );
    assert_eq!(plan.settles, 1);
}

/// Redis counts a copy's own deliveries: a copy delivered for the third time in all, two of
/// them its original's, is kept in place with Redis counting two.
#[test]
fn a_copy_kept_in_place_is_counted_without_its_originals_deliveries() {
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let mut copy = entry("5-0");
    copy.fields.push((
        Bytes::from_static(b"h:x-window-attempts"),
        Bytes::from_static(b"2"),
    ));
    copy.delivery_count = 3;
    let read = w.open_read(vec![copy]).unwrap();
    let mut batch = w
        .settle(read.first_slot, Outcome::Retry, None)
        .unwrap()
        .unwrap();
    batch.in_place = vec![0];
    let plan = plan(&keys(), &batch, Mode::Pipeline, 1_000);
    let script = format!("EVAL {} 2", settle::KEEP_IN_PLACE);
    assert_eq!(
        plan.render(),
        [format!(
            "{script} orders {{orders}}:window:delayed:g g c 5-0 2"
        )]
    );
}
