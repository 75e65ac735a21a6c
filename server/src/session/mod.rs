//! Subscriptions: the domain messages between the gRPC layer and a subscription, what all
//! subscriptions share, and [`run`], which takes one Subscribe stream from its `open` to its end.
//! The task that runs a subscription's engine is in [`subscription`], the tasks that read and
//! flush beside it in [`workers`]; what operators see of it (admin view, spans) is in
//! [`observe`], the backlog gauges of every key it served in [`backlog`], the trim of every
//! stream under retention by acknowledgement in [`retention`].

pub mod backlog;
mod observe;
pub mod retention;
mod subscription;
mod workers;

pub use observe::SubscriptionView;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use std::time::Duration;

use futures::{Stream, StreamExt};
use opentelemetry::trace::SpanContext;
use thiserror::Error;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use crate::domain::{Entry, MAX_BLOCK, Mode, Source};
use crate::metrics::Metrics;
use crate::policy::{Patterns, Policy, PolicyError};
use crate::redis::flush::FlushResult;
use crate::redis::keys::KeySpecs;
use crate::redis::keys::admit::SlotMismatch;
use crate::redis::lease::ConsumerLease;
use crate::redis::server::ServerInfo;
use crate::redis::{Redis, RedisError, Replication};
use crate::window::{Command, CommandError, Outcome, ReadId, SlotError, SlotId};
use subscription::Subscription;

/// Settings every session shares, from the configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This sidecar among those sharing a Redis, the same after it restarts: the holder of its
    /// consumer leases.
    pub instance: String,
    pub default_consumer: String,
    pub max_commands_per_slot: usize,
    /// Entries an ordered stream subscription may park past its waiting bound.
    pub max_parked: u32,
    pub shutdown_grace: Duration,
    pub promote_interval: Duration,
    pub reclaim_interval: Duration,
    /// How long a stream consumer's lease lives unrenewed (a holder that died frees it then).
    pub consumer_lease: Duration,
    /// Whether spans are exported (links and contexts are only worked out then).
    pub tracing: bool,
    /// What clients may open, queue and send.
    pub policy: Policy,
    /// Replicas that must have a read's claim before it is delivered.
    pub replication: Option<Replication>,
    /// Streams whose entries leave once every group has acknowledged them.
    pub retention: Option<Patterns>,
}

/// What all sessions of the process share.
#[derive(Debug)]
pub struct Shared {
    pub redis: Redis,
    pub settings: Settings,
    /// Cancelled on SIGTERM/SIGINT: sessions stop reading and drain.
    pub shutdown: CancellationToken,
    pub metrics: Metrics,
    /// Every stream group and list whose backlog gauges are sampled.
    pub backlog: backlog::Backlog,
    /// Where streams are handed to the retention job.
    pub retention: retention::Retention,
    /// Redis answers and the sidecar is not draining (readiness).
    pub ready: AtomicBool,
    /// Why the sidecar is not ready, when it is not: said by `/readyz`.
    pub unready: Mutex<Option<String>>,
    next_id: AtomicU64,
    /// (key, group, consumer) of open stream subscriptions: two readers with one consumer name
    /// would read each other's pending entries.
    /// Each with whether its subscription is closing (its client is gone, its last read is
    /// still under way).
    consumers: Mutex<HashMap<Claim, bool>>,
    /// The admin view of every open subscription, by id.
    views: Mutex<BTreeMap<String, SubscriptionView>>,
    /// Which arguments are keys and the categories of each command: loaded once, when the
    /// first subscription opens, to apply the policy and (on a cluster) route by slot.
    key_specs: tokio::sync::OnceCell<Arc<KeySpecs>>,
    /// What the server is and offers, learned with the command table.
    server: std::sync::OnceLock<ServerInfo>,
}

impl Shared {
    pub fn new(redis: Redis, settings: Settings, shutdown: CancellationToken) -> Self {
        Self {
            retention: retention::Retention::new(settings.retention.clone()),
            redis,
            settings,
            shutdown,
            metrics: Metrics::new(),
            backlog: backlog::Backlog::default(),
            ready: AtomicBool::new(false),
            unready: Mutex::new(None),
            next_id: AtomicU64::new(1),
            consumers: Mutex::new(HashMap::new()),
            views: Mutex::new(BTreeMap::new()),
            key_specs: tokio::sync::OnceCell::new(),
            server: std::sync::OnceLock::new(),
        }
    }

