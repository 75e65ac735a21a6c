use super::*;
use crate::domain::Target;
use crate::window::CommandError;

const LIMITS: OpenLimits = OpenLimits {
    max_count: 100,
    max_in_flight: 1000,
};

fn open(count: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::Stream(proto::StreamSource {
            key: "orders".into(),
            group: "g".into(),
            ..Default::default()
        })),
        count,
        ..Default::default()
    }
}

#[test]
fn fills_in_defaults() {
    let request = open_request(open(10), LIMITS).unwrap();
    assert_eq!(request.block, DEFAULT_BLOCK);
    assert_eq!(request.mode, Mode::Pipeline);
    assert_eq!(request.max_in_flight, 20);
    let Source::Stream(source) = request.source else {
        panic!("a stream source")
    };
    assert_eq!(source.start_id, "0");
    assert_eq!(source.min_idle, DEFAULT_MIN_IDLE);
}

#[test]
fn refuses_bad_opens_with_actionable_messages() {
    let cases: Vec<(proto::Open, &str)> = vec![
        (open(0), "open.count must be between 1 and 100"),
        (open(101), "open.count must be between 1 and 100"),
        (
            proto::Open { mode: 7, ..open(1) },
            "open.mode 7 is not a known mode",
        ),
        (
            proto::Open {
                max_in_flight: 5000,
                ..open(1)
            },
            "open.max_in_flight must be at most 1000",
        ),
        (
            proto::Open {
                source: None,
                ..open(1)
            },
            "open.source is required",
        ),
        (
            proto::Open {
                block: Some(prost_types::Duration {
                    seconds: 61,
                    nanos: 0,
                }),
                ..open(1)
            },
            "open.block must be at most",
        ),
    ];
    for (open, expected) in cases {
        let err = open_request(open, LIMITS).unwrap_err();
        assert!(
            err.to_string().contains(expected),
            "{err:?} lacks {expected:?}"
        );
    }
    let empty_key = proto::Open {
        source: Some(proto::open::Source::Stream(proto::StreamSource {
            group: "g".into(),
            ..Default::default()
        })),
        count: 1,
        ..Default::default()
    };
    assert!(
        open_request(empty_key, LIMITS)
            .unwrap_err()
            .to_string()
            .contains("key is required")
    );
}

#[test]
fn outcomes_need_a_kind_and_retry_after_a_delay() {
    let bad = outcome(proto::Outcome {
        slot: 3,
        kind: proto::OutcomeKind::RetryAfter as i32,
        ..Default::default()
    });
    assert!(matches!(
        bad,
        Err(SlotError::InvalidOutcome { slot: 3, .. })
    ));
    assert!(
        outcome(proto::Outcome {
            slot: 3,
            ..Default::default()
        })
        .is_err()
    );
    assert!(
        outcome(proto::Outcome {
            slot: 3,
            kind: 42,
            ..Default::default()
        })
        .is_err()
    );
    let ok = outcome(proto::Outcome {
        slot: 3,
        kind: proto::OutcomeKind::RetryAfter as i32,
        delay: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        reason: "later".into(),
        trace: None,
    })
    .unwrap();
    assert_eq!(
        ok,
        SettleRequest {
            slot: 3,
            outcome: Outcome::RetryAfter(Duration::from_secs(1)),
            reason: Some("later".into()),
            trace: None,
        }
    );
}

