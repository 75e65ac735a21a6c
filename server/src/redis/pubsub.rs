//! The pub/sub form: classic channels, patterns and sharded channels on a dedicated subscriber
//! connection that resubscribes after a reconnect. Messages wait in a bounded buffer; when a
//! slow client lets it fill, the oldest are dropped and the next read says how many. Nothing is
//! settled (a published message is gone from Redis); retry republishes to the channel the
//! message came on, retry_after does so through a delay set.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::delay;
use super::entry::into_bytes;
use super::flush::Settling;
use super::flush::{FlushPlan, Role};
use super::{Redis, RedisError};
use crate::domain::{Entry, PubSubSource, ReadBatch};

/// The delay set of every pub/sub subscription (classic channels are cluster-wide, so one set
/// serves them all).
pub(crate) const DELAYED_KEY: &str = "window:pubsub:delayed";

/// How a pub/sub subscription requeues.
#[derive(Clone, Debug)]
pub struct PubSubForm {
    pub delayed: Bytes,
    sharded: HashSet<Bytes>,
}

impl PubSubForm {
    pub fn new(source: &PubSubSource) -> Self {
        Self {
            delayed: Bytes::from_static(DELAYED_KEY.as_bytes()),
            sharded: source
                .sharded_channels
                .iter()
                .map(|c| Bytes::copy_from_slice(c.as_bytes()))
                .collect(),
        }
    }

    /// Whether a message came on a sharded channel (retry_after is not offered there: its
    /// delay set would have to live in the channel's slot).
    pub fn is_sharded(&self, entry: &Entry) -> bool {
        entry
            .channel
            .as_ref()
            .is_some_and(|c| self.sharded.contains(c))
    }
}

impl Settling for PubSubForm {
    fn slot(&self) -> Option<u16> {
        None
    }

    fn settles_in_redis(&self) -> bool {
        false
    }

    fn settle(&self, _entries: &[&Entry], _plan: &mut FlushPlan) {}

    fn retry(&self, entry: &Entry, _reason: Option<&str>, plan: &mut FlushPlan) {
        let Some(channel) = &entry.channel else {
            return;
        };
        let (name, slot) = if self.is_sharded(entry) {
            ("SPUBLISH", Some(fred::util::redis_keyslot(channel)))
        } else {
            ("PUBLISH", None)
        };
        plan.push(
            name,
            vec![channel.clone(), entry.value().clone()],
            Role::Requeue,
            slot,
        );
    }

    fn retry_after(&self, entry: &Entry, _reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan) {
        let Some(channel) = &entry.channel else {
            return;
        };
        let member = delay::encode(
            &delay::unique_token(),
            [channel.clone(), entry.value().clone()],
        );
        let args = vec![
            self.delayed.clone(),
            Bytes::from(due_ms.to_string()),
            member,
        ];
        plan.push("ZADD", args, Role::Requeue, None);
    }

    fn dead_letter(&self, _entry: &Entry, _reason: Option<&str>, _plan: &mut FlushPlan) {}
}

/// Messages waiting for the client.
#[derive(Debug, Default)]
struct Buffer {
    messages: VecDeque<Entry>,
    capacity: usize,
    /// Dropped since the last read.
    lost: u64,
}

/// Listens on a dedicated subscriber connection and hands out what arrived.
pub(crate) struct PubSubReader {
    client: SubscriberClient,
    buffer: Arc<Mutex<Buffer>>,
    arrived: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl PubSubReader {
    /// Subscribes and starts buffering.
    pub(crate) async fn open(redis: &Redis, source: &PubSubSource) -> Result<Self, RedisError> {
        let client = redis.subscriber_client().await?;
        let buffer = Arc::new(Mutex::new(Buffer {
            capacity: source.buffer.max(1),
            ..Default::default()
        }));
        let arrived = Arc::new(Notify::new());
        // Resubscribes to every channel and pattern after a reconnect.
        let manager = client.manage_subscriptions();
        let mut messages = client.message_rx();
        let framing = source.framing;
        let sink = Arc::clone(&buffer);
        let notify = Arc::clone(&arrived);
        let forwarder = tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let lost_here = match messages.recv().await {
                    Ok(message) => {
                        let Some(value) = into_bytes(message.value) else {
                            continue;
                        };
                        let entry = Entry {
                            channel: Some(message.channel.into_inner()),
                            ..Entry::of_value(value, framing)
                        };
                        let mut buffer = sink.lock();
                        if buffer.messages.len() >= buffer.capacity {
                            // Drop the oldest: a late message is worth less than a new one.
                            buffer.messages.pop_front();
                            buffer.lost += 1;
                        }
                        buffer.messages.push_back(entry);
                        0
                    }
                    Err(RecvError::Lagged(n)) => n,
                    Err(RecvError::Closed) => return,
                };
                if lost_here > 0 {
                    sink.lock().lost += lost_here;
                }
                notify.notify_one();
            }
        });
        let subscribed = async {
            if !source.channels.is_empty() {
                client.subscribe(source.channels.clone()).await?;
            }
            if !source.patterns.is_empty() {
                client.psubscribe(source.patterns.clone()).await?;
            }
            if !source.sharded_channels.is_empty() {
                client.ssubscribe(source.sharded_channels.clone()).await?;
            }
            Ok::<_, Error>(())
        };
        if let Err(err) = subscribed.await {
            manager.abort();
            forwarder.abort();
            let _ = client.quit().await;
            return Err(RedisError::from_fred("SUBSCRIBE", &err));
        }
        Ok(Self {
            client,
            buffer,
            arrived,
            tasks: vec![manager, forwarder],
        })
    }

    /// The messages that have arrived, up to `count`; waits up to `block` for the first.
    pub(crate) async fn read(
        &mut self,
        count: u32,
        block: Duration,
    ) -> Result<ReadBatch, RedisError> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            {
                let mut buffer = self.buffer.lock();
                if !buffer.messages.is_empty() || buffer.lost > 0 {
                    let n = (count as usize).min(buffer.messages.len());
                    return Ok(ReadBatch {
                        entries: buffer.messages.drain(..n).collect(),
                        lost: std::mem::take(&mut buffer.lost),
                        ..Default::default()
                    });
                }
            }
            if tokio::time::timeout_at(deadline, self.arrived.notified())
                .await
                .is_err()
            {
                return Ok(ReadBatch::default());
            }
        }
    }

    /// Unsubscribes and closes the connection.
    pub(crate) async fn close(self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = self.client.quit().await;
    }
}