    /// The server's command table (loaded on first use).
    pub async fn key_specs(&self) -> Result<Arc<KeySpecs>, RedisError> {
        let specs = self
            .key_specs
            .get_or_try_init(|| async {
                let specs = KeySpecs::load(self.redis.pool()).await?;
                let server = ServerInfo::load(self.redis.pool(), &specs).await;
                tracing::info!(
                    product = %server.product,
                    version = %server.version,
                    xackdel = server.ack_delete,
                    "redis server"
                );
                let _ = self.server.set(server);
                let unknown = self
                    .settings
                    .policy
                    .commands
                    .unknown_targets(|c| specs.knows_category(c), |c| specs.knows(c));
                if !unknown.is_empty() {
                    tracing::warn!(
                        rules = ?unknown,
                        "--allow-commands names categories or commands this Redis does not know; they allow or refuse nothing"
                    );
                }
                Ok::<_, RedisError>(Arc::new(specs))
            })
            .await?;
        Ok(Arc::clone(specs))
    }

    /// What the server offers, once the command table is loaded ([`Shared::key_specs`]).
    pub fn server(&self) -> Option<&ServerInfo> {
        self.server.get()
    }

    /// Whether entries of this stream leave once every group has acknowledged them.
    pub fn retained(&self, key: &str) -> bool {
        self.retention.covers(key.as_bytes())
    }

    /// The admin view of every open subscription.
    pub fn subscriptions(&self) -> Vec<SubscriptionView> {
        self.views.lock().values().cloned().collect()
    }
}

/// A validated open request.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenRequest {
    pub source: Source,
    pub count: u32,
    pub block: Duration,
    pub mode: Mode,
    pub max_in_flight: u32,
    /// Deliveries at which an entry goes to `dead_letter` instead of back; 0: no cap.
    pub max_deliveries: u32,
    /// The dead-letter key (a stream for streams, a list for lists).
    pub dead_letter: Option<String>,
    /// A flush report whose flush carried the next read goes out in that read's message.
    pub reports_in_reads: bool,
    /// Where an entry's ordering key comes from; `None`: unordered.
    pub ordering_key: Option<crate::domain::OrderingKey>,
}

/// A client message, converted and checked by the gRPC layer.
#[derive(Debug)]
pub enum ClientMessage {
    Open(OpenRequest),
    Batch(ClientBatch),
}

/// Commands and outcomes of one client message; items that failed conversion are errors here
/// and become per-slot rejections.
#[derive(Debug, Default)]
pub struct ClientBatch {
    pub commands: Vec<(SlotId, Result<Command, CommandError>)>,
    pub outcomes: Vec<Result<SettleRequest, SlotError>>,
    /// Slots still being worked on.
    pub extend: Vec<SlotId>,
}

/// An outcome for a slot, with the client's reason and trace context.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleRequest {
    pub slot: SlotId,
    pub outcome: Outcome,
    pub reason: Option<String>,
    /// The client's span for handling the delivery, if it sent a valid one.
    pub trace: Option<SpanContext>,
}

/// What the session tells the client.
#[derive(Debug)]
pub enum Event {
    Opened(Box<Opened>),
    Read {
        read_id: ReadId,
        first_slot: SlotId,
        entries: Vec<Arc<Entry>>,
        /// Pub/sub: messages dropped for a slow client since the previous read.
        lost: u64,
        /// The read span's `traceparent`, for deliveries whose producer sent no context.
        read_trace: Option<String>,
        /// The report of the flush this read rode on (`reports_in_reads`).
        flushed: Option<FlushReport>,
    },
    Flushed(FlushReport),
    Rejected(Vec<SlotError>),
    /// Shutdown began: outcomes within `grace` still count.
    Draining {
        grace: Duration,
        outstanding: usize,
    },
}

/// The settings in effect for an opened subscription.
#[derive(Clone, Debug)]
pub struct Opened {
    pub subscription_id: String,
    /// The source with the consumer name in use filled in.
    pub source: Source,
    pub request: OpenRequest,
}

