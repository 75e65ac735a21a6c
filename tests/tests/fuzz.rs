//! Fuzzing what a client can send: arbitrary bytes decoded as a SubscribeRequest, and arbitrary
//! well-formed requests, go through the conversion into window operations, the command checks
//! (forbidden list, Redis's own command table, the operator's policy, key extraction) and the
//! window itself. Nothing may panic; every refusal must carry a message.
//!
//! Bounded for CI: PROPTEST_CASES sets the number of cases per property (default below).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use window_sidecar::grpc::convert::{OpenLimits, client_message};
use window_sidecar::policy::{CommandRules, Patterns, Policy};
use window_sidecar::proto::{self, subscribe_request::Kind};
use window_sidecar::redis::keys::KeySpecs;
use window_sidecar::session::ClientMessage;
use window_sidecar::window::{CommandError, Limits, Window};
use window_sidecar_harness::{RedisServer, pack_commands};

const LIMITS: OpenLimits = OpenLimits {
    max_count: 512,
    max_in_flight: 4096,
};

/// The command table of a real redis-server, loaded once.
fn table() -> Arc<KeySpecs> {
    static TABLE: OnceLock<Arc<KeySpecs>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            let runtime = tokio::runtime::Runtime::new().expect("runtime");
            runtime.block_on(async {
                let redis = RedisServer::start();
                let client = redis.client().await;
                Arc::new(KeySpecs::load(&client).await.expect("COMMAND"))
            })
        })
        .clone()
}

fn policy() -> Policy {
    Policy {
        keys: Patterns::new(&["orders*", "{orders}:*", "count:?"]),
        ..Policy::default()
    }
}

/// Runs a converted message through what a subscription does with it.
fn exercise(message: proto::SubscribeRequest, window: &mut Window<u32>, policy: &Policy) {
    let table = table();
    match client_message(message, LIMITS) {
        Err(err) => assert!(!err.to_string().is_empty()),
        Ok(ClientMessage::Open(open)) => {
            assert!(open.count >= 1 && open.count <= LIMITS.max_count);
            assert!(open.max_in_flight <= LIMITS.max_in_flight);
        }
        Ok(ClientMessage::Batch(batch)) => {
            for (slot, command) in batch.commands {
                // As a subscription admits a command: the table, the rules, every key.
                let command = command.and_then(|command| {
                    let refused = |source| CommandError::Policy {
                        command: command.name.clone(),
                        source,
                    };
                    let (full, categories) = table
                        .categories(&command.name, &command.args)
                        .map_err(|_| CommandError::Unknown(command.name.clone()))?;
                    policy
                        .check_command(&full, categories, &command.args)
                        .map_err(refused)?;
                    table.check_arity(&command.name, &command.args)?;
                    let keys = table
                        .keys(&command.name, &command.args)
                        .map_err(|_| CommandError::Unknown(command.name.clone()))?;
                    for key in keys {
                        policy.check_key(key).map_err(refused)?;
                    }
                    Ok(command)
                });
                if let Err(err) = window.queue(slot, command) {
                    assert!(!err.to_string().is_empty());
                }
            }
            for outcome in batch.outcomes {
                match outcome {
                    Ok(settle) => {
                        if let Ok(Some(done)) =
                            window.settle(settle.slot, settle.outcome, settle.reason)
                        {
                            assert!(done.settles.len() <= 8);
                        }
                    }
                    Err(err) => assert!(!err.to_string().is_empty()),
                }
            }
        }
    }
}

fn fresh_window() -> Window<u32> {
    let mut window = Window::new(Limits {
        max_commands_per_slot: 16,
    });
    // Slots 1..=8 are open, so generated slot numbers hit real deliveries as well as none.
    window.open_read((0..8).collect());
    window
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("INCR".to_string()),
        Just("set".to_string()),
        Just("XADD".to_string()),
        Just("EVAL".to_string()),
        Just("OBJECT".to_string()),
        Just("MULTI".to_string()),
        Just("SORT".to_string()),
        Just("MSET".to_string()),
        Just("xreadgroup".to_string()),
        "[A-Za-z|._-]{0,12}",
        ".{0,70}",
    ]
}

fn arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"orders".to_vec()),
        Just(b"{orders}:x".to_vec()),
        Just(b"count:1".to_vec()),
        Just(b"STREAMS".to_vec()),
        Just(b"2".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"FREQ".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    proptest::option::of(
        (any::<i64>(), any::<i32>())
            .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
    )
}

fn open() -> impl Strategy<Value = proto::Open> {
    let source = prop_oneof![
        (
            ".{0,12}",
            ".{0,8}",
            ".{0,8}",
            ".{0,20}",
            duration(),
            prop_oneof![Just(0u32), 0u32..2048, any::<u32>()],
        )
            .prop_map(|(key, group, consumer, start_id, min_idle, partitions)| {
                proto::open::Source::Stream(proto::StreamSource {
                    key,
                    group,
                    consumer,
                    start_id,
                    min_idle,
                    partitions,
                })
            }),
        (".{0,12}", ".{0,8}", duration()).prop_map(|(key, consumer, dead_after)| {
            proto::open::Source::ReliableList(proto::ReliableListSource {
                key,
                consumer,
                dead_after,
            })
        }),
        ".{0,12}".prop_map(|key| proto::open::Source::SimpleList(proto::SimpleListSource { key })),
        (
            proptest::collection::vec(".{0,8}", 0..3),
            proptest::collection::vec(".{0,8}", 0..3),
            any::<u32>()
        )
            .prop_map(|(channels, patterns, buffer)| {
                proto::open::Source::Pubsub(proto::PubSubSource {
                    channels,
                    patterns,
                    buffer,
                    sharded_channels: Vec::new(),
                })
            }),
    ];
    (
        proptest::option::of(source),
        any::<u32>(),
        duration(),
        any::<i32>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(source, count, block, mode, max_in_flight, max_deliveries)| proto::Open {
                source,
                count: count % 1024,
                block,
                mode,
                max_in_flight,
                max_deliveries,
                ..Default::default()
            },
        )
}

