//! The list forms. A reliable list moves each entry it reads to the consumer's own processing
//! list and settles it with `LREM <processing> 1 <value>`; entries stranded on the processing
//! list of a dead consumer (its heartbeat key expired) are moved back, one atomic LMOVE each.
//! A simple list pops (at most once). Producers LPUSH; reads take from the right (FIFO).
//!
//! Delivery counts of list values live in a hash beside the list (`{key}:window:deliveries`,
//! value -> earlier deliveries), written only when an entry is retried or recovered and removed
//! when it is settled for good; identical values share a count. A value in ruststream-fred's
//! frame carries its earlier copies' count in its headers instead, as a stream entry does: its
//! retried copies are new frames with the count raised (the hash forgets the old value), its
//! delivery count is the headers' count plus the hash's, and every dead letter is a frame that
//! says where it came from, how often it was delivered and why.
//!
//! Here, its names in Redis ([`ListKeys`]) and how a value becomes an entry; [`read`] how it
//! reads, recovers and gives back; [`settle`] its part of a flush plan; `inspect` what it asks
//! of a list without reading it.

use bytes::Bytes;

use super::companion_key;
use super::flush::{FlushPlan, Role};
use crate::domain::{Entry, Framing, ListSource, frame};

/// The Redis names a list subscription uses; all share the list's hash slot.
#[derive(Clone, Debug)]
pub struct ListKeys {
    pub key: Bytes,
    pub reliable: bool,
    pub processing: Bytes,
    /// The prefix of every consumer's processing list.
    processing_prefix: String,
    pub counts: Bytes,
    pub heartbeat: Bytes,
    heartbeat_prefix: String,
    /// The set of consumers that have a processing list.
    pub consumers: Bytes,
    pub consumer: Bytes,
    pub delayed: Bytes,
    pub slot: u16,
    pub dead_letter: Option<Bytes>,
    pub framing: Framing,
}

impl ListKeys {
    pub fn new(source: &ListSource) -> Self {
        let processing_prefix = companion_key(&source.key, "window:processing:");
        let heartbeat_prefix = companion_key(&source.key, "window:heartbeat:");
        Self {
            key: Bytes::copy_from_slice(source.key.as_bytes()),
            reliable: source.reliable,
            processing: Bytes::from(format!("{processing_prefix}{}", source.consumer)),
            counts: Bytes::from(companion_key(&source.key, "window:deliveries")),
            heartbeat: Bytes::from(format!("{heartbeat_prefix}{}", source.consumer)),
            consumers: Bytes::from(companion_key(&source.key, "window:consumers")),
            consumer: Bytes::copy_from_slice(source.consumer.as_bytes()),
            delayed: Bytes::from(companion_key(&source.key, "window:delayed")),
            slot: fred::util::redis_keyslot(source.key.as_bytes()),
            dead_letter: None,
            framing: source.framing,
            processing_prefix,
            heartbeat_prefix,
        }
    }

    /// The keys that must share the list's slot on a cluster, with their names.
    pub fn companions(&self) -> Vec<&Bytes> {
        vec![
            &self.processing,
            &self.counts,
            &self.heartbeat,
            &self.consumers,
            &self.delayed,
        ]
    }

    fn processing_of(&self, consumer: &[u8]) -> Bytes {
        let mut key = self.processing_prefix.clone().into_bytes();
        key.extend_from_slice(consumer);
        Bytes::from(key)
    }

    fn heartbeat_of(&self, consumer: &[u8]) -> Bytes {
        let mut key = self.heartbeat_prefix.clone().into_bytes();
        key.extend_from_slice(consumer);
        Bytes::from(key)
    }

    /// Bookkeeping after a settle for good: forget the delivery counts of retried values.
    fn forget_counts(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        let mut args = vec![self.counts.clone()];
        args.extend(
            entries
                .iter()
                .filter(|e| e.delivery_count > 1)
                .map(|e| value(e).clone()),
        );
        if args.len() > 1 {
            plan.push("HDEL", args, Role::Bookkeeping, Some(self.slot));
        }
    }

    /// The value a retry puts back: a framed value becomes a new frame that carries the count,
    /// a raw value goes back as it is.
    fn copy(&self, entry: &Entry, reason: Option<&str>) -> Bytes {
        if entry.stored.is_empty() {
            value(entry).clone()
        } else {
            frame::encode(&entry.retry_fields(reason))
        }
    }

    /// The count's bookkeeping after a retry: the hash remembers a raw value's count, and
    /// forgets a framed one's (its copy carries it).
    fn recount(&self, entry: &Entry, plan: &mut FlushPlan) {
        let mut args = vec![self.counts.clone(), value(entry).clone()];
        if entry.stored.is_empty() {
            args.push(Bytes::from(entry.delivery_count.to_string()));
            plan.push("HSET", args, Role::Bookkeeping, Some(self.slot));
        } else {
            plan.push("HDEL", args, Role::Bookkeeping, Some(self.slot));
        }
    }

    /// The subscription a dead letter names.
    pub(crate) fn subscription(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

/// The list value an entry carries, as stored.
pub(crate) fn value(entry: &Entry) -> &Bytes {
    entry.value()
}

/// A list value as an entry, with the deliveries the hash counted before this one.
pub(super) fn entry(value: Bytes, earlier: u32, framing: Framing) -> Entry {
    let mut entry = Entry::of_value(value, framing);
    entry.delivery_count = earlier + entry.earlier_attempts() + 1;
    entry
}

mod inspect;
mod read;
mod settle;

pub(crate) use inspect::{check_type, depth};
pub(crate) use read::{ListReader, give_back};

#[cfg(test)]
mod tests;
