//! What differs between the subscription forms in the campaign: the keys, the `Open`, how a
//! producer publishes, what names a delivered entry, its ordering key, and how the end state
//! is read back.
//!
//! Stream entries are known by their ids (a retry keeps the entry's id), list values and
//! pub/sub messages by their payload: the producer's number, which a retried copy keeps.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use tonic::transport::Channel;
use window_sidecar::domain::frame;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, Mode};
use window_sidecar::redis::companion_key;
use window_sidecar_harness::{duration, stream_open};

use crate::history::{Copied, EndState, Held, Place};

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
/// Ordering keys of the published entries: entry `n` has key `k<n mod 5>`. Few, so that they
/// collide within every read of 8 and across the workers.
const ORDERING_KEYS: u64 = 5;
/// Where an entry carries its ordering key: a stream entry's raw field, a list value's frame
/// header (each as the wire option names it).
const KEY: &str = "k";

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
}

impl Form {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Form::Stream => "stream",
            Form::ReliableList => "reliable-list",
            Form::SimpleList => "simple-list",
            Form::Pubsub => "pubsub",
        }
    }

    /// Whether the README promises at least once (the others are at most once: a crash loses
    /// what was in flight, and a pub/sub message published while nobody listens is gone).
    pub(crate) fn at_least_once(self) -> bool {
        matches!(self, Form::Stream | Form::ReliableList)
    }

    fn key(self) -> &'static str {
        match self {
            Form::Stream => STREAM,
            Form::ReliableList | Form::SimpleList => LIST,
            Form::Pubsub => CHANNEL,
        }
    }

    /// The delay set the form's retry_after writes: a stream's group's due times (members are
    /// entry ids, which stay pending meanwhile); a list's or a channel's set of encoded copies.
    pub(crate) fn delayed_key(self) -> String {
        match self {
            Form::Stream => companion_key(STREAM, &format!("window:delayed:{GROUP}")),
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
        matches!(self, Form::Stream | Form::ReliableList)
    }

    /// Worker `consumer`'s `Open`; `ordered`: by the entries' key (a form that can be).
    pub(crate) fn open(self, consumer: &str, atomic: bool, ordered: bool) -> proto::Open {
        let mut open = match self {
            Form::Stream => {
                let mut open = stream_open(STREAM, GROUP, consumer, 8);
                if let Some(proto::open::Source::Stream(s)) = &mut open.source {
                    s.min_idle = Some(duration(MIN_IDLE));
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
            let target = if self == Form::Stream {
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
                Form::Stream => proto::ordering_key::Source::Field(KEY.into()),
                _ => proto::ordering_key::Source::Header(KEY.into()),
            };
            open.ordering_key = Some(proto::OrderingKey {
                source: Some(source),
            });
            if self == Form::Stream {
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
            Form::Stream => d
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
            Form::Stream => {
                request.stream = STREAM.into();
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

    /// Entries still to be handed out or settled: pending in the group or the processing
    /// lists, unread, or waiting in the delay set.
    pub(crate) async fn unsettled(self, redis: &Client) -> Option<u64> {
        let delayed: u64 = redis.zcard(self.copies_delayed()).await.ok()?;
        let held = match self {
            Form::Stream => {
                let pending: Value = redis
                    .custom(fred::cmd!("XPENDING"), vec![STREAM, GROUP])
                    .await
                    .ok()?;
                let pending = match pending {
                    Value::Array(items) => items.first().and_then(Value::as_u64)?,
                    _ => return None,
                };
                let groups: Value = redis
                    .custom(fred::cmd!("XINFO"), vec!["GROUPS", STREAM])
                    .await
                    .ok()?;
                let stream: Value = redis
                    .custom(fred::cmd!("XINFO"), vec!["STREAM", STREAM])
                    .await
                    .ok()?;
                // Not XINFO's `lag`: a migrated or failed-over stream may carry an
                // entries-read count that no longer matches, and the lag is then wrong.
                let unread = field(&groups_of(&groups)?, "last-delivered-id")
                    != field(&stream, "last-generated-id");
                pending + u64::from(unread)
            }
            Form::ReliableList => {
                let mut held: u64 = redis.llen(LIST).await.ok()?;
                for list in processing_lists(redis).await? {
                    held += redis.llen::<u64, _>(list).await.ok()?;
                }
                held
            }
            Form::SimpleList => redis.llen(LIST).await.ok()?,
            Form::Pubsub => 0,
        };
        Some(held + delayed)
    }

    /// Where each entry Redis still holds sits: on the list, in the delay set with its due
    /// time, on a processing list, pending or unread in the group. For a pending anomaly's
    /// report: best effort, a read that fails leaves its part out.
    pub(crate) async fn locate(self, redis: &Client) -> Vec<Held> {
        let mut held = Vec::new();
        let at = |entry: String, place| Held { entry, place };
        match self {
            Form::Stream => {
                let pending: Value = redis
                    .custom(
                        fred::cmd!("XPENDING"),
                        vec![STREAM, GROUP, "-", "+", "1000"],
                    )
                    .await
                    .unwrap_or(Value::Null);
                if let Value::Array(rows) = pending {
                    for row in rows {
                        let Value::Array(row) = row else { continue };
                        let text = |i: usize| row.get(i).and_then(Value::as_string);
                        let number = |i: usize| row.get(i).and_then(Value::as_u64);
                        let place = Place::Pending {
                            consumer: text(1).unwrap_or_default(),
                            idle_ms: number(2).unwrap_or_default(),
                            deliveries: number(3).unwrap_or_default(),
                        };
                        held.push(at(text(0).unwrap_or_default(), place));
                    }
                }
                let groups: Value = redis
                    .custom(fred::cmd!("XINFO"), vec!["GROUPS", STREAM])
                    .await
                    .unwrap_or(Value::Null);
                let last = groups_of(&groups)
                    .and_then(|g| field(&g, "last-delivered-id"))
                    .and_then(|id| id.as_string());
                if let Some(last) = last {
                    let unread: Value = redis
                        .custom(
                            fred::cmd!("XRANGE"),
                            vec![STREAM.to_owned(), format!("({last}"), "+".into()],
                        )
                        .await
                        .unwrap_or(Value::Null);
                    if let Value::Array(entries) = unread {
                        for entry in entries {
                            if let Value::Array(entry) = entry
                                && let Some(id) = entry.first().and_then(Value::as_string)
                            {
                                held.push(at(id, Place::Unread));
                            }
                        }
                    }
                }
            }
            Form::ReliableList | Form::SimpleList => {
                let values: Vec<Bytes> = redis.lrange(LIST, 0, -1).await.unwrap_or_default();
                let len = values.len();
                for (i, value) in values.iter().enumerate() {
                    // Read from the right: the rightmost is read next.
                    let place = Place::List { ahead: len - 1 - i };
                    held.push(at(payload_of(value), place));
                }
                if self == Form::ReliableList {
                    for list in processing_lists(redis).await.unwrap_or_default() {
                        let values: Vec<Bytes> =
                            redis.lrange(&list, 0, -1).await.unwrap_or_default();
                        let prefix = companion_key(LIST, "window:processing:");
                        let consumer = list.strip_prefix(&prefix).unwrap_or(&list).to_owned();
                        for value in values.iter().rev() {
                            let place = Place::Processing {
                                consumer: consumer.clone(),
                            };
                            held.push(at(payload_of(value), place));
                        }
                    }
                }
            }
            Form::Pubsub => {}
        }
        let delayed: Vec<(Bytes, f64)> = redis
            .zrange(self.copies_delayed(), 0, -1, None, false, None, true)
            .await
            .unwrap_or_default();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        for (member, due_ms) in delayed {
            let place = Place::Delayed {
                due_in_ms: due_ms as i64 - now_ms,
            };
            held.push(at(self.delayed_entry(&member), place));
        }
        held
    }

    /// The entry a delay-set member carries: a stream copy names the id it was copied from (its
    /// token), a list value or a message is known by its payload.
    fn delayed_entry(self, member: &Bytes) -> String {
        let Some(newline) = member.iter().position(|b| *b == b'\n') else {
            return String::from_utf8_lossy(member).into_owned();
        };
        if self == Form::Stream {
            return String::from_utf8_lossy(&member[..newline]).into_owned();
        }
        // The parts, each `<length>:<bytes>`: a list's value, or a message's channel then
        // the message.
        let mut parts = Vec::new();
        let mut rest = &member[newline + 1..];
        while let Some(colon) = rest.iter().position(|b| *b == b':') {
            let len: usize = std::str::from_utf8(&rest[..colon])
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let end = (colon + 1 + len).min(rest.len());
            parts.push(member.slice_ref(&rest[colon + 1..end]));
            rest = &rest[end..];
        }
        parts
            .last()
            .map(payload_of)
            .unwrap_or_else(|| String::from_utf8_lossy(member).into_owned())
    }

    /// The state checked at the end. `published` are the numbers whose publish was answered
    /// (lists: each is a root of its own); `audited`, every stream entry the audit group read.
    pub(crate) async fn end_state(
        self,
        redis: &Client,
        published: &BTreeSet<u64>,
        audited: &[(String, Fields)],
    ) -> EndState {
        let kept: HashMap<String, i64> = redis.hgetall(KEPT).await.expect("HGETALL kept");
        let discarded: HashMap<String, i64> =
            redis.hgetall(DISCARDED).await.expect("HGETALL discarded");
        let mut end = EndState {
            kept_effects: kept,
            discarded_effects: discarded,
            pending: self.unsettled(redis).await.expect("the unsettled count"),
            ..EndState::default()
        };
        if end.pending != 0 {
            end.held = self.locate(redis).await;
        }
        match self {
            Form::Stream => {
                type Entries = Vec<(String, Fields)>;
                // Retention deletes what both groups acknowledged: every entry the stream held
                // is what the audit group read, and what is still there.
                let mut all: BTreeMap<String, Fields> = audited.iter().cloned().collect();
                let entries: Entries = redis.xrange(STREAM, "-", "+", None).await.expect("XRANGE");
                for (id, fields) in entries {
                    all.entry(id).or_insert(fields);
                }
                let numbers: BTreeSet<u64> = all
                    .values()
                    .filter_map(|f| f.get("n")?.parse().ok())
                    .collect();
                end.unread_by_every_group = published.difference(&numbers).copied().collect();
                let lineage = Lineage::of(&all);
                end.audit_pending = pending_entries(redis, AUDIT_GROUP).await;
                let dead: Entries = redis.xrange(DEAD, "-", "+", None).await.expect("XRANGE");
                end.dead_letters = dead
                    .into_iter()
                    .map(|(_, fields)| {
                        let of = |k: &str| fields.get(k).cloned().unwrap_or_default();
                        (
                            lineage.dead_letter_of(&fields),
                            of("h:x-window-deliveries").parse().unwrap_or(0),
                        )
                    })
                    .collect();
                // A redriven dead letter is no longer there, but it was one.
                end.dead_letters.extend(lineage.redriven_dead_letters());
                end.redriven_twice = lineage.twice;
                // Every entry is a root: a retry keeps its id, a redrive's fresh entry starts
                // a generation of its own.
                end.entries = all.into_keys().collect();
            }
            Form::ReliableList | Form::SimpleList | Form::Pubsub => {
                let dead: Vec<Bytes> = if self == Form::Pubsub {
                    Vec::new()
                } else {
                    redis.lrange(DEAD, 0, -1).await.expect("LRANGE dead")
                };
                end.dead_letters = dead
                    .iter()
                    .map(|value| {
                        let fields = frame::decode(value).unwrap_or_default();
                        let of = |k: &str| {
                            fields
                                .iter()
                                .find(|(name, _)| name.as_ref() == k.as_bytes())
                                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                                .unwrap_or_default()
                        };
                        (
                            of("_payload"),
                            of("h:x-window-deliveries").parse().unwrap_or(0),
                        )
                    })
                    .collect();
                // A value is its own root; every number published or seen anywhere is one.
                let mut roots: BTreeSet<String> = published.iter().map(u64::to_string).collect();
                roots.extend(end.kept_effects.keys().cloned());
                roots.extend(end.discarded_effects.keys().cloned());
                roots.extend(end.dead_letters.iter().map(|(n, _)| n.clone()));
                end.entries = roots.into_iter().collect();
            }
        }
        end
    }
}

/// A list value or message as the history names it: the payload of a frame, else the value.
fn payload_of(value: &Bytes) -> String {
    frame::decode(value)
        .and_then(|fields| {
            fields
                .into_iter()
                .find(|(name, _)| name.as_ref() == b"_payload")
                .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
        })
        .unwrap_or_else(|| String::from_utf8_lossy(value).into_owned())
}

/// The numbers delivered in a history that are not roots yet (a list value published by a
/// call that was never answered, then delivered).
pub(crate) fn add_delivered_roots(end: &mut EndState, delivered: impl Iterator<Item = String>) {
    let known: BTreeSet<String> = end.entries.iter().cloned().collect();
    let new: BTreeSet<String> = delivered.filter(|n| !known.contains(n)).collect();
    end.entries.extend(new);
}

/// Group `group`'s pending entries on the stream: each entry's id, consumer and deliveries
/// (the first 1,000; none when Redis does not answer).
async fn pending_entries(redis: &Client, group: &str) -> Vec<(String, String, u64)> {
    let reply: Value = redis
        .custom(
            fred::cmd!("XPENDING"),
            vec![STREAM, group, "-", "+", "1000"],
        )
        .await
        .unwrap_or(Value::Null);
    let Value::Array(rows) = reply else {
        return Vec::new();
    };
    rows.into_iter()
        .filter_map(|row| {
            let Value::Array(row) = row else { return None };
            Some((
                row.first()?.as_string()?,
                row.get(1)?.as_string()?,
                row.get(3)?.as_u64()?,
            ))
        })
        .collect()
}

/// Every consumer's processing list of the reliable list.
async fn processing_lists(redis: &Client) -> Option<Vec<String>> {
    let pattern = companion_key(LIST, "window:processing:*");
    let reply: Value = redis.custom(fred::cmd!("KEYS"), vec![pattern]).await.ok()?;
    match reply {
        Value::Array(keys) => Some(keys.iter().filter_map(Value::as_string).collect()),
        _ => None,
    }
}

/// The campaign's group in XINFO GROUPS.
fn groups_of(groups: &Value) -> Option<Value> {
    let Value::Array(groups) = groups else {
        return None;
    };
    groups
        .iter()
        .find(|group| field(group, "name").and_then(|n| n.as_string()).as_deref() == Some(GROUP))
        .cloned()
}

/// A field of an XINFO reply (a flat list of names and values).
fn field(reply: &Value, name: &str) -> Option<Value> {
    let Value::Array(fields) = reply else {
        return None;
    };
    fields.chunks(2).find_map(|pair| match pair {
        [k, v] if k.as_str().as_deref() == Some(name) => Some(v.clone()),
        _ => None,
    })
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

/// The generations of a stream's entries through redrives that wrote fresh entries.
///
/// A redrive puts a dead letter back into its own group with its id when the entry is still in
/// the stream. When it was trimmed, a redrive may write a fresh entry instead: a generation of
/// its own, a root for the checker (its counts start again), known by the root it came from
/// and how many times it was redriven (`x-window-redriven`), which its dead letters carry
/// along. (Retried copies, which the previous version wrote, are not linked to anything: a
/// retry keeps its entry's id, and the audit group reports a copy.)
#[derive(Debug, Default)]
pub(crate) struct Lineage {
    /// The first entry of each generation, by (root, times redriven).
    generations: HashMap<(String, u32), String>,
    /// Generations with more than one first entry: a dead letter redriven twice.
    pub twice: Vec<(String, u32)>,
}

fn redriven_times(fields: &Fields) -> u32 {
    fields
        .get(REDRIVEN)
        .and_then(|v| v.split(';').next()?.parse().ok())
        .unwrap_or(0)
}

impl Lineage {
    pub(crate) fn of(all: &BTreeMap<String, Fields>) -> Self {
        let mut lineage = Lineage::default();
        for (id, fields) in all {
            let times = redriven_times(fields);
            if times > 0 && !fields.contains_key(ATTEMPTS) {
                let root = fields
                    .get(ORIGINAL_ID)
                    .cloned()
                    .unwrap_or_else(|| id.clone());
                if lineage
                    .generations
                    .insert((root.clone(), times), id.clone())
                    .is_some()
                {
                    lineage.twice.push((root, times));
                }
            }
        }
        lineage
    }

    /// What a dead letter is a dead letter of: its generation's first entry, or the entry it
    /// names.
    pub(crate) fn dead_letter_of(&self, fields: &Fields) -> String {
        let root = fields.get(ORIGINAL_ID).cloned().unwrap_or_default();
        match redriven_times(fields) {
            0 => root,
            times => self
                .generations
                .get(&(root.clone(), times))
                .cloned()
                .unwrap_or(root),
        }
    }

    /// The dead letters the redrives that wrote fresh entries consumed: one for the generation
    /// before each generation.
    pub(crate) fn redriven_dead_letters(&self) -> Vec<(String, u32)> {
        self.generations
            .keys()
            .map(|(root, times)| {
                let before = match times - 1 {
                    0 => root.clone(),
                    earlier => self
                        .generations
                        .get(&(root.clone(), earlier))
                        .cloned()
                        .unwrap_or_else(|| root.clone()),
                };
                (before, MAX_DELIVERIES)
            })
            .collect()
    }
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
    fn a_redriven_dead_letter_written_fresh_starts_a_generation_of_its_own() {
        let all: BTreeMap<String, Fields> = [
            ("1-0", fields(&[("n", "1")])),
            // 1-0's dead letter, redriven as a fresh entry (1-0 was trimmed).
            (
                "5-0",
                fields(&[("n", "1"), (ORIGINAL_ID, "1-0"), (REDRIVEN, "1;9")]),
            ),
        ]
        .into_iter()
        .map(|(id, f)| (id.to_owned(), f))
        .collect();
        let lineage = Lineage::of(&all);
        // A dead letter of the second generation belongs to it; the redrive consumed one of
        // the first.
        let dead = fields(&[(ORIGINAL_ID, "1-0"), (REDRIVEN, "1;9")]);
        assert_eq!(lineage.dead_letter_of(&dead), "5-0");
        let first = fields(&[(ORIGINAL_ID, "1-0")]);
        assert_eq!(lineage.dead_letter_of(&first), "1-0");
        assert_eq!(
            lineage.redriven_dead_letters(),
            vec![("1-0".to_owned(), MAX_DELIVERIES)]
        );
        assert!(lineage.twice.is_empty());

        let mut doubled = all;
        doubled.insert(
            "7-0".into(),
            fields(&[("n", "1"), (ORIGINAL_ID, "1-0"), (REDRIVEN, "1;10")]),
        );
        assert_eq!(Lineage::of(&doubled).twice, vec![("1-0".to_owned(), 1)]);
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

    use window_sidecar::redis::delay;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn a_delay_set_member_names_the_entry_the_history_knows() {
        // A stream copy (the previous version's set): the id it was copied from is the
        // member's token.
        let member = delay::encode(
            b"17-0",
            [b("n"), b("4711"), b("h:x-window-attempts"), b("2")],
        );
        assert_eq!(Form::Stream.delayed_entry(&member), "17-0");
        // A raw list value, and one in a frame (a retried copy carries its count in headers).
        let member = delay::encode(&delay::unique_token(), [b("4711")]);
        assert_eq!(Form::SimpleList.delayed_entry(&member), "4711");
        let framed = frame::encode(&[
            (b("_payload"), b("4712")),
            (b("h:x-window-attempts"), b("1")),
        ]);
        let member = delay::encode(&delay::unique_token(), [framed]);
        assert_eq!(Form::ReliableList.delayed_entry(&member), "4712");
        // A message: its channel, then the message.
        let member = delay::encode(&delay::unique_token(), [b(CHANNEL), b("4713")]);
        assert_eq!(Form::Pubsub.delayed_entry(&member), "4713");
    }
}