#[test]
fn a_dead_letter_outcome_keeps_its_reason() {
    let settle = outcome(proto::Outcome {
        slot: 4,
        kind: proto::OutcomeKind::DeadLetter as i32,
        reason: "bad sku".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settle.outcome, Outcome::DeadLetter);
    assert_eq!(settle.reason.as_deref(), Some("bad sku"));
}

#[test]
fn packed_acks_are_acks_after_the_outcomes() {
    let batch = client_batch(proto::Batch {
        outcomes: vec![proto::Outcome {
            slot: 1,
            kind: proto::OutcomeKind::Drop as i32,
            ..Default::default()
        }],
        acks: vec![3, 2],
        ..Default::default()
    })
    .unwrap();
    let settled: Vec<(u64, Outcome)> = batch
        .outcomes
        .into_iter()
        .map(|o| o.map(|s| (s.slot, s.outcome)).unwrap())
        .collect();
    assert_eq!(
        settled,
        [(1, Outcome::Drop), (3, Outcome::Ack), (2, Outcome::Ack)]
    );
}

#[test]
fn packed_commands_are_queued_after_the_others_and_checked_alike() {
    let batch = client_batch(proto::Batch {
        commands: vec![proto::QueuedCommand {
            slot: 1,
            name: "set".into(),
            args: vec![Bytes::from_static(b"k"), Bytes::from_static(b"v")],
        }],
        packed_commands: Bytes::from_static(
            b"*2\r\n$4\r\nincr\r\n$4\r\nhits\r\n*1\r\n$4\r\nEXEC\r\n*1\r\n$2\r\n\xff\xfe\r\n",
        ),
        packed_command_slots: vec![2, 3, 4],
        ..Default::default()
    })
    .unwrap();
    type Queued = (u64, Result<(String, Vec<Bytes>), CommandError>);
    let commands: Vec<Queued> = batch
        .commands
        .into_iter()
        .map(|(slot, c)| (slot, c.map(|c| (c.name, c.args))))
        .collect();
    assert_eq!(
        commands[0],
        (
            1,
            Ok((
                "SET".into(),
                vec![Bytes::from_static(b"k"), Bytes::from_static(b"v")]
            ))
        )
    );
    assert_eq!(
        commands[1],
        (2, Ok(("INCR".into(), vec![Bytes::from_static(b"hits")])))
    );
    assert!(matches!(
        commands[2],
        (3, Err(CommandError::Forbidden { .. }))
    ));
    assert!(matches!(
        commands[3],
        (4, Err(CommandError::InvalidName(_)))
    ));
}

#[test]
fn packed_commands_that_are_not_resp_end_the_stream() {
    let message = |packed: &'static [u8], slots: Vec<u64>| proto::SubscribeRequest {
        kind: Some(proto::subscribe_request::Kind::Batch(proto::Batch {
            packed_commands: Bytes::from_static(packed),
            packed_command_slots: slots,
            ..Default::default()
        })),
    };
    let invalid = |request| match client_message(request, LIMITS) {
        Err(InboundError::Invalid(message)) => message,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    };
    assert_eq!(
        invalid(message(b"*1\r\n$4\r\nPING\r\nINCR", vec![1, 2])),
        "batch.packed_commands: command 1, at byte 14: expected '*', the start of a command's \
         array (each command is a RESP array of bulk strings, its name first: \
         *2\\r\\n$4\\r\\nINCR\\r\\n$4\\r\\nhits\\r\\n)"
    );
    assert_eq!(
        invalid(message(b"", vec![7])),
        "batch.packed_commands holds 0 commands, but packed_command_slots names 1 slots: one \
         slot per command"
    );
}

#[test]
fn opened_says_packed_commands_are_read() {
    let request = open_request(open(10), LIMITS).unwrap();
    let opened = opened_message(Opened {
        subscription_id: "s1".into(),
        source: request.source.clone(),
        request,
    });
    assert!(opened.packed_commands);
}

#[test]
fn deliveries_split_the_payload_layout() {
    let entry = Arc::new(Entry {
        id: Bytes::from_static(b"1-0"),
        fields: vec![
            (Bytes::from_static(b"_payload"), Bytes::from_static(b"{}")),
            (
                Bytes::from_static(b"h:traceparent"),
                Bytes::from_static(b"00-abc"),
            ),
        ],
        delivery_count: 1,
        ..Default::default()
    });
    let d = delivery(7, &entry, None);
    assert_eq!(d.slot, 7);
    assert_eq!(d.payload.as_ref(), b"{}");
    assert!(d.fields.is_empty());
    assert_eq!(d.trace.unwrap().traceparent, "00-abc");
}