/// The result of one flush, for the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushReport {
    pub read_id: ReadId,
    pub segments_kept: usize,
    pub segments_dropped: usize,
    pub commands: usize,
    pub settles: usize,
    pub dead_lettered: usize,
    pub result: FlushResult,
}

/// Why a session ended the stream.
#[derive(Debug, Error)]
pub enum SessionError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("the first message of a subscription must be `open`")]
    NotOpened,
    #[error("the subscription is already open: send `open` only once per stream")]
    SecondOpen,
    #[error(
        "consumer {consumer:?} is already reading {key:?} in group {group:?}, on this sidecar or another sharing its Redis; give each subscription its own consumer name, or wait for the other stream to close (a holder that died frees the name when its lease expires)"
    )]
    ConsumerBusy {
        key: String,
        group: String,
        consumer: String,
    },
    #[error("cannot open the subscription: {0}")]
    Layout(#[from] SlotMismatch),
    #[error(
        "the consumer group {group:?} of {key:?} was deleted while this subscription read it; create it again where consumers should resume (XGROUP CREATE {key} {group} <id>), or reopen to create it at the open's start_id"
    )]
    GroupDeleted { key: String, group: String },
    #[error("{key:?} no longer holds what a {form} subscription reads (WRONGTYPE)")]
    WrongType { key: String, form: &'static str },
    #[error(
        "the lease on consumer {consumer:?} of {key:?} expired unrenewed and another subscription took the name; reopen to get a fresh consumer state"
    )]
    LeaseLost { key: String, consumer: String },
    #[error("cannot open the subscription: {0}")]
    Redis(#[from] RedisError),
    #[error("cannot open the subscription: {0}")]
    Denied(#[from] PolicyError),
    #[error("{0}")]
    TooLarge(String),
    #[error(
        "window-sidecar is shutting down; unsettled deliveries stay pending and will be delivered again"
    )]
    ShuttingDown,
}

/// An item of the client's stream as the session sees it.
pub type Inbound = Result<ClientMessage, InboundError>;

/// A client message that could not be used.
#[derive(Debug, Error)]
pub enum InboundError {
    /// The message is malformed: the stream ends with INVALID_ARGUMENT.
    #[error("{0}")]
    Invalid(String),
    /// The message is larger than the sidecar accepts: the stream ends with
    /// RESOURCE_EXHAUSTED.
    #[error("{0}")]
    TooLarge(String),
    /// The transport failed: the client is gone.
    #[error("the client's stream failed: {0}")]
    Transport(String),
}

/// Where a subscription's events go.
type Outbound = mpsc::Sender<Result<Event, SessionError>>;

/// Runs one subscription until the client leaves or shutdown completes.
pub async fn run(
    shared: Arc<Shared>,
    mut inbound: impl Stream<Item = Inbound> + Unpin,
    out: Outbound,
) {
    let open = tokio::select! {
        first = inbound.next() => match first {
            Some(Ok(ClientMessage::Open(open))) => open,
            Some(Ok(ClientMessage::Batch(_))) => return fail(&out, SessionError::NotOpened).await,
            Some(Err(InboundError::Invalid(msg))) => return fail(&out, SessionError::InvalidRequest(msg)).await,
            Some(Err(InboundError::TooLarge(msg))) => return fail(&out, SessionError::TooLarge(msg)).await,
            Some(Err(InboundError::Transport(_))) | None => return,
        },
        () = shared.shutdown.cancelled() => return fail(&out, SessionError::ShuttingDown).await,
    };
    let id = format!("sub-{}", shared.next_id.fetch_add(1, Ordering::Relaxed));
    let mut source = open.source.clone();
    if let Some(consumer) = source.consumer_mut().filter(|c| c.is_empty()) {
        *consumer = shared.settings.default_consumer.clone();
    }
    if let Err(err) = check_policy(&shared.settings.policy, &source, &open) {
        return fail(&out, err.into()).await;
    }
    let (key, group, consumer) = source.describe();
    let span = info_span!("subscription", id = %id, form = source.form(), key = %key, group = %group, consumer = %consumer);
    async move {
        let release = match source.claim() {
            Some(claim) => match take_consumer(&shared, &claim).await {
                Ok(()) => Some(Release(Arc::clone(&shared), claim)),
                Err(busy) => return fail(&out, busy).await,
            },
            None => None,
        };
        match Subscription::open(&shared, id, source, open, &out, release).await {
            Ok(subscription) => {
                // The subscription holds its own sender: the client's stream ends when it says.
                drop(out);
                subscription.run(inbound).await;
            }
            Err(err) => fail(&out, err).await,
        }
    }
    .instrument(span)
    .await
}

