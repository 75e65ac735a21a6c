//! Opening a subscription: the key and cluster-slot checks, the consumer lease, the reader,
//! flusher and helper tasks, and the engine with its configuration.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, info};

use super::Placement;
use super::Subscription;
use crate::domain::Source;
use crate::engine::{Config, Engine};
use crate::metrics::{FormLabels, SubscriptionLabels};
use crate::redis::RedisError;
use crate::redis::form::{Form, Reader};
use crate::redis::keys::KeySpecs;
use crate::redis::keys::admit::check_cluster_slots;
use crate::redis::lease::{ConsumerLease, LeaseHolder};
use crate::redis::stream;
use crate::session::io;
use crate::session::observe::{self, SubscriptionView};
use crate::session::{Event, OpenRequest, Opened, Outbound, Release, SessionError, Shared, Wanted};
use crate::window::Limits;

/// The least time between two extensions of one delivery (at most, a quarter of the time
/// after which another consumer may take it): a client asking more often costs nothing more in
/// Redis. Short, because the consumers of one group may each set their own `min_idle`: the
/// one that reclaims soonest decides.
const EXTEND_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

impl Subscription {
    /// Opens a subscription whose consumer name `release` holds on this sidecar: checks the
    /// key, takes the name's lease in Redis, opens the reader and tells the client.
    pub(in crate::session) async fn open(
        shared: &Arc<Shared>,
        id: String,
        source: Source,
        request: OpenRequest,
        out: &Outbound,
        release: Option<Release>,
        placement: Placement,
    ) -> Result<Subscription, SessionError> {
        let redis = &shared.redis;
        let explain = |err: RedisError| SessionError::Redis(redis.explain(err));
        let key_specs = shared.key_specs().await.map_err(explain)?;
        let mut form = Form::new(&source, request.dead_letter.as_deref());
        if let (Form::Stream(keys), Source::Stream(stream)) = (&mut form, &source)
            && shared.retained(&stream.key)
        {
            keys.ack_delete = shared.server().is_some_and(|s| s.ack_delete);
        }
        check_cluster_slots(
            redis.is_cluster(),
            &source,
            &form,
            request.dead_letter.as_deref(),
        )?;
        form.check_key(redis.pool()).await.map_err(explain)?;
        let holder = LeaseHolder::new(&shared.settings.instance, &id);
        let lease = form.lease(&source, holder, shared.settings.consumer_lease);
        if let Some(lease) = &lease {
            let wanted = match placement.partition {
                Some(_) => Wanted::ForPartition,
                None => Wanted::ByClient,
            };
            crate::session::take_lease(shared, lease, &source, wanted).await?;
        }
        let opened = Self::start(
            shared,
            id,
            source,
            request,
            form,
            out,
            key_specs,
            lease.clone(),
            placement,
        );
        match opened.await {
            Ok(mut subscription) => {
                subscription.release = release;
                Ok(subscription)
            }
            Err(err) => {
                if let Some(lease) = &lease {
                    let _ = lease.free(redis.pool()).await;
                }
                Err(err)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start(
        shared: &Arc<Shared>,
        id: String,
        source: Source,
        request: OpenRequest,
        form: Form,
        out: &Outbound,
        key_specs: Arc<KeySpecs>,
        lease: Option<ConsumerLease>,
        placement: Placement,
    ) -> Result<Subscription, SessionError> {
        let redis = &shared.redis;
        let settings = &shared.settings;
        let explain = |err: RedisError| SessionError::Redis(redis.explain(err));
        if let Source::Stream(stream) = &source {
            stream::ensure_group(redis.pool(), stream)
                .await
                .map_err(explain)?;
        }
        let reader = Reader::open(
            redis,
            &source,
            &form,
            request.max_deliveries,
            settings.replication,
        )
        .await
        .map_err(explain)?;
        let interrupter = reader.interrupter();
        let (reader_tx, requests) = mpsc::channel(1);
        let (results, reader_rx) = mpsc::channel(1);
        tokio::spawn(io::reader::read_loop(reader, requests, results).in_current_span());
        let form_name = source.form();
        let (flush_tx, jobs) = mpsc::unbounded_channel();
        let (reports, flush_rx) = mpsc::unbounded_channel();
        tokio::spawn(
            io::flusher::flush_loop(
                redis.clone(),
                Arc::clone(shared),
                (form_name, form.subscription()),
                request.mode,
                jobs,
                reports.clone(),
            )
            .in_current_span(),
        );
        let lane_tx =
            (request.ordering_key.is_some() && matches!(source, Source::Stream(_))).then(|| {
                let (lane_tx, reads) = mpsc::unbounded_channel();
                let lane = io::lane::read_lane(
                    redis.clone(),
                    Arc::clone(shared),
                    form_name,
                    reads,
                    reports,
                );
                tokio::spawn(lane.in_current_span());
                lane_tx
            });
        let every = settings.promote_interval;
        let helpers = vec![tokio::spawn(
            io::promoter::promote(redis.clone(), form.clone(), every).in_current_span(),
        )];
        if let Source::Stream(stream) = &source {
            shared
                .retention
                .register(&stream.key, crate::session::retention::Why::Seen);
        }
        shared.watched.watch(&source, &form);
        let sampler = Arc::clone(shared);
        let (sampled, sampled_form) = (source.clone(), form.clone());
        tokio::spawn(
            async move {
                let s = &sampler;
                crate::session::sampler::sample_now(&s.redis, &s.metrics, &sampled, &sampled_form)
                    .await;
            }
            .in_current_span(),
        );
        let (key, group, consumer) = source.describe();
        let view = SubscriptionView {
            id: id.clone(),
            form: form_name,
            key: key.clone(),
            group: group.clone(),
            consumer: consumer.clone(),
            mode: request.mode.as_str(),
            count: request.count,
            max_in_flight: request.max_in_flight,
            opened_at: observe::now_unix(),
            partition: placement.partition.clone(),
            ..Default::default()
        };
        let form_labels = FormLabels { form: form_name };
        shared.metrics.touch(form_name, request.mode.as_str());
        shared
            .metrics
            .subscriptions_open
            .get_or_create(&form_labels)
            .inc();
        info!(
            count = request.count,
            mode = request.mode.as_str(),
            max_in_flight = request.max_in_flight,
            "subscription opened"
        );
        let config = Config {
            kind: form.kind(),
            count: request.count,
            max_in_flight: request.max_in_flight,
            max_deliveries: request.max_deliveries,
            block: request.block,
            recovery_interval: settings.reclaim_interval,
            lease_renewal: lease.as_ref().map(|l| l.ttl / 3),
            read_ahead: settings.replication.is_none(),
            reports_in_reads: request.reports_in_reads,
            shutdown_grace: settings.shutdown_grace,
            limits: Limits {
                max_commands_per_slot: settings.max_commands_per_slot,
            },
            extend_every: match &source {
                Source::Stream(stream) => EXTEND_EVERY.min(stream.min_idle / 4),
                Source::List(list) => EXTEND_EVERY.min(list.dead_after / 4),
                Source::PubSub(_) => EXTEND_EVERY,
            },
            ordered: request.ordering_key.is_some(),
            // Entries waiting in memory (for their key, or a retry kept in place until it is
            // due) stay pending, idle to other consumers' reclaims: made idle again well
            // within the group's `min_idle`. A reliable list's lease keeps its whole
            // processing list.
            extend_waiting_every: match &source {
                Source::Stream(stream) => Some(stream.min_idle / 3),
                _ => None,
            },
            max_parked: settings.max_parked,
            // A partition's consumer name passes to another replica once its lease runs out:
            // stop writing a fifth of its lifetime before that.
            fence_after: lease
                .as_ref()
                .filter(|_| placement.partition.is_some())
                .map(|lease| lease.ttl * 4 / 5),
            numbered_from: placement.numbered_from,
        };
        let (lease_tx, lease_rx) = mpsc::unbounded_channel();
        let (fetch_tx, fetch_rx) = mpsc::unbounded_channel();
        let opened = Opened {
            subscription_id: id,
            source: source.clone(),
            request: request.clone(),
        };
        let mut subscription = Subscription {
            shared: Arc::clone(shared),
            stop: placement.stop,
            engine: Engine::new(config, Instant::now().into_std()),
            out: Some(out.clone()),
            ended_with: None,
            reader_tx,
            reader_rx,
            interrupter,
            flush_tx,
            lane_tx,
            flush_rx,
            fetch_tx,
            fetch_rx,
            lease,
            lease_tx,
            lease_rx,
            release: None,
            helpers,
            reading_since: None,
            read_spans: HashMap::new(),
            client_spans: HashMap::new(),
            poison: Default::default(),
            popped: HashMap::new(),
            held: Default::default(),
            view,
            form_labels,
            labels: SubscriptionLabels {
                key,
                group,
                consumer,
            },
            key_specs,
            request,
            source,
            form,
        };
        subscription.send(Event::Opened(Box::new(opened))).await;
        Ok(subscription)
    }
}
