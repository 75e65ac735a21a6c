//! What differs between the subscription forms in the campaign: the keys, the `Open`, how a
//! producer publishes, what names a delivered entry, its ordering key, and how the end state
//! is read back ([`end_state`]).
//!
//! Stream entries are known by their ids (a retry keeps the entry's id), a partitioned
//! stream's as `<partition>/<id>` (each partition is a stream of its own, and two may give an
//! entry the same id), list values and pub/sub messages by their payload: the producer's
//! number, which a retried copy keeps.

pub(crate) mod end_state;

use std::collections::HashMap;
use std::time::Duration;

use tonic::transport::Channel;
use window_sidecar::partition;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, Mode};
use window_sidecar::redis::companion_key;
use window_sidecar_harness::{duration, stream_open};

use crate::history::Copied;

/// Every key shares one hash tag, so that on a cluster they live in one slot: an atomic
/// transaction may write the side effects with the settle.
pub(crate) const STREAM: &str = "{chaos}:orders";
pub(crate) const LIST: &str = "{chaos}:jobs";
pub(crate) const CHANNEL: &str = "{chaos}:events";
pub(crate) const GROUP: &str = "chaos";
/// A second group on the stream, read by the campaign itself behind the workers: retention may
/// delete an entry only once both groups acknowledged it, and this group's reads are the
/// record of every entry the stream held.
pub(crate) const AUDIT_GROUP: &str = "audit";
/// The audit group's one consumer.
pub(crate) const AUDIT_READER: &str = "a";
pub(crate) const DEAD: &str = "{chaos}:dead";
pub(crate) const KEPT: &str = "{chaos}:kept";
pub(crate) const DISCARDED: &str = "{chaos}:discarded";
pub(crate) const MAX_DELIVERIES: u32 = 5;
/// Below the slow handler's time: a slow ack races another consumer's reclaim.
/// Above every fault's length (a pause, a sidecar down), so that only slow handling passes it.
pub(crate) const MIN_IDLE: Duration = Duration::from_secs(4);
/// A reliable-list consumer whose sidecar died is given up after this.
const DEAD_AFTER: Duration = Duration::from_secs(3);
/// The partitions of the partitioned form's stream: more than the sidecars, so that each reads
/// several and a hand-over moves some while others keep going.
pub(crate) const PARTITIONS: u32 = 4;
/// Ordering keys of the published entries: entry `n` has key `k<n mod 5>`. Few, so that they
/// collide within every read of 8 and across the workers.
const ORDERING_KEYS: u64 = 5;
/// Where an entry carries its ordering key: a stream entry's raw field, a list value's frame
/// header (each as the wire option names it).
pub(crate) const KEY: &str = "k";