fn command() -> impl Strategy<Value = proto::QueuedCommand> {
    (0u64..12, name(), proptest::collection::vec(arg(), 0..6)).prop_map(|(slot, name, args)| {
        proto::QueuedCommand {
            slot,
            name,
            args: args.into_iter().map(Bytes::from).collect(),
        }
    })
}

/// `Batch.packed_commands` with its slots: commands packed as RESP, or bytes that may be
/// anything, with any number of slots.
fn packed() -> impl Strategy<Value = (Bytes, Vec<u64>)> {
    let resp =
        proptest::collection::vec(command(), 0..6).prop_map(|commands| pack_commands(&commands));
    let anything = (
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(0u64..12, 0..4),
    )
        .prop_map(|(bytes, slots)| (Bytes::from(bytes), slots));
    prop_oneof![resp, anything]
}

/// A batch's commands as the sidecar takes them, for comparing.
fn queued(batch: proto::Batch) -> Vec<String> {
    let message = proto::SubscribeRequest {
        kind: Some(Kind::Batch(batch)),
    };
    match client_message(message, LIMITS) {
        Ok(ClientMessage::Batch(batch)) => batch
            .commands
            .into_iter()
            .map(|command| format!("{command:?}"))
            .collect(),
        other => panic!("a batch of commands was not taken: {other:?}"),
    }
}

fn batch() -> impl Strategy<Value = proto::Batch> {
    let outcome =
        (0u64..12, any::<i32>(), duration(), ".{0,10}").prop_map(|(slot, kind, delay, reason)| {
            proto::Outcome {
                slot,
                kind: kind % 6,
                delay,
                reason,
                ..Default::default()
            }
        });
    (
        proptest::collection::vec(command(), 0..12),
        proptest::collection::vec(outcome, 0..10),
        proptest::collection::vec(0u64..12, 0..6),
        proptest::collection::vec(any::<u64>(), 0..4),
        packed(),
    )
        .prop_map(
            |(commands, outcomes, acks, extend, (packed_commands, packed_command_slots))| {
                proto::Batch {
                    commands,
                    outcomes,
                    acks,
                    extend,
                    packed_commands,
                    packed_command_slots,
                }
            },
        )
}

fn request() -> impl Strategy<Value = proto::SubscribeRequest> {
    prop_oneof![
        open().prop_map(|o| Some(Kind::Open(o))),
        batch().prop_map(|b| Some(Kind::Batch(b))),
        Just(None),
    ]
    .prop_map(|kind| proto::SubscribeRequest { kind })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2_000),
        ..ProptestConfig::default()
    })]

    /// Any bytes off the wire: decoding fails cleanly or the message is converted and used.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(message) = proto::SubscribeRequest::decode(bytes.as_slice()) {
            exercise(message, &mut fresh_window(), &policy());
        }
    }

    /// Well-formed requests with arbitrary contents, several in a row on one window.
    #[test]
    fn arbitrary_requests_never_panic(messages in proptest::collection::vec(request(), 1..6)) {
        let mut window = fresh_window();
        let policy = policy();
        for message in messages {
            let encoded = message.encode_to_vec();
            prop_assert_eq!(proto::SubscribeRequest::decode(encoded.as_slice()).ok(), Some(message.clone()));
            exercise(message, &mut window, &policy);
        }
    }

    /// Commands packed as RESP are the commands they pack, refused or not, in the same order.
    #[test]
    fn packed_commands_are_the_commands_they_pack(commands in proptest::collection::vec(command(), 0..8)) {
        let (packed_commands, packed_command_slots) = pack_commands(&commands);
        let packed = queued(proto::Batch { packed_commands, packed_command_slots, ..Default::default() });
        prop_assert_eq!(packed, queued(proto::Batch { commands, ..Default::default() }));
    }

    /// The operator's settings never panic, whatever text they are given.
    #[test]
    fn arbitrary_policy_text_never_panics(rules in ".{0,40}", patterns in proptest::collection::vec(".{0,10}", 0..4), key in proptest::collection::vec(any::<u8>(), 0..16)) {
        match CommandRules::parse(&rules) {
            Ok(rules) => { let _ = rules.allows("INCR", &["@write".into()]); }
            Err(message) => prop_assert!(!message.is_empty()),
        }
        let _ = Patterns::new(&patterns).allows(&key);
    }
}

#[test]
fn outcomes_reach_the_window() {
    // The fuzz above only asserts no panic; this pins that the path it drives is live.
    let mut window = fresh_window();
    let message = proto::SubscribeRequest {
        kind: Some(Kind::Batch(proto::Batch {
            extend: Vec::new(),
            commands: vec![proto::QueuedCommand {
                slot: 1,
                name: "incr".into(),
                args: vec![Bytes::from_static(b"count:1")],
            }],
            outcomes: vec![proto::Outcome {
                slot: 1,
                kind: proto::OutcomeKind::Ack as i32,
                ..Default::default()
            }],
            acks: vec![],
            ..Default::default()
        })),
    };
    exercise(message, &mut window, &policy());
    assert_eq!(window.outstanding(), 7);
    assert_eq!(window.kept_segments(), 1);
}