#[test]
fn publish_writes_the_layout() {
    let fields = publish_fields(
        proto::PublishEntry {
            payload: Bytes::from_static(b"p"),
            headers: [("k".to_string(), "v".to_string())].into(),
            ..Default::default()
        },
        &stream(),
        Framing::Frames,
        None,
    )
    .unwrap();
    assert_eq!(fields[0].0.as_ref(), b"_payload");
    assert_eq!(
        fields[1],
        (Bytes::from_static(b"h:k"), Bytes::from_static(b"v"))
    );
    assert!(
        publish_fields(
            proto::PublishEntry::default(),
            &stream(),
            Framing::Frames,
            None
        )
        .is_err()
    );
    // Without a context of its own, an entry gets the publish span's.
    let raw = proto::PublishEntry {
        fields: vec![proto::Field {
            name: Bytes::from_static(b"a"),
            value: Bytes::from_static(b"1"),
        }],
        ..Default::default()
    };
    let fields = publish_fields(raw, &stream(), Framing::Frames, Some("00-ab-cd-01")).unwrap();
    assert_eq!(
        fields[1],
        (
            Bytes::from_static(b"h:traceparent"),
            Bytes::from_static(b"00-ab-cd-01")
        )
    );
}

fn stream() -> Target {
    Target::Stream {
        key: Bytes::from_static(b"orders"),
        max_len: None,
    }
}

/// A list value or a message is a payload: bare when it has no headers (no trace is added),
/// framed with the trace when it has some, and never both raw and headed.
#[test]
fn publish_to_a_list_or_a_channel_frames_only_what_has_headers() {
    let list = Target::List(Bytes::from_static(b"jobs"));
    let trace = Some("00-ab-cd-01");
    let bare = proto::PublishEntry {
        payload: Bytes::from_static(b"p"),
        ..Default::default()
    };
    let fields = publish_fields(bare.clone(), &list, Framing::Frames, trace).unwrap();
    assert_eq!(
        fields,
        [(Bytes::from_static(b"_payload"), Bytes::from_static(b"p"))]
    );
    let headed = proto::PublishEntry {
        headers: [("k".to_string(), "v".to_string())].into(),
        ..bare
    };
    let fields = publish_fields(headed.clone(), &list, Framing::Frames, trace).unwrap();
    assert_eq!(fields.len(), 3, "{fields:?}");
    assert!(fields.contains(&(
        Bytes::from_static(b"h:traceparent"),
        Bytes::from_static(b"00-ab-cd-01")
    )));
    let err = publish_fields(headed, &list, Framing::Raw, trace).unwrap_err();
    assert!(err.to_string().contains("FRAMING_RAW"), "{err}");
    let with_fields = proto::PublishEntry {
        fields: vec![proto::Field::default()],
        ..Default::default()
    };
    let err = publish_fields(with_fields, &list, Framing::Frames, trace).unwrap_err();
    assert!(
        err.to_string().contains("`fields` are for streams"),
        "{err}"
    );
}

#[test]
fn publish_names_exactly_one_target() {
    let request = |f: fn(&mut proto::PublishRequest)| {
        let mut request = proto::PublishRequest::default();
        f(&mut request);
        publish_target(&request)
    };
    assert!(
        request(|_| {})
            .unwrap_err()
            .to_string()
            .contains("exactly one")
    );
    assert!(
        request(|r| {
            r.stream = "s".into();
            r.list = "l".into();
        })
        .unwrap_err()
        .to_string()
        .contains("exactly one")
    );
    assert_eq!(
        request(|r| r.channel = "c".into()).unwrap(),
        (Target::Channel(Bytes::from_static(b"c")), Framing::Frames)
    );
    assert!(
        request(|r| {
            r.stream = "s".into();
            r.framing = proto::Framing::Raw as i32;
        })
        .unwrap_err()
        .to_string()
        .contains("framing is for lists")
    );
    assert!(
        request(|r| {
            r.list = "l".into();
            r.max_len = 5;
        })
        .unwrap_err()
        .to_string()
        .contains("max_len")
    );
}
