//! What the soak runs: the keys and channels, how fast their producers write, the
//! subscriptions reading them (and which of them close and reopen), and the bounds every wait
//! and every subscription uses.

use std::sync::Arc;
use std::time::Duration;

use window_sidecar::proto;
use window_sidecar_harness::duration;

use crate::tally::Tally;

/// Stream keys; two consumers (`c0`, `c1`) of group `g` each.
pub(crate) const STREAM_KEYS: usize = 21;
/// Reliable lists; two consumers each.
pub(crate) const RELIABLE_KEYS: usize = 3;
/// Simple lists; one consumer each.
pub(crate) const SIMPLE_KEYS: usize = 4;
/// Subscriptions in all (the 2 are pub/sub: a channel and a pattern).
pub(crate) const SUBSCRIPTIONS: usize = 2 * STREAM_KEYS + 2 * RELIABLE_KEYS + SIMPLE_KEYS + 2;
/// Subscriptions that close and reopen every `CHURN_EVERY` (3 streams, 1 reliable list, 1
/// simple list).
pub(crate) const CHURNERS: usize = 5;
pub(crate) const CHURN_EVERY: Duration = Duration::from_secs(15);
/// Producers write `PER_TICK` entries every `TICK` per key or channel: 8/s each, about 240/s in
/// all (plus the retried copies).
pub(crate) const TICK: Duration = Duration::from_millis(250);
pub(crate) const PER_TICK: usize = 2;
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// BLOCK of every subscription: a closed subscription's read under way ends within it.
pub(crate) const BLOCK: Duration = Duration::from_secs(1);
/// Stream `min_idle`: entries a closing subscription's last read took after it closed are
/// claimed by the group after this.
const MIN_IDLE: Duration = Duration::from_secs(10);
pub(crate) const RETRY_AFTER: Duration = Duration::from_millis(300);
/// How long any poll may wait for a state it expects (never a timing assertion: a deadline
/// only turns a hang into a failure with the state printed).
pub(crate) const DEADLINE: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Form {
    Stream,
    Reliable,
    Simple,
    PubSub,
}

impl Form {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Form::Stream => "stream",
            Form::Reliable => "reliable_list",
            Form::Simple => "simple_list",
            Form::PubSub => "pubsub",
        }
    }
}

/// A key (or pub/sub channel or pattern), its producer and what its consumers did.
pub(crate) struct Target {
    /// The key, channel or pattern subscribed to; also names the side-effect keys.
    pub(crate) name: String,
    pub(crate) form: Form,
    /// Where producers write: the key, or the channel (for a pattern, one it matches).
    pub(crate) produce_to: String,
    /// A stream whose producer uses the sidecar's `Publish` rather than `XADD`.
    pub(crate) via_publish: bool,
    pub(crate) tally: Tally,
}

impl Target {
    pub(crate) fn seen_key(&self) -> String {
        format!("soak:fx:{}:seen", self.name)
    }
    pub(crate) fn acked_key(&self) -> String {
        format!("soak:fx:{}:acked", self.name)
    }
    /// Incremented by the segments of dropped and retried deliveries: must never run.
    pub(crate) fn never_key(&self) -> String {
        format!("soak:fx:{}:never", self.name)
    }
}

pub(crate) struct Sub {
    pub(crate) label: String,
    pub(crate) target: Arc<Target>,
    pub(crate) open: proto::Open,
    /// When it first closes and reopens (then every `CHURN_EVERY`).
    pub(crate) churn: Option<Duration>,
}

fn open_request(source: proto::open::Source, mode: proto::Mode) -> proto::Open {
    proto::Open {
        source: Some(source),
        count: 16,
        max_in_flight: 32,
        block: Some(duration(BLOCK)),
        mode: mode as i32,
        ..Default::default()
    }
}

/// The targets and the subscriptions reading them.
pub(crate) fn plan() -> (Vec<Arc<Target>>, Vec<Sub>) {
    let mut plan = Plan::default();
    plan.streams();
    plan.reliable_lists();
    plan.simple_lists();
    plan.pubsub();
    let Plan { targets, subs } = plan;
    assert_eq!(subs.len(), SUBSCRIPTIONS);
    assert_eq!(subs.iter().filter(|s| s.churn.is_some()).count(), CHURNERS);
    (targets, subs)
}

