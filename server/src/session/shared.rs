//! What all subscriptions of the process share ([`Shared`]): the settings from the
//! configuration, the Redis connections, the metrics, the admin views, the server's command
//! table, the registries the background jobs read, and the consumer names subscriptions hold
//! on this sidecar and, as leases, in Redis.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::messages::SessionError;
use super::observe::{MemberView, SubscriptionView};
use super::retention::Retention;
use super::sampler::Watched;
use crate::domain::{MAX_BLOCK, Source};
use crate::metrics::Metrics;
use crate::policy::{Patterns, Policy};
use crate::redis::keys::KeySpecs;
use crate::redis::lease::ConsumerLease;
use crate::redis::server::ServerInfo;
use crate::redis::{Redis, RedisError, Replication};

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
    /// Every stream group and list whose backlog and work gauges are sampled.
    pub watched: Watched,
    /// Where streams are handed to the retention job.
    pub retention: Retention,
    /// Redis answers and the sidecar is not draining (readiness).
    pub ready: AtomicBool,
    /// Why the sidecar is not ready, when it is not: said by `/readyz`.
    pub unready: Mutex<Option<String>>,
    pub(super) next_id: AtomicU64,
    /// (key, group, consumer) of open stream subscriptions: two readers with one consumer name
    /// would read each other's pending entries.
    /// Each with whether its subscription is closing (its client is gone, its last read is
    /// still under way).
    pub(super) consumers: Mutex<HashMap<Claim, bool>>,
    /// The admin view of every open subscription, by id.
    pub(super) views: Mutex<BTreeMap<String, SubscriptionView>>,
    /// The admin view of every partitioned stream's subscription (a replica), by id.
    pub(super) members: Mutex<BTreeMap<String, MemberView>>,
    /// Which arguments are keys and the categories of each command: loaded once, when the
    /// first subscription opens, to apply the policy and (on a cluster) route by slot.
    key_specs: tokio::sync::OnceCell<Arc<KeySpecs>>,
    /// What the server is and offers, learned with the command table.
    server: std::sync::OnceLock<ServerInfo>,
}

impl Shared {
    pub fn new(redis: Redis, settings: Settings, shutdown: CancellationToken) -> Self {
        Self {
            retention: Retention::new(settings.retention.clone()),
            redis,
            settings,
            shutdown,
            metrics: Metrics::new(),
            watched: Watched::default(),
            ready: AtomicBool::new(false),
            unready: Mutex::new(None),
            next_id: AtomicU64::new(1),
            consumers: Mutex::new(HashMap::new()),
            views: Mutex::new(BTreeMap::new()),
            members: Mutex::new(BTreeMap::new()),
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

    /// The admin view of every partitioned stream's subscription: which partitions it reads,
    /// and the hand-overs under way.
    pub fn partitioned(&self) -> Vec<MemberView> {
        self.members.lock().values().cloned().collect()
    }
}

/// A consumer name: (key, group or form, consumer).
pub(super) type Claim = (String, String, String);

/// Takes a consumer name for a new subscription. A subscription that holds it and is closing
/// gives it up once its last read returns (at most BLOCK): wait for that. One that is open
/// may be about to notice its client left (a client that reconnects is quicker than the
/// sidecar sees the old stream end): wait a moment, then refuse.
pub(super) async fn take_consumer(
    shared: &Shared,
    claim: &Claim,
    wanted: Wanted,
) -> Result<(), SessionError> {
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
                    wanted.refused(shared);
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
    wanted: Wanted,
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
            wanted.refused(shared);
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

/// Who wants a consumer name: a client opening a subscription, whom a refusal turns away
/// (counted: two replicas sharing one name is a misconfiguration the alert names), or a
/// partitioned stream's replica waiting for a partition's name while its previous owner hands
/// it over (not counted: it is how a hand-over goes, and it tries again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wanted {
    ByClient,
    ForPartition,
}

impl Wanted {
    fn refused(self, shared: &Shared) {
        if self == Wanted::ByClient {
            shared.metrics.scale.consumer_refusals.inc();
        }
    }
}

/// Frees a consumer name on this sidecar when its session ends, however it ends.
pub(super) struct Release(pub(super) Arc<Shared>, pub(super) Claim);

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
