//! The forms side by side: what a subscription reads ([`Form`]), how it settles and requeues
//! (through [`Settling`]), where its delayed entries go back to, and its reader.

use std::time::Duration;

use bytes::Bytes;

use super::delay::{self, Target};
use super::entry::Entry;
use super::flush::FlushPlan;
use super::list::{ListKeys, ListReader, ListSource};
use super::plan::Settling;
use super::pubsub::{PubSubForm, PubSubReader, PubSubSource};
use super::stream::{ReadBatch, StreamKeys, StreamReader, StreamSource};
use super::{Redis, RedisError, Replication};
use crate::window::Outcome;

/// What a subscription reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A stream through a consumer group. An empty consumer means the sidecar's default.
    Stream(StreamSource),
    /// A list, reliable (processing list) or simple (pop).
    List(ListSource),
    /// Pub/sub channels, patterns and sharded channels.
    PubSub(PubSubSource),
}

impl Source {
    /// The form's name in logs, metrics and spans.
    pub fn form(&self) -> &'static str {
        match self {
            Source::Stream(_) => "stream",
            Source::List(list) if list.reliable => "reliable_list",
            Source::List(_) => "simple_list",
            Source::PubSub(_) => "pubsub",
        }
    }

    /// The consumer name, for forms that have one.
    pub fn consumer_mut(&mut self) -> Option<&mut String> {
        match self {
            Source::Stream(stream) => Some(&mut stream.consumer),
            Source::List(list) if list.reliable => Some(&mut list.consumer),
            _ => None,
        }
    }

    /// (key, group or form, consumer): what must be unique among open subscriptions of one
    /// sidecar, for forms whose readers own pending entries.
    pub fn claim(&self) -> Option<(String, String, String)> {
        match self {
            Source::Stream(s) => Some((s.key.clone(), s.group.clone(), s.consumer.clone())),
            Source::List(l) if l.reliable => {
                Some((l.key.clone(), "reliable_list".into(), l.consumer.clone()))
            }
            _ => None,
        }
    }

    /// The key (or channels) and the group (or form), for logs, metrics and the admin view.
    pub fn describe(&self) -> (String, String, String) {
        match self {
            Source::Stream(s) => (s.key.clone(), s.group.clone(), s.consumer.clone()),
            Source::List(l) => (l.key.clone(), String::new(), l.consumer.clone()),
            Source::PubSub(p) => (p.describe(), String::new(), String::new()),
        }
    }
}

/// How a subscription settles, requeues and dead-letters, by form.
#[derive(Clone, Debug)]
pub enum Form {
    Stream(StreamKeys),
    List(ListKeys),
    PubSub(PubSubForm),
}

impl Form {
    pub fn new(source: &Source, dead_letter: Option<&str>) -> Self {
        let dead_letter = dead_letter.map(|k| Bytes::copy_from_slice(k.as_bytes()));
        match source {
            Source::Stream(s) => Form::Stream(StreamKeys {
                dead_letter,
                ..StreamKeys::new(s)
            }),
            Source::List(l) => {
                let mut keys = ListKeys::new(l);
                keys.dead_letter = dead_letter;
                Form::List(keys)
            }
            Source::PubSub(p) => Form::PubSub(PubSubForm::new(p)),
        }
    }

    fn settling(&self) -> &dyn Settling {
        match self {
            Form::Stream(keys) => keys,
            Form::List(keys) => keys,
            Form::PubSub(form) => form,
        }
    }

    /// An outcome this form cannot honour for this entry, with why.
    pub fn refuses(&self, entry: &Entry, outcome: &Outcome) -> Option<&'static str> {
        match (self, outcome) {
            (Form::PubSub(form), Outcome::RetryAfter(_)) if form.is_sharded(entry) => Some(
                "retry_after is not offered on sharded channels (its delay set would have to live in the channel's slot); use retry, which republishes now",
            ),
            _ => None,
        }
    }

    /// Moves due delayed entries back. Returns how many.
    pub async fn promote_due(
        &self,
        redis: &Redis,
        now_ms: u64,
        limit: u32,
    ) -> Result<u64, RedisError> {
        let (delayed, target_key, target) = match self {
            Form::Stream(keys) => (&keys.delayed, &keys.key, Target::Stream),
            Form::List(keys) => (&keys.delayed, &keys.key, Target::List),
            Form::PubSub(form) => (&form.delayed, &form.delayed, Target::Publish),
        };
        delay::promote_due(redis.pool(), delayed, target_key, target, now_ms, limit).await
    }

    /// The delay set and the key its depth is reported under.
    pub fn delayed(&self) -> &Bytes {
        match self {
            Form::Stream(keys) => &keys.delayed,
            Form::List(keys) => &keys.delayed,
            Form::PubSub(form) => &form.delayed,
        }
    }
}

impl Settling for Form {
    fn slot(&self) -> Option<u16> {
        self.settling().slot()
    }
    fn settles_in_redis(&self) -> bool {
        self.settling().settles_in_redis()
    }
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        self.settling().settle(entries, plan)
    }
    fn retry(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        self.settling().retry(entry, reason, plan)
    }
    fn retry_after(&self, entry: &Entry, reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan) {
        self.settling().retry_after(entry, reason, due_ms, plan)
    }
    fn dead_letter(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        self.settling().dead_letter(entry, reason, plan)
    }
    fn finished(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        self.settling().finished(entries, plan)
    }
}

/// Reads a subscription on its own connection.
pub enum Reader {
    Stream(StreamReader),
    List(ListReader),
    PubSub(PubSubReader),
}

impl Reader {
    /// Opens the reader of a form: a dedicated connection (a subscriber one for pub/sub).
    pub async fn open(
        redis: &Redis,
        source: &Source,
        form: &Form,
        block: Duration,
        reclaim_interval: Duration,
        replication: Option<Replication>,
    ) -> Result<Self, RedisError> {
        Ok(match (source, form) {
            (Source::Stream(s), _) => Reader::Stream(StreamReader::new(
                redis.dedicated_client().await?,
                s,
                block,
                reclaim_interval,
                replication,
            )),
            (Source::List(l), Form::List(keys)) => Reader::List(ListReader::new(
                redis.dedicated_client().await?,
                l,
                keys.clone(),
                block,
                reclaim_interval,
                replication,
            )),
            (Source::PubSub(p), _) => Reader::PubSub(PubSubReader::open(redis, p, block).await?),
            (Source::List(_), _) => unreachable!("a list source has a list form"),
        })
    }

    pub async fn read(&mut self, count: u32) -> Result<ReadBatch, RedisError> {
        match self {
            Reader::Stream(r) => r.read(count).await,
            Reader::List(r) => r.read(count).await,
            Reader::PubSub(r) => r.read(count).await,
        }
    }

    /// Reads this consumer's own pending entries again (after a settle or a read failed): a
    /// stream's pending entries list, a reliable list's processing list (only asked for once
    /// the window is empty).
    pub fn reread_pending(&mut self) {
        match self {
            Reader::Stream(r) => r.reread_pending(),
            Reader::List(r) => r.reread_own(),
            Reader::PubSub(_) => {}
        }
    }

    pub async fn close(self) {
        match self {
            Reader::Stream(r) => r.close().await,
            Reader::List(r) => r.close().await,
            Reader::PubSub(r) => r.close().await,
        }
    }
}
