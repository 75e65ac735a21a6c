use std::time::Duration;

use super::*;
use crate::domain::Mode;
use crate::redis::flush::{PlanContext, plan_flush};
use crate::window::{Command, Limits, Outcome, Window};

fn keys(reliable: bool) -> ListKeys {
    ListKeys::new(&ListSource {
        key: "jobs".into(),
        consumer: "c1".into(),
        dead_after: Duration::from_secs(30),
        reliable,
        framing: Framing::Frames,
    })
}

fn plan(keys: &ListKeys, outcomes: &[Outcome], mode: Mode) -> Vec<String> {
    let entries = (0..outcomes.len())
        .map(|i| entry(Bytes::from(format!("v{i}")), 0, keys.framing))
        .collect();
    plan_of(keys, entries, outcomes, mode, 0).render()
}

fn plan_of(
    keys: &ListKeys,
    entries: Vec<Entry>,
    outcomes: &[Outcome],
    mode: Mode,
    max_deliveries: u32,
) -> FlushPlan {
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w.open_read(entries).unwrap();
    let mut batch = None;
    for (i, outcome) in outcomes.iter().enumerate() {
        let slot = read.first_slot + i as u64;
        w.queue(
            slot,
            Command::new("INCR", vec![Bytes::from(format!("k{i}"))]),
        )
        .unwrap();
        batch = w.settle(slot, *outcome, None).unwrap();
    }
    let ctx = PlanContext {
        mode,
        now_ms: 0,
        max_deliveries,
    };
    plan_flush(keys, &mut batch.unwrap(), &ctx)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A value ruststream-fred framed, with its retry count.
fn framed(payload: &str, retry_count: &str) -> Bytes {
    frame::encode(&[
        (b("_payload"), b(payload)),
        (b("h:content-type"), b("text/plain")),
        (b("h:x-ruststream-retry-count"), b(retry_count)),
    ])
}

/// The fields of the value a command pushes, decoded.
fn pushed(plan: &FlushPlan, name: &str) -> Vec<(Bytes, Bytes)> {
    let command = plan
        .writes()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", plan.render()));
    frame::decode(&command.args[1]).expect("a frame")
}

#[test]
fn a_framed_value_is_delivered_as_payload_and_headers_counting_its_earlier_copies() {
    let stored = framed("p", "2");
    // The hash counted one delivery of this very value (a recovery, say).
    let e = entry(stored.clone(), 1, Framing::Frames);
    assert_eq!(e.delivery_count, 4);
    assert_eq!(value(&e), &stored);
    assert_eq!(e.header("content-type"), Some(&b("text/plain")));
    // Read raw, the same value is one opaque payload.
    let raw = entry(stored.clone(), 1, Framing::Raw);
    assert_eq!(raw.delivery_count, 2);
    assert_eq!(raw.fields, [(b("_payload"), stored)]);
}

#[test]
fn a_retried_framed_value_goes_back_as_a_frame_with_its_count_raised() {
    let keys = keys(true);
    let stored = framed("p", "2");
    let e = entry(stored.clone(), 0, Framing::Frames);
    let plan = plan_of(&keys, vec![e], &[Outcome::Retry], Mode::Pipeline, 5);
    let copy = pushed(&plan, "LPUSH");
    assert!(copy.contains(&(b("_payload"), b("p"))));
    assert!(copy.contains(&(b("h:content-type"), b("text/plain"))));
    assert!(copy.contains(&(b("h:x-ruststream-retry-count"), b("3"))));
    assert!(copy.contains(&(b("h:x-window-attempts"), b("3"))));
    // The old value leaves the processing list (the step's LREM), and its count is forgotten
    // (the copy carries it).
    assert!(plan.render()[0].starts_with("OWNED {jobs}:window:processing:c1 "));
    let rendered = writes(&plan);
    assert!(rendered.contains(&format!(
        "HDEL {{jobs}}:window:deliveries {}",
        String::from_utf8_lossy(&stored)
    )));
    assert!(
        !rendered.iter().any(|c| c.starts_with("HSET")),
        "{rendered:?}"
    );
}

/// The writes of a plan, its requeue step's among them, as `NAME arg arg` lines.
fn writes(plan: &FlushPlan) -> Vec<String> {
    FlushPlan {
        commands: plan.writes(),
        ..FlushPlan::default()
    }
    .render()
}

#[test]
fn a_dead_letter_is_a_frame_that_says_where_from_how_often_and_why() {
    let mut keys = keys(true);
    keys.dead_letter = Some(b("jobs:dead"));
    // A raw value at the cap.
    let e = entry(b("v0"), 2, Framing::Frames);
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w.open_read(vec![e]).unwrap();
    let mut batch = w
        .settle(read.first_slot, Outcome::Retry, Some("boom".into()))
        .unwrap()
        .unwrap();
    let ctx = PlanContext {
        mode: Mode::Pipeline,
        now_ms: 0,
        max_deliveries: 3,
    };
    let plan = plan_flush(&keys, &mut batch.clone(), &ctx);
    assert_eq!(plan.dead_lettered, 1);
    let letter = pushed(&plan, "LPUSH");
    assert_eq!(
        letter,
        [
            (b("_payload"), b("v0")),
            (b("h:x-window-subscription"), b("jobs")),
            (b("h:x-window-deliveries"), b("3")),
            (b("h:x-ruststream-retry-count"), b("3")),
            (b("h:x-window-reason"), b("boom")),
        ]
    );
    // Read raw, the dead letter is the value as it was.
    keys.framing = Framing::Raw;
    let plan = plan_flush(&keys, &mut batch, &ctx);
    assert!(writes(&plan).contains(&"LPUSH jobs:dead v0".to_owned()));
}

#[test]
fn a_reliable_list_settles_with_one_lrem_per_entry_after_the_kept_segments() {
    let rendered = plan(
        &keys(true),
        &[Outcome::Ack, Outcome::Drop, Outcome::Ack],
        Mode::Pipeline,
    );
    assert_eq!(
        rendered,
        vec![
            "INCR k0",
            "INCR k2",
            "LREM {jobs}:window:processing:c1 1 v0",
            "LREM {jobs}:window:processing:c1 1 v1",
            "LREM {jobs}:window:processing:c1 1 v2",
        ]
    );
}

#[test]
fn a_retry_pushes_the_value_back_in_one_step_with_its_lrem_while_it_is_ours() {
    let rendered = plan(&keys(true), &[Outcome::Retry], Mode::Pipeline);
    assert_eq!(
        rendered,
        vec![
            "OWNED {jobs}:window:processing:c1 jobs {jobs}:window:deliveries | ",
            "v0: LPUSH jobs v0; HSET {jobs}:window:deliveries v0 1",
        ]
    );
    // A simple list has no processing list: nobody else holds its entries, and its step
    // needs nothing in Redis to settle them (the sidecar holds those it could not write).
    let keys = keys(false);
    let rendered = plan(&keys, &[Outcome::Retry], Mode::Pipeline);
    assert_eq!(
        rendered,
        vec![
            "OWNED jobs {jobs}:window:deliveries | ",
            "v0: LPUSH jobs v0; HSET {jobs}:window:deliveries v0 1",
        ]
    );
    let entries = vec![entry(b("v0"), 0, keys.framing)];
    let planned = plan_of(&keys, entries, &[Outcome::Retry], Mode::Pipeline, 0);
    let script = &planned.commands[0].args[0];
    assert_eq!(script, settle::REQUEUE_POPPED.as_bytes());
}

#[test]
fn atomic_mode_wraps_each_segment_with_its_lrem_and_a_simple_list_settles_nothing() {
    let rendered = plan(&keys(true), &[Outcome::Ack], Mode::Atomic);
    assert_eq!(
        rendered,
        vec![
            "SEGMENT {jobs}:window:processing:c1 | INCR k0 | LREM {jobs}:window:processing:c1 1 v0"
        ]
    );
    let rendered = plan(&keys(false), &[Outcome::Ack, Outcome::Drop], Mode::Atomic);
    assert_eq!(rendered, vec!["SEGMENT  | INCR k0 | "]);
}

#[test]
fn companion_keys_share_the_list_slot() {
    let keys = keys(true);
    for key in keys.companions() {
        assert_eq!(fred::util::redis_keyslot(key), keys.slot, "{key:?}");
    }
}

#[test]
fn a_retry_kept_in_place_stays_on_the_processing_list_with_its_delivery_counted() {
    let keys = keys(true);
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let read = w
        .open_read(vec![
            entry(b("v0"), 0, keys.framing),
            entry(b("v1"), 0, keys.framing),
        ])
        .unwrap();
    w.settle(read.first_slot, Outcome::Ack, None).unwrap();
    let mut batch = w
        .settle(read.first_slot + 1, Outcome::Retry, None)
        .unwrap()
        .unwrap();
    // What the engine marks on an ordered subscription.
    batch.in_place = vec![1];
    let ctx = PlanContext {
        mode: Mode::Pipeline,
        now_ms: 0,
        max_deliveries: 0,
    };
    assert_eq!(
        plan_flush(&keys, &mut batch, &ctx).render(),
        vec![
            "LREM {jobs}:window:processing:c1 1 v0",
            "HINCRBY {jobs}:window:deliveries v1 1",
        ]
    );
}
