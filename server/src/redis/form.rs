//! The forms side by side: what a subscription reads ([`Form`]), how it settles and requeues
//! (through [`Settling`]), where its delayed entries go back to, how it gives entries back,
//! its consumer lease, and its reader.

use std::time::Duration;

use bytes::Bytes;

use fred::prelude::Client;

use super::delay::{self, Target};
use super::flush::Settling;
use super::flush::{FlushPlan, Requeued};
use super::lease::{ConsumerLease, LeaseHolder};
use super::list::{self, ListKeys, ListReader};
use super::pubsub::{PubSubForm, PubSubReader};
use super::read_connection::ReadConnection;
use super::stream::{self, StreamKeys, StreamReader};
use super::{Redis, RedisError, Replication};
use crate::domain::entry::Parked;
use crate::domain::{Entry, ReadBatch, Source};
use crate::engine::{Kind, ReadError, Stop};
use crate::window::Outcome;

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
            (Form::PubSub(_), Outcome::DeadLetter) => Some(
                "dead_letter is not offered on pub/sub, which has no dead-letter target; use drop",
            ),
            (Form::Stream(StreamKeys { dead_letter, .. }), Outcome::DeadLetter)
            | (Form::List(ListKeys { dead_letter, .. }), Outcome::DeadLetter)
                if dead_letter.is_none() =>
            {
                Some(
                    "dead_letter needs a dead-letter target: open the subscription with open.dead_letter (and open.max_deliveries), or settle it with drop",
                )
            }
            _ => None,
        }
    }

    /// Moves due delayed entries back. Returns how many. On a stream: the due entries of the
    /// group whose consumer is gone, made deliverable by the next reclaim (its retries stay
    /// pending in the group), and the copies an earlier version wrote to the shared delay set,
    /// appended to the stream as then, so that they are delivered once after an upgrade.
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
        let copies = delay::promote_due(redis.pool(), delayed, target_key, target, now_ms, limit);
        let Form::Stream(keys) = self else {
            return copies.await;
        };
        // Each on its own: a refused promotion of the copies (an ACL without XADD) must not
        // hold back the group's own due entries.
        let (copies, in_group) =
            tokio::join!(copies, stream::promote_in_group(redis.pool(), keys, limit));
        Ok(copies? + in_group?)
    }

    /// The engine's view of this form.
    pub fn kind(&self) -> Kind {
        match self {
            Form::Stream(_) => Kind::Stream,
            Form::List(keys) if keys.reliable => Kind::ReliableList,
            Form::List(_) => Kind::SimpleList,
            Form::PubSub(_) => Kind::PubSub,
        }
    }

    /// Refuses to open on a key this form cannot read, before anything is written beside it.
    pub async fn check_key(&self, client: &Client) -> Result<(), RedisError> {
        match self {
            Form::List(keys) => list::check_type(client, keys).await,
            _ => Ok(()),
        }
    }

    /// The lease on this subscription's consumer name, for forms that have one: a stream's
    /// lives `stream_ttl`; a reliable list's is its heartbeat and lives `dead_after`.
    pub fn lease(
        &self,
        source: &Source,
        holder: LeaseHolder,
        stream_ttl: Duration,
    ) -> Option<ConsumerLease> {
        match (self, source) {
            (Form::Stream(_), Source::Stream(s)) => Some(ConsumerLease {
                key: Bytes::from(stream::lease_key(&s.key, &s.group, &s.consumer)),
                members: None,
                holder,
                ttl: stream_ttl,
                keep_when_freed: false,
            }),
            (Form::List(keys), Source::List(l)) if keys.reliable => Some(ConsumerLease {
                key: keys.heartbeat.clone(),
                members: Some((keys.consumers.clone(), keys.consumer.clone())),
                holder,
                ttl: l.dead_after,
                keep_when_freed: true,
            }),
            _ => None,
        }
    }

    /// Gives entries back as if this subscription had not taken them (see
    /// [`crate::engine::Action::GiveBack`]).
    pub async fn give_back(
        &self,
        client: &Client,
        entries: &[&Entry],
        seen: bool,
    ) -> Result<(), RedisError> {
        match self {
            // A stream's seen entries stay pending on this consumer, counted as they are.
            Form::Stream(keys) if !seen => stream::uncount(client, keys, entries).await,
            Form::List(keys) => list::give_back(client, keys, entries, seen).await,
            _ => Ok(()),
        }
    }

    /// Whether its entries leave Redis when read (a simple list): a requeue or give-back Redis
    /// refuses leaves them with the sidecar alone.
    pub fn pops(&self) -> bool {
        matches!(self, Form::List(keys) if !keys.reliable)
    }

    /// Keeps outstanding stream entries from other consumers (see
    /// [`crate::engine::Action::Extend`]); other forms extend through their lease.
    pub async fn extend(&self, client: &Client, entries: &[&Entry]) -> Result<(), RedisError> {
        match self {
            Form::Stream(keys) => stream::extend(client, keys, entries).await,
            _ => Ok(()),
        }
    }

    /// Counts the next delivery of retries kept in place now due (see
    /// [`crate::engine::Action::Count`]): only a stream's `retry_after` waits uncounted.
    pub async fn count_due(
        &self,
        client: &Client,
        entries: &[&Entry],
    ) -> Result<Vec<Option<Entry>>, RedisError> {
        match self {
            Form::Stream(keys) => stream::count_due(client, keys, entries).await,
            _ => Err(RedisError::Protocol {
                command: "XCLAIM",
                detail: "only stream entries wait uncounted".into(),
            }),
        }
    }

    /// Fetches parked entries by id (see [`crate::engine::Action::Fetch`]): only an ordered
    /// stream parks them.
    pub async fn fetch(
        &self,
        client: &Client,
        parked: &[Parked],
    ) -> Result<Vec<Option<Entry>>, RedisError> {
        match self {
            Form::Stream(keys) => stream::fetch(client, keys, parked).await,
            _ => Err(RedisError::Protocol {
                command: "XRANGE",
                detail: "only stream entries are parked".into(),
            }),
        }
    }

    /// The subscription as its dead letters name it (`stream/group`, the list's key), and as
    /// the refusal counter labels it.
    pub fn subscription(&self) -> String {
        match self {
            Form::Stream(keys) => keys.subscription.clone(),
            Form::List(keys) => keys.subscription(),
            Form::PubSub(form) => String::from_utf8_lossy(&form.delayed).into_owned(),
        }
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
    fn keep_in_place(&self, entry: &Entry, delay: Option<Duration>, plan: &mut FlushPlan) {
        self.settling().keep_in_place(entry, delay, plan)
    }
    fn settle_owned(&self, requeues: &[Requeued<'_>], plan: &mut FlushPlan) -> bool {
        self.settling().settle_owned(requeues, plan)
    }
}

/// Reads a subscription on its own connection.
pub(crate) enum Reader {
    Stream(StreamReader),
    List(ListReader),
    PubSub(PubSubReader),
}

impl Reader {
    /// Opens the reader of a form: a dedicated connection (a subscriber one for pub/sub).
    pub(crate) async fn open(
        redis: &Redis,
        source: &Source,
        form: &Form,
        max_deliveries: u32,
        replication: Option<Replication>,
    ) -> Result<Self, RedisError> {
        Ok(match (source, form) {
            (Source::Stream(s), Form::Stream(keys)) => Reader::Stream(StreamReader::new(
                ReadConnection::open(redis, keys.slot).await?,
                s,
                max_deliveries,
                replication,
            )),
            (Source::List(_), Form::List(keys)) => Reader::List(ListReader::new(
                ReadConnection::open(redis, keys.slot).await?,
                keys.clone(),
                max_deliveries,
                replication,
            )),
            (Source::PubSub(p), _) => Reader::PubSub(PubSubReader::open(redis, p).await?),
            (Source::Stream(_), _) => unreachable!("a stream source has a stream form"),
            (Source::List(_), _) => unreachable!("a list source has a list form"),
        })
    }

    /// One read as the engine asked for it (see [`crate::engine::Action::Read`]).
    pub(crate) async fn read(
        &mut self,
        count: u32,
        block: Duration,
        reread: bool,
        recover: bool,
    ) -> Result<ReadBatch, RedisError> {
        if reread {
            self.reread_pending();
        }
        match self {
            Reader::Stream(r) => r.read(count, block, recover).await,
            Reader::List(r) => r.read(count, block, recover).await,
            Reader::PubSub(r) => r.read(count, block).await,
        }
    }

    /// Reads this consumer's own pending entries again (after a settle or a read failed): a
    /// stream's pending entries list, a reliable list's processing list (only asked for once
    /// the window is empty).
    fn reread_pending(&mut self) {
        match self {
            Reader::Stream(r) => r.reread_pending(),
            Reader::List(r) => r.reread_own(),
            Reader::PubSub(_) => {}
        }
    }

    /// What cuts this reader's blocking read short, for forms whose reads block on their
    /// connection (a pub/sub reader waits on its own buffer and is never blocked in Redis).
    pub(crate) fn interrupter(&self) -> Option<ReadInterrupter> {
        match self {
            Reader::Stream(r) => Some(ReadInterrupter(r.connection().current())),
            Reader::List(r) => Some(ReadInterrupter(r.connection().current())),
            Reader::PubSub(_) => None,
        }
    }

    pub(crate) async fn close(self) {
        match self {
            Reader::Stream(r) => r.close().await,
            Reader::List(r) => r.close().await,
            Reader::PubSub(r) => r.close().await,
        }
    }
}

/// Cuts a reader's blocking read (XREADGROUP BLOCK, BLMOVE, BRPOP) short with
/// `CLIENT UNBLOCK … TIMEOUT`, sent on fred's backchannel to the node the read blocks on: the
/// read returns as if its block had run out, so it takes nothing and nothing is lost. A read
/// that is not blocked (it is between commands, or its reply is on the way) is left alone.
#[derive(Clone)]
pub(crate) struct ReadInterrupter(tokio::sync::watch::Receiver<Client>);

impl ReadInterrupter {
    pub(crate) async fn interrupt(&self) {
        use fred::interfaces::ClientInterface;
        use fred::types::ClientUnblockFlag;
        // The reader's connection may have followed its slot to another node since.
        let client = self.0.borrow().clone();
        if let Err(err) = client.unblock_self(Some(ClientUnblockFlag::Timeout)).await {
            tracing::debug!(error = %err, "the read under way was not blocked; it ends by itself");
        }
    }
}

/// What a failed read means for the subscription: a key that no longer holds what the form
/// reads, or a consumer group deleted under it, ends it (retrying cannot help, and recreating
/// the group at its start would hand out settled history again; a group lost in a failover is
/// the stream reader's to recreate: see [`StreamReader::read`]); anything else is tried again,
/// a delay set of the wrong type among them (the sidecar's own key: the read counted nothing,
/// and reads on once an operator removed it).
pub(crate) fn read_error(err: &RedisError) -> ReadError {
    match err {
        RedisError::Refused { message, .. } if message.starts_with("NOGROUP") => {
            ReadError::Fatal(Stop::GroupDeleted)
        }
        RedisError::Refused { message, .. } if message.starts_with("WRONGTYPE") => {
            ReadError::Fatal(Stop::WrongType)
        }
        // A failed read may have claimed entries it never returned.
        _ => ReadError::Retry { unknown: true },
    }
}
