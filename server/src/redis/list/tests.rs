use super::*;
use crate::redis::plan::{Mode, PlanContext, plan_flush};
use crate::window::{Command, Limits, Outcome, Window};

fn keys(reliable: bool) -> ListKeys {
    ListKeys::new(&ListSource {
        key: "jobs".into(),
        consumer: "c1".into(),
        dead_after: Duration::from_secs(30),
        reliable,
    })
}

fn plan(keys: &ListKeys, outcomes: &[Outcome], mode: Mode) -> Vec<String> {
    let mut w = Window::new(Limits {
        max_commands_per_slot: 8,
    });
    let entries = (0..outcomes.len())
        .map(|i| entry(Bytes::from(format!("v{i}")), 1))
        .collect();
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
        max_deliveries: 0,
    };
    plan_flush(keys, &batch.unwrap(), &ctx).render()
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
fn a_retry_pushes_the_value_back_before_its_lrem_in_one_transaction() {
    let rendered = plan(&keys(true), &[Outcome::Retry], Mode::Pipeline);
    assert_eq!(
        rendered,
        vec![
            "MULTI",
            "LPUSH jobs v0",
            "HSET {jobs}:window:deliveries v0 1",
            "LREM {jobs}:window:processing:c1 1 v0",
            "EXEC",
        ]
    );
}

#[test]
fn atomic_mode_wraps_each_segment_with_its_lrem_and_a_simple_list_settles_nothing() {
    let rendered = plan(&keys(true), &[Outcome::Ack], Mode::Atomic);
    assert_eq!(
        rendered,
        vec![
            "MULTI",
            "INCR k0",
            "LREM {jobs}:window:processing:c1 1 v0",
            "EXEC"
        ]
    );
    let rendered = plan(&keys(false), &[Outcome::Ack, Outcome::Drop], Mode::Atomic);
    assert_eq!(rendered, vec!["MULTI", "INCR k0", "EXEC"]);
}

#[test]
fn companion_keys_share_the_list_slot() {
    let keys = keys(true);
    for key in keys.companions() {
        assert_eq!(fred::util::redis_keyslot(key), keys.slot, "{key:?}");
    }
}