/// The targets and subscriptions planned so far, a form at a time.
#[derive(Default)]
struct Plan {
    targets: Vec<Arc<Target>>,
    subs: Vec<Sub>,
}

impl Plan {
    fn target(
        &mut self,
        name: String,
        form: Form,
        produce_to: String,
        via_publish: bool,
    ) -> Arc<Target> {
        let target = Arc::new(Target {
            name,
            form,
            produce_to,
            via_publish,
            tally: Tally::default(),
        });
        self.targets.push(Arc::clone(&target));
        target
    }

    /// Two consumers per stream; every other stream's producer uses `Publish`, every fifth
    /// stream is read in atomic mode, and the first consumer of the first three churns.
    fn streams(&mut self) {
        for i in 0..STREAM_KEYS {
            let key = format!("soak:stream:{i}");
            let t = self.target(key.clone(), Form::Stream, key.clone(), i % 2 == 1);
            let mode = if i % 5 == 4 {
                proto::Mode::Atomic
            } else {
                proto::Mode::Pipeline
            };
            for c in 0..2 {
                let source = proto::open::Source::Stream(proto::StreamSource {
                    key: key.clone(),
                    group: "g".into(),
                    consumer: format!("c{c}"),
                    start_id: "0".into(),
                    min_idle: Some(duration(MIN_IDLE)),
                    ..Default::default()
                });
                self.subs.push(Sub {
                    label: format!("{key}/c{c}"),
                    target: Arc::clone(&t),
                    open: open_request(source, mode),
                    churn: (c == 0 && i < 3).then(|| Duration::from_secs(5 + 3 * i as u64)),
                });
            }
        }
    }

    /// Two consumers per reliable list; the first one of the first list churns.
    fn reliable_lists(&mut self) {
        for i in 0..RELIABLE_KEYS {
            let key = format!("soak:reliable:{i}");
            let t = self.target(key.clone(), Form::Reliable, key.clone(), false);
            for c in 0..2 {
                let source = proto::open::Source::ReliableList(proto::ReliableListSource {
                    key: key.clone(),
                    consumer: format!("c{c}"),
                    dead_after: None,
                });
                self.subs.push(Sub {
                    label: format!("{key}/c{c}"),
                    target: Arc::clone(&t),
                    open: open_request(source, proto::Mode::Pipeline),
                    churn: (c == 0 && i == 0).then(|| Duration::from_secs(7)),
                });
            }
        }
    }

    /// One consumer per simple list; the first list's churns.
    fn simple_lists(&mut self) {
        for i in 0..SIMPLE_KEYS {
            let key = format!("soak:simple:{i}");
            let t = self.target(key.clone(), Form::Simple, key.clone(), false);
            let source =
                proto::open::Source::SimpleList(proto::SimpleListSource { key: key.clone() });
            self.subs.push(Sub {
                label: key.clone(),
                target: t,
                open: open_request(source, proto::Mode::Pipeline),
                churn: (i == 0).then(|| Duration::from_secs(12)),
            });
        }
    }

    /// A channel and a pattern (produced to through a channel it matches); neither churns.
    fn pubsub(&mut self) {
        for (name, produce_to, pattern) in [
            ("soak:channel:0", "soak:channel:0", false),
            ("soak:pattern:*", "soak:pattern:x", true),
        ] {
            let t = self.target(name.into(), Form::PubSub, produce_to.into(), false);
            let (channels, patterns) = if pattern {
                (vec![], vec![name.to_owned()])
            } else {
                (vec![name.to_owned()], vec![])
            };
            let source = proto::open::Source::Pubsub(proto::PubSubSource {
                channels,
                patterns,
                ..Default::default()
            });
            self.subs.push(Sub {
                label: name.into(),
                target: t,
                open: open_request(source, proto::Mode::Pipeline),
                churn: None,
            });
        }
    }
}
