//! The checker on made-up histories: each rule, and what a run that keeps every promise
//! looks like.

use std::collections::HashMap;

use super::*;

const PROMISE: Promise = Promise {
    exactly_once: false,
    max_deliveries: 4,
    at_most_once: false,
    by_payload: false,
    across_group: false,
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
fn an_ack_settled_without_its_side_effect_is_excused_by_the_log_when_no_report_came() {
    let e = end(&["1-0", "2-0"]);
    // Both acked, then the worker left: no report reached it. The sidecar's failed flush
    // named 1-0 as settled without the side effect Redis refused; 2-0 it did not name.
    let history = vec![
        at(0, Event::Fault("oom [6379] for 900 ms".into())),
        at(1, delivered("1-0", 1)),
        at(2, decided("1-0", Decision::Ack)),
        at(3, delivered("2-0", 1)),
        at(4, decided("2-0", Decision::Ack)),
        at(900, Event::Undone("oom".into())),
        at(
            9_000,
            Event::Said {
                worker: 1,
                said: Said::EffectsRefused,
                entries: vec!["1-0".into()],
            },
        ),
    ];
    let (anomalies, figures) = check(&history, &e, PROMISE);
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    assert_eq!(anomalies[0].root.as_deref(), Some("2-0"));
    assert_eq!(
        (figures.effects_refused, figures.said_effects_refused),
        (1, 1)
    );
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
fn a_read_handled_after_a_redrive_counts_in_the_generation_it_was_read_in() {
    let state = end(&["1-0"]);
    let came = |t, read_id, count| {
        vec![at(
            t,
            Event::Came {
                worker: 1,
                stream: 1,
                read_id,
                deliveries: vec![("1-0".into(), "k".into(), count)],
            },
        )]
    };
    let handled = |t, read_id, count| {
        vec![
            at(
                t,
                Event::Read {
                    worker: 1,
                    stream: 1,
                    read_id,
                },
            ),
            at(t, delivered("1-0", count)),
        ]
    };
    let redrive = at(
        2_000,
        Event::Redriven {
            dead: "9-0".into(),
            origin: "1-0".into(),
            deliveries: 4,
            copy: String::new(),
        },
    );
    // Read at count 3 at `came_at`, handled at 2.5 s (its worker was busy), the redrive at
    // 2 s; then the redriven entry from count 1 again.
    let backwards = |came_at| {
        let mut h = [
            came(came_at, 1, 3),
            vec![redrive.clone()],
            handled(2_500, 1, 3),
            came(3_000, 2, 1),
            handled(3_000, 2, 1),
        ]
        .concat();
        h.sort_by_key(|s| s.at_ms);
        let (anomalies, _) = check(&h, &state, PROMISE);
        anomalies.iter().any(|a| a.what.contains("backwards"))
    };
    assert!(
        !backwards(1_000),
        "read before the redrive, handled after it"
    );
    assert!(
        backwards(2_200),
        "read after the redrive, its count went back"
    );
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

#[test]
fn read_ids_increase_within_each_reading_of_a_partition() {
    let read = |read_id| {
        at(
            0,
            Event::Read {
                worker: 1,
                stream: 1,
                read_id,
            },
        )
    };
    let (one, two) = (1 << 36, 2 << 36);
    // Two partitions' reads side by side on one stream.
    let history = vec![read(two + 1), read(one + 1), read(two + 2), read(one + 2)];
    assert!(reads::reads_in_order(&history).is_empty());
    let history = vec![read(one + 2), read(two + 1), read(one + 1)];
    assert_eq!(reads::reads_in_order(&history).len(), 1);
}
