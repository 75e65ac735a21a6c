//! Where a Publish writes.

use bytes::Bytes;

/// Where a Publish writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Appended to a stream, trimmed to about `max_len` entries when set.
    Stream {
        key: Bytes,
        max_len: Option<u64>,
    },
    /// Pushed where producers push, so list subscriptions read them in order.
    List(Bytes),
    Channel(Bytes),
    ShardedChannel(Bytes),
}

impl Target {
    /// The target's name in spans: a stream's key, `list:`, `channel:` or `shard:` and a name
    /// (as a pub/sub subscription names its channels).
    pub fn describe(&self) -> String {
        let (kind, name) = match self {
            Target::Stream { key, .. } => ("", key),
            Target::List(key) => ("list:", key),
            Target::Channel(name) => ("channel:", name),
            Target::ShardedChannel(name) => ("shard:", name),
        };
        format!("{kind}{}", String::from_utf8_lossy(name))
    }
}
