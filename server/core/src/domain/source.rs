//! What a subscription reads and how: the [`Source`] of each form, the [`Mode`] its kept
//! commands are sent in, and the limits of a blocking read.

use std::time::Duration;

use bytes::Bytes;

use super::frame::Framing;

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
    /// The form's name in logs, metrics and spans: `stream`, `list` or `pubsub`. A reliable
    /// and a simple list are both `list`, the kind of key they read: the series that count
    /// a key's work and promotions are sampled by the keeper too, which knows the key and not
    /// how its workers read it, and one vocabulary serves every series.
    pub fn form(&self) -> &'static str {
        match self {
            Source::Stream(_) => "stream",
            Source::List(_) => "list",
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

/// A stream subscription's identity in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSource {
    pub key: String,
    pub group: String,
    pub consumer: String,
    /// Where a newly created group starts.
    pub start_id: String,
    /// Pending entries idle longer than this are claimed and delivered again.
    pub min_idle: Duration,
}

/// A list subscription's identity in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListSource {
    pub key: String,
    /// Reliable lists only: the consumer whose processing list this is.
    pub consumer: String,
    /// Reliable lists only: a consumer whose heartbeat (its lease) is older than this is dead.
    pub dead_after: Duration,
    /// Whether entries move to a processing list (at least once) or are popped (at most once).
    pub reliable: bool,
    /// Whether values in ruststream-fred's frame are delivered as payload and headers.
    pub framing: Framing,
}

/// What a pub/sub subscription listens to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PubSubSource {
    pub channels: Vec<String>,
    pub patterns: Vec<String>,
    pub sharded_channels: Vec<String>,
    /// The most messages buffered for a slow client.
    pub buffer: usize,
    /// Whether messages in ruststream-fred's frame are delivered as payload and headers.
    pub framing: Framing,
}

impl PubSubSource {
    /// A name for logs, metrics and the admin view.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.channels.clone();
        parts.extend(self.patterns.iter().map(|p| format!("pattern:{p}")));
        parts.extend(self.sharded_channels.iter().map(|c| format!("shard:{c}")));
        parts.join(",")
    }
}

/// How kept segments are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Kept segments in commit order, then the settles, in one pipeline.
    Pipeline,
    /// Each kept segment as MULTI, its commands, its own settle, EXEC.
    Atomic,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Pipeline => "pipeline",
            Mode::Atomic => "atomic",
        }
    }
}

/// The longest a read may block.
pub const MAX_BLOCK: Duration = Duration::from_secs(60);

/// A reliable list's [`ListSource::dead_after`] when nobody says otherwise: a client that sets
/// none, and the keeper (`--keep list:<key>`), which recovers the same consumers' processing
/// lists as the subscriptions do.
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(30);

/// Where an ordered subscription finds an entry's ordering key. Entries that share a key are
/// handed out one at a time, in the order read; an entry without it is unordered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderingKey {
    /// A header: on a stream the field `h:<name>` (as Publish writes headers), on a list a
    /// header of the value's frame. The name matches in any case.
    Header(String),
    /// A stream entry's field as stored (for producers that do not write the layout).
    Field(String),
}

impl OrderingKey {
    /// The key of `entry`, if it has one.
    pub fn of(&self, entry: &crate::domain::Entry) -> Option<crate::domain::Key> {
        self.in_fields(&entry.fields).map(crate::domain::Key::new)
    }

    /// The key among an entry's fields (as a stream stores them), if there.
    pub fn in_fields<'a>(&self, fields: &'a [(Bytes, Bytes)]) -> Option<&'a Bytes> {
        match self {
            OrderingKey::Header(name) => super::entry::header_in(fields, name),
            OrderingKey::Field(name) => fields
                .iter()
                .find_map(|(field, value)| (field == name.as_bytes()).then_some(value)),
        }
    }
}