/// The ordering key of entry `n`.
fn key_of(n: u64) -> String {
    format!("k{}", n % ORDERING_KEYS)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Form {
    Stream,
    ReliableList,
    SimpleList,
    Pubsub,
    /// The stream split into [`PARTITIONS`] partitions, every worker an ordered replica of
    /// the group: per-key order holds across the workers.
    Partitioned,
}

impl Form {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Form::Stream => "stream",
            Form::ReliableList => "reliable-list",
            Form::SimpleList => "simple-list",
            Form::Pubsub => "pubsub",
            Form::Partitioned => "partitioned",
        }
    }

    /// Whether the README promises at least once (the others are at most once: a crash loses
    /// what was in flight, and a pub/sub message published while nobody listens is gone).
    pub(crate) fn at_least_once(self) -> bool {
        matches!(self, Form::Stream | Form::ReliableList | Form::Partitioned)
    }

    /// Whether it reads streams (known by ids, with an audit group and stream dead letters).
    pub(crate) fn streams(self) -> bool {
        matches!(self, Form::Stream | Form::Partitioned)
    }

    /// The stream keys it reads: the stream, or each partition's.
    pub(crate) fn stream_keys(self) -> Vec<String> {
        match self {
            Form::Partitioned => (0..PARTITIONS)
                .map(|p| partition::stream_key(STREAM, p))
                .collect(),
            _ => vec![STREAM.to_owned()],
        }
    }

    fn key(self) -> &'static str {
        match self {
            Form::Stream | Form::Partitioned => STREAM,
            Form::ReliableList | Form::SimpleList => LIST,
            Form::Pubsub => CHANNEL,
        }
    }

    /// The delay set the form's retry_after writes: a stream's group's due times (members are
    /// entry ids, which stay pending meanwhile); a list's or a channel's set of encoded copies.
    pub(crate) fn delayed_key(self) -> String {
        match self {
            Form::Stream => companion_key(STREAM, &format!("window:delayed:{GROUP}")),
            // The first partition's: a refusal of one partition's set is as good a fault.
            Form::Partitioned => companion_key(
                &partition::stream_key(STREAM, 0),
                &format!("window:delayed:{GROUP}"),
            ),
            _ => self.copies_delayed(),
        }
    }

    /// The delay set of encoded copies, which holds entries until they are due: a list's or a
    /// channel's, and a stream's from the previous version (still promoted). A stream group's
    /// due times hold nothing: their entries are pending in the group, and a member may stay a
    /// minute past its due time.
    fn copies_delayed(self) -> String {
        companion_key(self.key(), "window:delayed")
    }

    /// The delivery cap of the form (pub/sub has none).
    pub(crate) fn max_deliveries(self) -> Option<u32> {
        (self != Form::Pubsub).then_some(MAX_DELIVERIES)
    }

    /// Whether its subscriptions can be ordered by key (a simple list's or a channel's entries
    /// leave Redis when read: a retry could not keep its place).
    pub(crate) fn can_order(self) -> bool {
        matches!(self, Form::Stream | Form::ReliableList | Form::Partitioned)
    }

    /// Whether worker `id`'s subscription is ordered: a partitioned stream's always (every
    /// subscription of its group must open it alike), else as the run says.
    pub(crate) fn ordered(self, run_ordered: crate::plan::Ordered, id: u32) -> bool {
        self == Form::Partitioned || (self.can_order() && run_ordered.worker(id))
    }

    /// Worker `consumer`'s `Open`; `ordered`: by the entries' key (a form that can be).
    pub(crate) fn open(self, consumer: &str, atomic: bool, ordered: bool) -> proto::Open {
        let mut open = match self {
            Form::Stream | Form::Partitioned => {
                let mut open = stream_open(STREAM, GROUP, consumer, 8);
                if let Some(proto::open::Source::Stream(s)) = &mut open.source {
                    s.min_idle = Some(duration(MIN_IDLE));
                    if self == Form::Partitioned {
                        s.partitions = PARTITIONS;
                    }
                }
                open
            }
            Form::ReliableList => proto::Open {
                source: Some(proto::open::Source::ReliableList(
                    proto::ReliableListSource {
                        key: LIST.into(),
                        consumer: consumer.into(),
                        dead_after: Some(duration(DEAD_AFTER)),
                    },
                )),
                count: 8,
                ..Default::default()
            },
            Form::SimpleList => proto::Open {
                source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
                    key: LIST.into(),
                })),
                count: 8,
                ..Default::default()
            },
            Form::Pubsub => proto::Open {
                source: Some(proto::open::Source::Pubsub(proto::PubSubSource {
                    channels: vec![CHANNEL.into()],
                    ..Default::default()
                })),
                count: 8,
                ..Default::default()
            },
        };
        if let Some(cap) = self.max_deliveries() {
            open.max_deliveries = cap;
            let target = if self.streams() {
                proto::dead_letter::Target::Stream(DEAD.into())
            } else {
                proto::dead_letter::Target::List(DEAD.into())
            };
            open.dead_letter = Some(proto::DeadLetter {
                target: Some(target),
            });
        }
        if atomic {
            open.mode = Mode::Atomic as i32;
        }
        if ordered && self.can_order() {
            let source = match self {
                Form::Stream | Form::Partitioned => proto::ordering_key::Source::Field(KEY.into()),
                _ => proto::ordering_key::Source::Header(KEY.into()),
            };
            open.ordering_key = Some(proto::OrderingKey {
                source: Some(source),
            });
            if self.streams() {
                // A window of one read: a key's entries soon pass the bound of those waiting
                // in memory, so parking them and fetching them back by id runs through the
                // faults too.
                open.max_in_flight = 8;
            }
        }
        open
    }

    /// A delivery's ordering key, where the producer wrote it.
    pub(crate) fn ordering_key(self, d: &proto::Delivery) -> Option<String> {
        match self {
            Form::Stream | Form::Partitioned => d
                .fields
                .iter()
                .find(|f| f.name.as_ref() == KEY.as_bytes())
                .map(|f| String::from_utf8_lossy(&f.value).into_owned()),
            Form::ReliableList => d.headers.get(KEY).cloned(),
            Form::SimpleList | Form::Pubsub => None,
        }
    }

    /// What names a delivered entry in the history and in the side-effect hashes.
    pub(crate) fn identity(self, d: &proto::Delivery) -> String {
        match self {
            Form::Stream => d.entry_id.clone(),
            Form::Partitioned => {
                in_partition(self.ordering_key(d).as_deref().unwrap_or(""), &d.entry_id)
            }
            _ => String::from_utf8_lossy(&d.payload).into_owned(),
        }
    }

    /// Publishes entry `n`; `Ok(true)` when Redis certainly has it (for a channel: somebody
    /// received it).
    pub(crate) async fn publish(
        self,
        client: &mut WindowServiceClient<Channel>,
        n: u64,
    ) -> Result<bool, tonic::Status> {
        let mut request = proto::PublishRequest::default();
        let mut entry = proto::PublishEntry::default();
        match self {
            Form::Stream | Form::Partitioned => {
                request.stream = STREAM.into();
                if self == Form::Partitioned {
                    request.partitions = PARTITIONS;
                    request.partition_by = Some(proto::OrderingKey {
                        source: Some(proto::ordering_key::Source::Field(KEY.into())),
                    });
                }
                entry.fields.push(proto::Field {
                    name: "n".into(),
                    value: n.to_string().into(),
                });
                entry.fields.push(proto::Field {
                    name: KEY.into(),
                    value: key_of(n).into(),
                });
            }
            Form::ReliableList | Form::SimpleList => {
                request.list = LIST.into();
                entry.payload = n.to_string().into();
                if self == Form::ReliableList {
                    entry.headers.insert(KEY.into(), key_of(n));
                }
            }
            Form::Pubsub => {
                request.channel = CHANNEL.into();
                entry.payload = n.to_string().into();
            }
        }
        request.entries.push(entry);
        let response = client.publish(request).await?.into_inner();
        Ok(match self {
            Form::Pubsub => response.receivers.first().copied().unwrap_or(0) > 0,
            _ => true,
        })
    }
}