/// The keys and channels a subscription reads and dead-letters to must be allowed. Its own
/// companion keys (processing lists, delay set) are the sidecar's and need no pattern.
fn check_policy(policy: &Policy, source: &Source, open: &OpenRequest) -> Result<(), PolicyError> {
    match source {
        Source::Stream(stream) => policy.check_key(stream.key.as_bytes())?,
        Source::List(list) => policy.check_key(list.key.as_bytes())?,
        Source::PubSub(pubsub) => {
            for channel in pubsub
                .channels
                .iter()
                .chain(&pubsub.patterns)
                .chain(&pubsub.sharded_channels)
            {
                policy.check_channel(channel.as_bytes())?;
            }
        }
    }
    match &open.dead_letter {
        Some(target) => policy.check_key(target.as_bytes()),
        None => Ok(()),
    }
}

async fn fail(out: &Outbound, err: SessionError) {
    debug!(error = %err, "ending the subscription stream");
    let _ = out.send(Err(err)).await;
}

/// A consumer name: (key, group or form, consumer).
type Claim = (String, String, String);

/// Takes a consumer name for a new subscription. A subscription that holds it and is closing
/// gives it up once its last read returns (at most BLOCK): wait for that. One that is open
/// may be about to notice its client left (a client that reconnects is quicker than the
/// sidecar sees the old stream end): wait a moment, then refuse.
async fn take_consumer(shared: &Shared, claim: &Claim) -> Result<(), SessionError> {
    const POLL: Duration = Duration::from_millis(20);
    const OPEN_GRACE: Duration = Duration::from_secs(1);
    let started = tokio::time::Instant::now();
    let closing_bound = MAX_BLOCK + shared.redis.timeout();
    loop {
        {
            let mut consumers = shared.consumers.lock();
            let waited = started.elapsed();
            match consumers.get(claim) {
                None => {
                    consumers.insert(claim.clone(), false);
                    return Ok(());
                }
                Some(true) if waited < closing_bound => {}
                Some(false) if waited < OPEN_GRACE => {}
                Some(_) => {
                    shared.metrics.scale.consumer_refusals.inc();
                    let (key, group, consumer) = claim.clone();
                    return Err(SessionError::ConsumerBusy {
                        key,
                        group,
                        consumer,
                    });
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Takes the lease on a consumer name in Redis. Another holder that is closing (a client that
/// reconnected to another sidecar before the old stream ended) may free it in a moment: wait
/// a little, then refuse.
pub(super) async fn take_lease(
    shared: &Shared,
    lease: &ConsumerLease,
    source: &Source,
) -> Result<(), SessionError> {
    const POLL: Duration = Duration::from_millis(50);
    const GRACE: Duration = Duration::from_secs(1);
    let started = tokio::time::Instant::now();
    loop {
        let held = lease
            .take(shared.redis.pool())
            .await
            .map_err(|err| SessionError::Redis(shared.redis.explain(err)))?;
        if held {
            return Ok(());
        }
        if started.elapsed() >= GRACE {
            shared.metrics.scale.consumer_refusals.inc();
            let (key, group, consumer) = source.describe();
            return Err(SessionError::ConsumerBusy {
                key,
                group,
                consumer,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Frees a consumer name on this sidecar when its session ends, however it ends.
pub(super) struct Release(Arc<Shared>, Claim);

impl Release {
    pub(super) fn closing(&self) {
        if let Some(closing) = self.0.consumers.lock().get_mut(&self.1) {
            *closing = true;
        }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.0.consumers.lock().remove(&self.1);
    }
}
