//! What Redis holds once a run has quiesced, read back per form for the checker: the side
//! effects that ran, the dead letters, every entry the stream held (with the audit group's
//! record of what retention deleted) or every value seen, what is still unsettled and where it
//! sits; and the generations a redrive's fresh entries start.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use fred::prelude::*;
use window_sidecar::domain::frame;
use window_sidecar::redis::companion_key;

use super::{
    ATTEMPTS, AUDIT_GROUP, DEAD, DISCARDED, Fields, Form, GROUP, KEPT, LIST, MAX_DELIVERIES,
    ORIGINAL_ID, REDRIVEN,
};
use crate::history::{EndState, Held, Place};

impl Form {
    /// Entries still to be handed out or settled: pending in the group or the processing
    /// lists, unread, or waiting in the delay set.
    pub(crate) async fn unsettled(self, redis: &Client) -> Option<u64> {
        let delayed: u64 = redis.zcard(self.copies_delayed()).await.ok()?;
        let held = match self {
            Form::Stream | Form::Partitioned => {
                let mut held = 0;
                for stream in self.stream_keys() {
                    held += stream_unsettled(redis, &stream).await?;
                }
                held
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
        let mut held = match self {
            Form::Stream | Form::Partitioned => {
                let mut held = Vec::new();
                for (p, stream) in self.stream_keys().iter().enumerate() {
                    let name = |id: String| self.entry_name(p, id);
                    held.extend(held_in_stream(redis, stream, name).await);
                }
                held
            }
            Form::ReliableList | Form::SimpleList => self.held_on_lists(redis).await,
            Form::Pubsub => Vec::new(),
        };
        held.extend(self.held_delayed(redis).await);
        held
    }

    /// The values on the list, each with how many are read before it, then (a reliable list)
    /// those on each consumer's processing list.
    async fn held_on_lists(self, redis: &Client) -> Vec<Held> {
        let mut held = Vec::new();
        let at = |entry: String, place| Held { entry, place };
        let values: Vec<Bytes> = redis.lrange(LIST, 0, -1).await.unwrap_or_default();
        let len = values.len();
        for (i, value) in values.iter().enumerate() {
            // Read from the right: the rightmost is read next.
            let place = Place::List { ahead: len - 1 - i };
            held.push(at(payload_of(value), place));
        }
        if self == Form::ReliableList {
            for list in processing_lists(redis).await.unwrap_or_default() {
                let values: Vec<Bytes> = redis.lrange(&list, 0, -1).await.unwrap_or_default();
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
        held
    }

    /// The entries in the delay set of copies, each with when it is due.
    async fn held_delayed(self, redis: &Client) -> Vec<Held> {
        let delayed: Vec<(Bytes, f64)> = redis
            .zrange(self.copies_delayed(), 0, -1, None, false, None, true)
            .await
            .unwrap_or_default();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        delayed
            .into_iter()
            .map(|(member, due_ms)| Held {
                entry: self.delayed_entry(&member),
                place: Place::Delayed {
                    due_in_ms: due_ms as i64 - now_ms,
                },
            })
            .collect()
    }

    /// The entry a delay-set member carries: a stream copy names the id it was copied from (its
    /// token), a list value or a message is known by its payload.
    fn delayed_entry(self, member: &Bytes) -> String {
        let Some(newline) = member.iter().position(|b| *b == b'\n') else {
            return String::from_utf8_lossy(member).into_owned();
        };
        if self.streams() {
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
            Form::Stream | Form::Partitioned => {
                self.stream_end_state(&mut end, redis, published, audited)
                    .await;
            }
            Form::ReliableList | Form::SimpleList | Form::Pubsub => {
                self.values_end_state(&mut end, redis, published).await;
            }
        }
        end
    }

    /// A list's or a channel's part of the end state: the dead letters, by the value they
    /// carry, and the roots, every value published or seen anywhere.
    async fn values_end_state(self, end: &mut EndState, redis: &Client, published: &BTreeSet<u64>) {
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

impl Form {
    /// The stream's part of the end state: every entry it held (the audit group's record of what
    /// retention deleted, and what is still there), the published numbers no group read, the
    /// audit group's pending entries, and the dead letters with the generations redrives started.
    async fn stream_end_state(
        self,
        end: &mut EndState,
        redis: &Client,
        published: &BTreeSet<u64>,
        audited: &[(String, Fields)],
    ) {
        type Entries = Vec<(String, Fields)>;
        // Retention deletes what both groups acknowledged: every entry the stream held
        // is what the audit group read, and what is still there.
        let mut all: BTreeMap<String, Fields> = audited.iter().cloned().collect();
        for (p, stream) in self.stream_keys().iter().enumerate() {
            let entries: Entries = redis.xrange(stream, "-", "+", None).await.expect("XRANGE");
            for (id, fields) in entries {
                all.entry(self.entry_name(p, id))
                    .or_insert_with(|| self.fields_named(fields));
            }
        }
        let numbers: BTreeSet<u64> = all
            .values()
            .filter_map(|f| f.get("n")?.parse().ok())
            .collect();
        end.unread_by_every_group = published.difference(&numbers).copied().collect();
        let lineage = Lineage::of(&all);
        for (p, stream) in self.stream_keys().iter().enumerate() {
            let pending = pending_entries(redis, stream, AUDIT_GROUP).await;
            end.audit_pending.extend(
                pending
                    .into_iter()
                    .map(|(id, consumer, n)| (self.entry_name(p, id), consumer, n)),
            );
        }
        let dead: Entries = redis.xrange(DEAD, "-", "+", None).await.expect("XRANGE");
        end.dead_letters = dead
            .into_iter()
            .map(|(_, fields)| {
                let fields = self.fields_named(fields);
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

    /// How the history names entry `id` of the form's stream number `p` (of
    /// [`Form::stream_keys`]).
    fn entry_name(self, p: usize, id: String) -> String {
        match self {
            Form::Partitioned => format!("{p}/{id}"),
            _ => id,
        }
    }

    /// An entry's fields as the history knows them (see [`super::qualified`]).
    fn fields_named(self, fields: Fields) -> Fields {
        match self {
            Form::Partitioned => super::qualified(fields),
            _ => fields,
        }
    }
}

/// A stream's entries pending in the workers' group, and one more if some are unread.
async fn stream_unsettled(redis: &Client, stream: &str) -> Option<u64> {
    let pending: Value = redis
        .custom(fred::cmd!("XPENDING"), vec![stream, GROUP])
        .await
        .ok()?;
    let pending = match pending {
        Value::Array(items) => items.first().and_then(Value::as_u64)?,
        _ => return None,
    };
    let groups: Value = redis
        .custom(fred::cmd!("XINFO"), vec!["GROUPS", stream])
        .await
        .ok()?;
    let stream: Value = redis
        .custom(fred::cmd!("XINFO"), vec!["STREAM", stream])
        .await
        .ok()?;
    // Not XINFO's `lag`: a migrated or failed-over stream may carry an
    // entries-read count that no longer matches, and the lag is then wrong.
    let unread =
        field(&groups_of(&groups)?, "last-delivered-id") != field(&stream, "last-generated-id");
    Some(pending + u64::from(unread))
}

/// The entries pending in the workers' group, with their consumer, idle time and deliveries,
/// and those after the group's last-delivered id.
async fn held_in_stream(
    redis: &Client,
    stream: &str,
    name: impl Fn(String) -> String,
) -> Vec<Held> {
    let mut held = Vec::new();
    let at = |entry: String, place| Held { entry, place };
    let pending: Value = redis
        .custom(
            fred::cmd!("XPENDING"),
            vec![stream, GROUP, "-", "+", "1000"],
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
            held.push(at(name(text(0).unwrap_or_default()), place));
        }
    }
    let groups: Value = redis
        .custom(fred::cmd!("XINFO"), vec!["GROUPS", stream])
        .await
        .unwrap_or(Value::Null);
    let last = groups_of(&groups)
        .and_then(|g| field(&g, "last-delivered-id"))
        .and_then(|id| id.as_string());
    if let Some(last) = last {
        let unread: Value = redis
            .custom(
                fred::cmd!("XRANGE"),
                vec![stream.to_owned(), format!("({last}"), "+".into()],
            )
            .await
            .unwrap_or(Value::Null);
        if let Value::Array(entries) = unread {
            for entry in entries {
                if let Value::Array(entry) = entry
                    && let Some(id) = entry.first().and_then(Value::as_string)
                {
                    held.push(at(name(id), Place::Unread));
                }
            }
        }
    }
    held
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

/// Group `group`'s pending entries on `stream`: each entry's id, consumer and deliveries
/// (the first 1,000; none when Redis does not answer).
async fn pending_entries(redis: &Client, stream: &str, group: &str) -> Vec<(String, String, u64)> {
    let reply: Value = redis
        .custom(
            fred::cmd!("XPENDING"),
            vec![stream, group, "-", "+", "1000"],
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
    use bytes::Bytes;
    use window_sidecar::domain::frame;

    use crate::form::CHANNEL;

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