/// How the history names entry `id` of the partition that ordering key `key` goes to:
/// `<partition>/<id>`. Partitions are streams of their own, and two of them may give an entry
/// the same id.
pub(crate) fn in_partition(key: &str, id: &str) -> String {
    format!("{}/{id}", partition::of_key(key.as_bytes(), PARTITIONS))
}

/// A partition's entry's fields as the history knows them: the id a copy names as its
/// original is qualified with the partition (of the entry's key, which a copy carries along).
pub(crate) fn qualified(mut fields: Fields) -> Fields {
    let key = fields.get(KEY).cloned().unwrap_or_default();
    if let Some(of) = fields.get_mut(ORIGINAL_ID) {
        *of = in_partition(&key, of);
    }
    fields
}

/// A stream entry's fields by name.
pub(crate) type Fields = HashMap<String, String>;

/// The header a redrive writes on its copy: `<times redriven>;<unix ms>`.
const REDRIVEN: &str = "h:x-window-redriven";
pub(crate) const ORIGINAL_ID: &str = "h:x-window-original-id";
const ATTEMPTS: &str = "h:x-window-attempts";

/// The copy a stream entry is, from its fields: the id it names as its original and its
/// `h:x-window-*` fields; None for an entry a producer published.
pub(crate) fn copied(fields: &Fields) -> Option<Copied> {
    let of = fields.get(ORIGINAL_ID)?.clone();
    let mut marks: Vec<String> = fields
        .iter()
        .filter(|(k, _)| k.starts_with("h:x-window-") && k.as_str() != ORIGINAL_ID)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    marks.sort();
    Some(Copied {
        of,
        marks: marks.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_copy_is_told_by_its_original_id_with_its_marks() {
        assert_eq!(copied(&fields(&[("n", "1"), ("k", "k1")])), None);
        let copy = fields(&[
            ("n", "1"),
            (ORIGINAL_ID, "1-0"),
            (ATTEMPTS, "2"),
            ("h:x-ruststream-retry-count", "2"),
        ]);
        assert_eq!(
            copied(&copy),
            Some(Copied {
                of: "1-0".into(),
                marks: "h:x-window-attempts 2".into()
            })
        );
    }
}
