//! The task that owns one subscription's window. It `select!`s over the client's messages, the
//! reads, the flush reports and shutdown. Reads run on a reader task with the subscription's
//! dedicated connection; flushes run in order on a flusher task over the pool (those that
//! queued go together in one round trip), so the client never waits for a flush before
//! getting the next read. While a stream has a backlog, the
//! next read rides at the end of a flush's pipeline instead (a read-ahead): one round trip per
//! read in all.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::SpanContext;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

use super::observe::{self, SubscriptionView};
use super::{
    ClientBatch, ClientMessage, Event, FlushReport, Inbound, InboundError, OpenRequest, Opened,
    Outbound, SessionError, Shared,
};
use crate::metrics::{
    FlushLabels, FormLabels, ModeLabels, OutcomeLabels, ReasonLabels, RoundTripLabels,
    SubscriptionLabels,
};
use crate::redis::entry::Entry;
use crate::redis::flush::{self, FlushPlan, FlushResult, Planned};
use crate::redis::form::{Form, Reader, Source};
use crate::redis::keys::KeySpecs;
use crate::redis::list::{self, ListKeys};
use crate::redis::plan::{PlanContext, Settling, plan_dead_letters, plan_flush};
use crate::redis::stream::{self, Mode, ReadBatch};
use crate::redis::{Redis, RedisError, hash_tag};
use crate::telemetry::format_traceparent;
use crate::window::{Command, CommandError, FlushBatch, Limits, ReadId, SlotError, SlotId, Window};
use fred::util::redis_keyslot;

/// A flush handed to the flusher task.
struct FlushJob {
    report: FlushReport,
    plan: FlushPlan,
    span: Option<BoxedSpan>,
}

enum ReaderCommand {
    Read { count: u32 },
    RereadPending,
}

/// One open subscription.
pub(super) struct Subscription<'a> {
    shared: Arc<Shared>,
    request: OpenRequest,
    source: Source,
    form: Form,
    /// The form's name, for metrics and spans.
    form_name: &'static str,
    window: Window<Arc<Entry>>,
    out: &'a Outbound,
    reader_tx: mpsc::Sender<ReaderCommand>,
    reader_rx: mpsc::Receiver<Result<ReadBatch, RedisError>>,
    /// Ends by itself once `reader_tx` is dropped and its read under way returns.
    reader_task: JoinHandle<()>,
    /// Taken at close, which ends the flusher once it has sent what it was given.
    flush_tx: Option<mpsc::UnboundedSender<FlushJob>>,
    flush_rx: mpsc::UnboundedReceiver<Flushed>,
    flusher: JoinHandle<()>,
    /// Background tasks that live as long as the subscription (promoter, sampler).
    helpers: Vec<JoinHandle<()>>,
    /// When the read under way was asked for; `None` when no read is under way.
    reading_since: Option<SystemTime>,
    /// The COUNT of the read under way (or of the last one).
    read_count: u32,
    /// The last read of new stream entries came back full: more are waiting, so the next read
    /// may ride on a flush.
    backlog: bool,
    /// When the stream reader reclaims idle entries next: read-aheads stop then, so the
    /// reader gets to run.
    next_reclaim: Option<Instant>,
    /// Flushes handed to the flusher whose reports have not come back.
    flushing: usize,
    /// Deliveries in those flushes. They count against the in-flight limit until flushed, so
    /// the flush queue (and memory) stays bounded when Redis is slower than the client.
    flushing_deliveries: usize,
    /// Stream entry ids in flushes under way, by read.
    flushing_ids: HashMap<ReadId, Vec<Bytes>>,
    /// Flushes reported with an unknown outcome that may still run (see
    /// [`flush::settle_unknown`]).
    unknown_flushes: usize,
    /// Reads asked of the reader, and answers received from it: the reader answers in order.
    reader_asked: u64,
    reader_answered: u64,
    /// Entries of flushes that ended while reader request `n` (and those before it) was under
    /// way, by `n`: pending or claimed entries that request returns may have been read before
    /// the flush's XACK ran, and must not be handed out again.
    settled_during_reads: Vec<(u64, Vec<Bytes>)>,
    /// With `reports_in_reads`: the report of a flush whose read-ahead is being delivered,
    /// to go out in that read's message (or alone, when the read delivers nothing).
    riding_report: Option<FlushReport>,
    /// The client is still there to receive messages.
    client_here: bool,
    /// Consecutive failed reads, for backoff.
    read_failures: u32,
    retry_read_at: Option<Instant>,
    /// Shutdown began: no more reads; ends at this deadline at the latest.
    draining_until: Option<Instant>,
    /// Spans of reads not yet flushed, and the client's contexts of settled slots, while
    /// tracing is on.
    read_spans: HashMap<ReadId, SpanContext>,
    client_spans: HashMap<SlotId, SpanContext>,
    view: SubscriptionView,
    labels: Labels,
    /// The server's command table: keys and categories, to apply the policy and, on a
    /// cluster, route and check side effects.
    key_specs: Arc<KeySpecs>,
    /// A settle failed on a list: read the processing list again once the window is empty
    /// (its values cannot be told from outstanding ones before that).
    reread_owed: bool,
}

/// Metric labels of this subscription, built once.
struct Labels {
    form: FormLabels,
    subscription: SubscriptionLabels,
}

impl<'a> Subscription<'a> {
    pub(super) async fn open(
        shared: &Arc<Shared>,
        id: String,
        source: Source,
        request: OpenRequest,
        out: &'a Outbound,
    ) -> Result<Subscription<'a>, SessionError> {
        let redis = &shared.redis;
        let explain = |err: RedisError| SessionError::Redis(redis.explain(err));
        let key_specs = shared.key_specs().await.map_err(explain)?;
        let form = Form::new(&source, request.dead_letter.as_deref());
        check_cluster_slots(
            redis.is_cluster(),
            &source,
            &form,
            request.dead_letter.as_deref(),
        )?;
        if let Source::Stream(stream) = &source {
            stream::ensure_group(redis.pool(), stream)
                .await
                .map_err(explain)?;
        }
        let reader = Reader::open(
            redis,
            &source,
            &form,
            request.block,
            shared.settings.reclaim_interval,
            shared.settings.replication,
        )
        .await
        .map_err(explain)?;
        let (reader_tx, commands) = mpsc::channel::<ReaderCommand>(4);
        let (results, reader_rx) = mpsc::channel(1);
        let give_back = match &form {
            Form::List(keys) if !keys.reliable => Some((redis.clone(), keys.clone())),
            _ => None,
        };
        let reader =
            tokio::spawn(read_loop(reader, commands, results, give_back).in_current_span());

        let form_name = source.form();
        let (flush_tx, jobs) = mpsc::unbounded_channel::<FlushJob>();
        let (reports, flush_rx) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(
            flush_loop(
                redis.clone(),
                Arc::clone(shared),
                form_name,
                request.mode,
                jobs,
                reports,
            )
            .in_current_span(),
        );
        let helpers = vec![
            tokio::spawn(
                promote(
                    redis.clone(),
                    form.clone(),
                    shared.settings.promote_interval,
                )
                .in_current_span(),
            ),
            tokio::spawn(
                observe::sample(
                    Arc::clone(shared),
                    source.clone(),
                    form.clone(),
                    shared.settings.sample_interval,
                )
                .in_current_span(),
            ),
        ];

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
            ..Default::default()
        };
        let labels = Labels {
            form: FormLabels { form: form_name },
            subscription: SubscriptionLabels {
                key,
                group,
                consumer,
            },
        };
        shared.metrics.touch(form_name, request.mode.as_str());
        shared
            .metrics
            .subscriptions_open
            .get_or_create(&labels.form)
            .inc();
        info!(
            count = request.count,
            mode = request.mode.as_str(),
            max_in_flight = request.max_in_flight,
            "subscription opened"
        );
        let opened = Opened {
            subscription_id: id,
            source: source.clone(),
            request: request.clone(),
        };
        let mut subscription = Subscription {
            shared: Arc::clone(shared),
            window: Window::new(Limits {
                max_commands_per_slot: shared.settings.max_commands_per_slot,
            }),
            out,
            reader_tx,
            reader_rx,
            reader_task: reader,
            flush_tx: Some(flush_tx),
            flush_rx,
            flusher,
            helpers,
            reading_since: None,
            read_count: 0,
            backlog: false,
            next_reclaim: None,
            flushing: 0,
            flushing_deliveries: 0,
            flushing_ids: HashMap::new(),
            unknown_flushes: 0,
            reader_asked: 0,
            reader_answered: 0,
            settled_during_reads: Vec::new(),
            riding_report: None,
            client_here: true,
            read_failures: 0,
            retry_read_at: None,
            draining_until: None,
            read_spans: HashMap::new(),
            client_spans: HashMap::new(),
            view,
            labels,
            key_specs,
            reread_owed: false,
            request,
            source,
            form,
            form_name,
        };
        subscription.publish_view();
        subscription.send(Event::Opened(Box::new(opened))).await;
        Ok(subscription)
    }

    /// Runs until the client leaves or shutdown completes. Returns the reader, which ends once
    /// its read under way returns: see [`super::run`].
    pub(super) async fn run(
        mut self,
        mut inbound: impl Stream<Item = Inbound> + Unpin,
    ) -> JoinHandle<()> {
        let mut ended_with: Option<SessionError> = None;
        loop {
            if self.draining_until.is_none() && self.client_here {
                self.request_read().await;
            }
            self.publish_view();
            if self.draining_until.is_some() && self.window.outstanding() == 0 {
                break;
            }
            tokio::select! {
                // Cancel-safe: a message is either returned or left in the stream.
                message = inbound.next() => match message {
                    Some(Ok(ClientMessage::Batch(batch))) => self.apply(batch).await,
                    Some(Ok(ClientMessage::Open(_))) => {
                        ended_with = Some(SessionError::SecondOpen);
                        break;
                    }
                    Some(Err(InboundError::Invalid(msg))) => {
                        ended_with = Some(SessionError::InvalidRequest(msg));
                        break;
                    }
                    Some(Err(InboundError::TooLarge(msg))) => {
                        ended_with = Some(SessionError::TooLarge(msg));
                        break;
                    }
                    // The client half-closed: it reads no further deliveries but still
                    // gets the reports of what it settled.
                    None => break,
                    Some(Err(InboundError::Transport(_))) => {
                        self.client_here = false;
                        break;
                    }
                },
                // Cancel-safe: mpsc receive.
                Some(batch) = self.reader_rx.recv() => {
                    let started = self.reading_since.take();
                    self.reader_answered += 1;
                    // While draining, entries read now stay pending and come back later.
                    if self.draining_until.is_none() {
                        self.deliver(batch, started.unwrap_or_else(SystemTime::now)).await;
                    }
                    let answered = self.reader_answered;
                    self.settled_during_reads.retain(|(asked, _)| *asked > answered);
                }
                // Cancel-safe: mpsc receive.
                Some(flushed) = self.flush_rx.recv() => self.flushed(flushed).await,
                () = self.shared.shutdown.cancelled(), if self.draining_until.is_none() => {
                    let grace = self.shared.settings.shutdown_grace;
                    info!(outstanding = self.window.outstanding(), ?grace, "shutdown: waiting for outstanding outcomes");
                    self.draining_until = Some(Instant::now() + grace);
                    self.view.draining = true;
                    ended_with = Some(SessionError::ShuttingDown);
                    let outstanding = self.window.outstanding();
                    if outstanding > 0 {
                        self.send(Event::Draining { grace, outstanding }).await;
                    }
                }
                () = sleep_until(self.draining_until) => break,
                () = sleep_until(self.retry_read_at) => self.retry_read_at = None,
            }
            if !self.client_here {
                break;
            }
        }
        self.close(ended_with).await
    }

    /// How many more deliveries the window may take.
    fn room(&self) -> usize {
        // One read's worth of deliveries waiting for their flush is free, so the next read
        // overlaps the flush; beyond that they count, so a slow Redis backs up in Redis.
        let waiting = self
            .flushing_deliveries
            .saturating_sub(self.request.count as usize);
        // Every delivery of a read not yet flushed is in flight, settled or not: what a crash
        // can lose on a simple list, and what the window holds in memory.
        (self.request.max_in_flight as usize).saturating_sub(self.window.held() + waiting)
    }

    /// Asks the reader for more when the window has room and no read is under way.
    async fn request_read(&mut self) {
        let room = self.room();
        if self.reading_since.is_some() || room == 0 || self.retry_read_at.is_some() {
            return;
        }
        // A stream's re-read skips entries the window holds or flushes by id; it waits only
        // until no flush of unknown outcome can still run (its transactions would otherwise
        // race the entries' second delivery). A list's re-read cannot tell its values from
        // outstanding ones: it waits for an empty window and no flush under way.
        let reread_ready = match self.form {
            Form::Stream(_) => self.unknown_flushes == 0,
            _ => self.flushing == 0 && self.window.held() == 0,
        };
        if self.reread_owed && reread_ready {
            debug!("reading this consumer's pending entries again");
            self.reread_owed = false;
            let _ = self.reader_tx.send(ReaderCommand::RereadPending).await;
        }
        let count = room.min(self.request.count as usize) as u32;
        if self
            .reader_tx
            .send(ReaderCommand::Read { count })
            .await
            .is_ok()
        {
            self.reading_since = Some(SystemTime::now());
            self.read_count = count;
            self.reader_asked += 1;
        }
    }

    /// The read to send at the end of a flush about to go, when the next read would be asked
    /// for at once anyway (a stream with a backlog and room in the window) and the reader has
    /// no work of its own (re-reading pending entries, reclaiming, waiting for replicas).
    /// Call with the flush's deliveries already counted as flushing.
    fn read_ahead(&mut self) -> Option<Planned> {
        let Form::Stream(keys) = &self.form else {
            return None;
        };
        let reader_has_work = self.reread_owed
            || self.shared.settings.replication.is_some()
            || self.next_reclaim.is_none_or(|at| Instant::now() >= at);
        let room = self.room();
        if !self.backlog
            || reader_has_work
            || room == 0
            || self.reading_since.is_some()
            || self.retry_read_at.is_some()
            || self.draining_until.is_some()
            || !self.client_here
        {
            return None;
        }
        let count = room.min(self.request.count as usize) as u32;
        self.reading_since = Some(SystemTime::now());
        self.read_count = count;
        Some(stream::read_ahead(keys, count))
    }

    /// A read-ahead came back with its flush's report.
    async fn read_ahead_returned(&mut self, read: ReadAhead) {
        let started = self.reading_since.take();
        match read {
            ReadAhead::Read(batch) => {
                self.shared
                    .metrics
                    .read_aheads
                    .get_or_create(&self.labels.form)
                    .inc();
                // While draining or closing, entries read now stay pending on this consumer
                // and come back later, as those of the reader's read under way do.
                if self.draining_until.is_none() && self.flush_tx.is_some() {
                    self.deliver(Ok(batch), started.unwrap_or_else(SystemTime::now))
                        .await;
                }
            }
            ReadAhead::Failed { error, unknown } => {
                debug!(%error, unknown, "a read-ahead failed; the reader reads next");
                self.backlog = false;
                // Redis may have delivered entries to this consumer that no reply told of:
                // only its pending entries list has them now.
                self.reread_owed |= unknown;
            }
        }
    }

    async fn deliver(&mut self, batch: Result<ReadBatch, RedisError>, started: SystemTime) {
        let batch = match batch {
            Ok(batch) => {
                self.read_failures = 0;
                batch
            }
            Err(err) => return self.read_failed(err).await,
        };
        self.backlog = !batch.redelivery && batch.entries.len() >= self.read_count as usize;
        if batch.next_reclaim.is_some() {
            self.next_reclaim = batch.next_reclaim;
        }
        let form = self.form_name;
        let metrics = &self.shared.metrics;
        for (kind, n) in [
            ("read", batch.reads),
            ("claim", batch.claims),
            ("pending_counts", batch.count_lookups),
        ] {
            if n > 0 {
                metrics
                    .round_trips
                    .get_or_create(&RoundTripLabels { form, kind })
                    .inc_by(n.into());
            }
        }
        metrics
            .reclaimed
            .get_or_create(&self.labels.form)
            .inc_by(batch.claimed as u64);
        let mut entries = batch.entries;
        if batch.redelivery && matches!(self.form, Form::Stream(_)) {
            // A pending or claimed entry may be one this window already handed out: still
            // outstanding, settled in a read not yet flushed, or in a flush under way (whose
            // failure brings it back by a re-read).
            let held: HashSet<&Bytes> = self
                .window
                .held_entries()
                .map(|e| &e.id)
                .chain(self.flushing_ids.values().flatten())
                .chain(self.settled_during_reads.iter().flat_map(|(_, ids)| ids))
                .collect();
            entries.retain(|e| !held.contains(&e.id));
        }
        let cap = self.request.max_deliveries;
        if cap > 0 && entries.iter().any(|e| e.delivery_count > cap) {
            // Delivered more often than allowed without an outcome (a client that crashes on
            // it): straight to the dead letter, not to the client again.
            let (dead, alive): (Vec<_>, Vec<_>) =
                entries.into_iter().partition(|e| e.delivery_count > cap);
            entries = alive;
            self.dead_letter(dead);
        }
        let entries: Vec<Arc<Entry>> = entries.into_iter().map(Arc::new).collect();
        let lost = batch.lost;
        let Some(read) = self.window.open_read(entries.clone()) else {
            if lost > 0 {
                // Nothing to deliver, but the client must still learn what it lost.
                self.send(Event::Read {
                    read_id: 0,
                    first_slot: 0,
                    entries,
                    lost,
                    read_trace: None,
                    flushed: None,
                })
                .await;
            }
            return;
        };
        let n = entries.len() as u64;
        debug!(
            read_id = read.read_id,
            deliveries = n,
            first_slot = read.first_slot,
            "read"
        );
        let metrics = &self.shared.metrics;
        metrics.reads.get_or_create(&self.labels.form).inc();
        metrics
            .deliveries
            .get_or_create(&self.labels.form)
            .inc_by(n);
        self.view.counters.reads += 1;
        self.view.counters.deliveries += n;
        if batch.redelivery {
            metrics
                .redeliveries
                .get_or_create(&self.labels.form)
                .inc_by(n);
            self.view.counters.redeliveries += n;
        }
        let read_trace = if self.shared.settings.tracing {
            let context = observe::read_span(
                &self.view,
                read.read_id,
                &entries,
                batch.redelivery,
                started,
            );
            let traceparent = format_traceparent(&context);
            self.read_spans.insert(read.read_id, context);
            traceparent
        } else {
            None
        };
        let flushed = self.riding_report.take();
        self.send(Event::Read {
            read_id: read.read_id,
            first_slot: read.first_slot,
            entries,
            lost,
            read_trace,
            flushed,
        })
        .await;
    }

    /// Moves entries past the delivery cap to the dead letter with their settle, reported as a
    /// flush of read 0.
    fn dead_letter(&mut self, entries: Vec<Entry>) {
        let refs: Vec<&Entry> = entries.iter().collect();
        let plan = plan_dead_letters(
            &self.form,
            &refs,
            "delivered more often than max_deliveries without an outcome",
        );
        warn!(
            entries = entries.len(),
            "entries past max_deliveries go to the dead letter"
        );
        let report = FlushReport {
            read_id: 0,
            segments_kept: 0,
            segments_dropped: 0,
            commands: 0,
            settles: plan.settles,
            dead_lettered: plan.dead_lettered,
            result: FlushResult::default(),
        };
        let Some(flush_tx) = &self.flush_tx else {
            return;
        };
        if flush_tx
            .send(FlushJob {
                report,
                plan,
                span: None,
            })
            .is_ok()
        {
            self.flushing += 1;
        }
    }

    async fn read_failed(&mut self, err: RedisError) {
        // The failed read may have claimed entries it never returned (its reply, or the WAIT
        // after it, was lost): they are pending on this consumer, so read those again.
        self.reread_owed = true;
        self.read_failures += 1;
        let backoff = Duration::from_millis(100 << self.read_failures.min(5));
        if self.read_failures == 1 {
            warn!(error = %err, "read failed; retrying");
        }
        if let RedisError::Refused { message, .. } = &err
            && message.starts_with("NOGROUP")
            && let Source::Stream(stream) = &self.source
        {
            // The group was deleted under us: recreate it and go on.
            let _ = stream::ensure_group(self.shared.redis.pool(), stream).await;
        }
        self.retry_read_at = Some(Instant::now() + backoff);
    }

    async fn apply(&mut self, batch: ClientBatch) {
        let mut rejected = Vec::new();
        for (slot, command) in batch.commands {
            let command = command.and_then(|c| self.admit(c));
            if let Err(err) = self.window.queue(slot, command) {
                rejected.push(err);
            }
        }
        for outcome in batch.outcomes {
            let result = outcome.and_then(|settle| {
                if let Some(entry) = self.window.outstanding_entry(settle.slot)
                    && let Some(why) = self.form.refuses(entry, &settle.outcome)
                {
                    return Err(SlotError::InvalidOutcome {
                        slot: settle.slot,
                        reason: why.to_owned(),
                    });
                }
                let flush = self
                    .window
                    .settle(settle.slot, settle.outcome, settle.reason)?;
                let kind = settle.outcome.as_str();
                self.shared
                    .metrics
                    .outcomes
                    .get_or_create(&OutcomeLabels {
                        form: self.form_name,
                        outcome: kind,
                    })
                    .inc();
                *self.view.counters.outcomes.entry(kind).or_default() += 1;
                if let Some(trace) = settle.trace.filter(|_| self.shared.settings.tracing) {
                    self.client_spans.insert(settle.slot, trace);
                }
                Ok(flush)
            });
            match result {
                Ok(Some(batch)) => self.flush(batch),
                Ok(None) => {}
                Err(err) => rejected.push(err),
            }
        }
        if !rejected.is_empty() {
            for err in &rejected {
                self.shared
                    .metrics
                    .rejections
                    .get_or_create(&ReasonLabels {
                        reason: rejection_reason(err),
                    })
                    .inc();
            }
            self.view.counters.rejections += rejected.len() as u64;
            self.send(Event::Rejected(rejected)).await;
        }
    }

    /// Applies the operator's policy to a command and, on a cluster, finds where it must run.
    /// In atomic mode every key must share the subscription's slot (the transaction runs on
    /// that node, with the settle); a key elsewhere is refused now, before anything is sent.
    fn admit(&self, mut command: Command) -> Result<Command, CommandError> {
        let specs = &self.key_specs;
        let policy = &self.shared.settings.policy;
        let unknown = |_| CommandError::Unknown(command.name.clone());
        let (full_name, categories) = specs
            .categories(&command.name, &command.args)
            .map_err(unknown)?;
        let refused = |source| CommandError::Policy {
            command: command.name.clone(),
            source,
        };
        policy
            .check_command(&full_name, categories, &command.args)
            .map_err(refused)?;
        let keys = specs.keys(&command.name, &command.args).map_err(unknown)?;
        for key in &keys {
            policy.check_key(key).map_err(refused)?;
        }
        if !self.shared.redis.is_cluster() {
            return Ok(command);
        }
        match self.request.mode {
            Mode::Atomic => {
                let Some(slot) = self.form.slot() else {
                    // Pub/sub has no key: a transaction goes to the node of its first key.
                    command.hash_slot = keys.first().map(|k| redis_keyslot(k));
                    return Ok(command);
                };
                if let Some(key) = keys.iter().find(|k| redis_keyslot(k) != slot) {
                    let (subscription_key, _, _) = self.source.describe();
                    let tag = hash_tag(&subscription_key)
                        .unwrap_or(&subscription_key)
                        .to_owned();
                    return Err(CommandError::CrossSlot {
                        command: command.name.clone(),
                        key: String::from_utf8_lossy(key).into_owned(),
                        key_slot: redis_keyslot(key),
                        subscription_key,
                        subscription_slot: slot,
                        tag,
                    });
                }
                command.hash_slot = Some(slot);
            }
            Mode::Pipeline => command.hash_slot = keys.first().map(|k| redis_keyslot(k)),
        }
        Ok(command)
    }

    fn flush(&mut self, batch: FlushBatch<Arc<Entry>>) {
        let now_ms = now_ms();
        let ctx = PlanContext {
            mode: self.request.mode,
            now_ms,
            max_deliveries: self.request.max_deliveries,
        };
        let mut plan = plan_flush(&self.form, &batch, &ctx);
        let span = self.shared.settings.tracing.then(|| {
            let client = batch
                .settles
                .iter()
                .filter_map(|s| self.client_spans.remove(&s.slot))
                .collect();
            let read = self.read_spans.remove(&batch.read_id);
            observe::flush_span(&self.view, &batch, read, client, plan.side_effects)
        });
        let report = FlushReport {
            read_id: batch.read_id,
            segments_kept: batch.kept.len(),
            segments_dropped: batch.dropped_segments(),
            commands: plan.side_effects,
            settles: plan.settles,
            dead_lettered: plan.dead_lettered,
            result: FlushResult::default(),
        };
        if self.flush_tx.is_none() {
            return;
        }
        let deliveries = report.segments_kept + report.segments_dropped;
        let read_id = report.read_id;
        self.flushing_deliveries += deliveries;
        plan.read_ahead = self.read_ahead();
        let read_ahead = plan.read_ahead.is_some();
        let job = FlushJob { report, plan, span };
        if self
            .flush_tx
            .as_ref()
            .is_some_and(|tx| tx.send(job).is_ok())
        {
            self.flushing += 1;
            if matches!(self.form, Form::Stream(_)) {
                let ids = batch.settles.iter().map(|s| s.entry.id.clone());
                self.flushing_ids.entry(read_id).or_default().extend(ids);
            }
        } else {
            // The flusher is gone (closing): neither the flush nor its read-ahead runs.
            self.flushing_deliveries -= deliveries;
            if read_ahead {
                self.reading_since = None;
            }
        }
    }

    async fn flushed(&mut self, flushed: Flushed) {
        match flushed {
            Flushed::Report(report, read_ahead) => {
                let rides =
                    self.request.reports_in_reads && matches!(read_ahead, Some(ReadAhead::Read(_)));
                self.reported(report, rides).await;
                if let Some(read) = read_ahead {
                    self.read_ahead_returned(read).await;
                }
                if let Some(report) = self.riding_report.take() {
                    self.send(Event::Flushed(report)).await;
                }
            }
            Flushed::Settled(read_id) => {
                debug!(read_id, "the flush of unknown outcome can no longer run");
                self.unknown_flushes -= 1;
                self.flush_ended(read_id);
            }
        }
    }

    fn flush_ended(&mut self, read_id: ReadId) {
        self.flushing -= 1;
        if let Some(ids) = self.flushing_ids.remove(&read_id)
            && self.reader_answered < self.reader_asked
        {
            // The reader's read under way may have run before this flush's XACK; those after
            // it cannot return these entries.
            self.settled_during_reads.push((self.reader_asked, ids));
        }
    }

    /// A flush's report: bookkeeping, then to the client, or kept to ride on the read that
    /// came back with it.
    async fn reported(&mut self, report: FlushReport, rides: bool) {
        // A flush with an unknown outcome stays under way until nothing of it can run any
        // more (`Flushed::Settled`): its entries are read again only then.
        if report.result.unknown {
            self.unknown_flushes += 1;
        } else {
            self.flush_ended(report.read_id);
        }
        self.flushing_deliveries = self
            .flushing_deliveries
            .saturating_sub(report.segments_kept + report.segments_dropped);
        debug!(
            read_id = report.read_id,
            kept = report.segments_kept,
            settles = report.settles,
            ok = report.result.ok(),
            "flushed"
        );
        self.view.counters.flushes += 1;
        if !report.result.ok() {
            self.view.counters.failed_flushes += 1;
            warn!(
                read_id = report.read_id,
                commands = report.commands,
                settles = report.settles,
                failed = report.result.failed,
                settle_failed = report.result.settle_failed,
                outcome_unknown = report.result.unknown,
                error = report.result.first_error.as_deref().unwrap_or(""),
                "flush failed"
            );
            if report.result.settle_failed || report.result.unknown {
                // The read's entries are still pending on this consumer: read them again.
                self.reread_owed = true;
            }
        }
        if rides {
            self.riding_report = Some(report);
        } else {
            self.send(Event::Flushed(report)).await;
        }
    }

    async fn send(&mut self, event: Event) {
        if self.client_here && self.out.send(Ok(event)).await.is_err() {
            // The response stream was dropped: the client is gone.
            self.client_here = false;
        }
    }

    /// Refreshes the admin view and the outstanding gauge.
    fn publish_view(&mut self) {
        self.view.reads_in_flight = u32::from(self.reading_since.is_some());
        self.view.open_reads = self.window.open_reads();
        self.view.outstanding_deliveries = self.window.outstanding();
        self.view.kept_segments = self.window.kept_segments();
        self.view.flushes_in_flight = self.flushing;
        self.shared
            .metrics
            .outstanding
            .get_or_create(&self.labels.subscription)
            .set(self.window.outstanding() as i64);
        self.shared
            .views
            .lock()
            .expect("not poisoned")
            .insert(self.view.id.clone(), self.view.clone());
    }

    /// Abandons what is outstanding, flushes what is owed and waits for it, then ends the
    /// stream.
    async fn close(mut self, ended_with: Option<SessionError>) -> JoinHandle<()> {
        let abandoned = self.window.outstanding();
        // The flushes below carry no read-ahead.
        self.backlog = false;
        if let Form::List(keys) = &self.form
            && !keys.reliable
        {
            // A simple list's popped entries exist nowhere else. First what the read under way
            // took (the newest; wait for it, at most BLOCK), then below the outstanding ones,
            // so that pushed back they are read again in their order.
            let (stop, _) = mpsc::channel(1);
            drop(std::mem::replace(&mut self.reader_tx, stop));
            while let Some(batch) = self.reader_rx.recv().await {
                if let Ok(batch) = batch {
                    list::give_back(self.shared.redis.pool(), keys, &batch.entries).await;
                }
            }
        }
        // A simple list's entries left without an outcome are pushed back (a crash still
        // loses them, at most the in-flight limit).
        let give_back: Vec<Entry> = match &self.form {
            Form::List(keys) if !keys.reliable => self
                .window
                .outstanding_entries()
                .map(|e| (**e).clone())
                .collect(),
            _ => Vec::new(),
        };
        let batches = self.window.abandon_all();
        let owed = batches.len();
        for batch in batches {
            self.flush(batch);
        }
        if let Form::List(keys) = &self.form
            && !give_back.is_empty()
        {
            list::give_back(self.shared.redis.pool(), keys, &give_back).await;
        }
        self.flush_tx = None;
        while self.flushing > 0 {
            match self.flush_rx.recv().await {
                Some(flushed) => self.flushed(flushed).await,
                None => break,
            }
        }
        let _ = (&mut self.flusher).await;
        for helper in &self.helpers {
            helper.abort();
        }
        // The reader stops once its read under way returns (closing its connection); entries
        // that read took stay pending on this consumer and come back (a simple list's are
        // pushed back).
        drop(self.reader_tx);
        drop(self.reader_rx);

        let metrics = &self.shared.metrics;
        metrics
            .subscriptions_open
            .get_or_create(&self.labels.form)
            .dec();
        metrics.outstanding.remove(&self.labels.subscription);
        observe::forget(&self.shared, &self.source, &self.form);
        self.shared
            .views
            .lock()
            .expect("not poisoned")
            .remove(&self.view.id);
        let c = &self.view.counters;
        info!(
            reads = c.reads,
            deliveries = c.deliveries,
            flushes = c.flushes,
            failed_flushes = c.failed_flushes,
            flushed_at_close = owed,
            left_pending = abandoned,
            outcomes = ?c.outcomes,
            "subscription closed"
        );
        if let Some(err) = ended_with
            && self.client_here
        {
            let _ = self.out.send(Err(err)).await;
        }
        self.reader_task
    }
}

/// The rejection reason label of a slot error.
fn rejection_reason(err: &SlotError) -> &'static str {
    match err {
        SlotError::UnknownSlot(_) => "unknown_slot",
        SlotError::AlreadySettled(_) => "already_settled",
        SlotError::InvalidCommand { source, .. } => match source {
            crate::window::CommandError::Forbidden { .. } => "forbidden_command",
            crate::window::CommandError::CrossSlot { .. } => "cross_slot",
            crate::window::CommandError::Policy { source, .. } if source.is_limit() => {
                "limit_exceeded"
            }
            crate::window::CommandError::Policy { .. } => "permission_denied",
            _ => "invalid_command",
        },
        SlotError::TooManyCommands { .. } => "limit_exceeded",
        SlotError::InvalidOutcome { .. } => "invalid_outcome",
        SlotError::IncompleteSegment(_) => "incomplete_segment",
    }
}

/// Serves read requests on the subscription's dedicated connection. A simple list's entries
/// popped after the subscription went away are pushed back rather than lost.
async fn read_loop(
    mut reader: Reader,
    mut commands: mpsc::Receiver<ReaderCommand>,
    results: mpsc::Sender<Result<ReadBatch, RedisError>>,
    give_back: Option<(Redis, ListKeys)>,
) {
    while let Some(command) = commands.recv().await {
        match command {
            ReaderCommand::RereadPending => reader.reread_pending(),
            ReaderCommand::Read { count } => {
                let batch = reader.read(count).await;
                if let Err(mpsc::error::SendError(Ok(unsent))) = results.send(batch).await {
                    if let Some((redis, keys)) = &give_back {
                        list::give_back(redis.pool(), keys, &unsent.entries).await;
                    }
                    break;
                }
            }
        }
    }
    reader.close().await;
}

/// Runs flushes one after another, so side effects of later reads never overtake earlier ones.
/// Flushes that queued while one was under way go together, in order, in the next pipeline:
/// one round trip for all of them, so a flusher that falls behind catches up rather than
/// queueing further. The queue is bounded by the in-flight limit: deliveries waiting for their
/// flush count against it.
async fn flush_loop(
    redis: Redis,
    shared: Arc<Shared>,
    form: &'static str,
    mode: Mode,
    mut jobs: mpsc::UnboundedReceiver<FlushJob>,
    reports: mpsc::UnboundedSender<Flushed>,
) {
    let metrics = &shared.metrics;
    let labels = FormLabels { form };
    let duration = metrics
        .flush_duration
        .get_or_create(&ModeLabels {
            form,
            mode: mode.as_str(),
        })
        .clone();
    let round_trips = metrics
        .round_trips
        .get_or_create(&RoundTripLabels {
            form,
            kind: "flush",
        })
        .clone();
    let mut group = Vec::new();
    while jobs.recv_many(&mut group, MAX_FLUSHES_PER_ROUND_TRIP).await > 0 {
        let started = Instant::now();
        let client = redis.pool();
        let plans: Vec<&FlushPlan> = group.iter().map(|job| &job.plan).collect();
        let results = flush::execute(client, &plans, redis.timeout()).await;
        let elapsed = started.elapsed().as_secs_f64();
        round_trips.inc();
        let mut unknown = Vec::new();
        for (job, (result, read_ahead)) in group.drain(..).zip(results) {
            let FlushJob {
                mut report, span, ..
            } = job;
            report.result = result;
            duration.observe(elapsed);
            let outcome = if report.result.ok() { "ok" } else { "failed" };
            metrics
                .flushes
                .get_or_create(&FlushLabels {
                    form,
                    mode: mode.as_str(),
                    result: outcome,
                })
                .inc();
            metrics
                .flush_commands
                .get_or_create(&labels)
                .observe(report.commands as f64);
            metrics
                .flush_settles
                .get_or_create(&labels)
                .observe(report.settles as f64);
            if let Some(span) = span {
                observe::end_flush_span(span, &report.result);
            }
            if report.result.unknown {
                unknown.push(report.read_id);
            }
            let read_ahead = read_ahead.map(ReadAhead::from_reply);
            if reports.send(Flushed::Report(report, read_ahead)).is_err() {
                return;
            }
        }
        if !unknown.is_empty() {
            // Their entries will be read again: first let what fred may still write of them
            // go. Beside the next flushes, which go on (and fail fast while Redis is away).
            let (client, reports) = (client.clone(), reports.clone());
            tokio::spawn(async move {
                flush::settle_unknown(&client, UNKNOWN_FLUSH_BARRIER).await;
                for read_id in unknown {
                    let _ = reports.send(Flushed::Settled(read_id));
                }
            });
        }
    }
}

/// What the flusher tells its subscription.
enum Flushed {
    /// A flush is done; its report goes to the client. With what its read-ahead read.
    Report(FlushReport, Option<ReadAhead>),
    /// A flush reported with an unknown outcome can no longer run (see
    /// [`flush::settle_unknown`]).
    Settled(ReadId),
}

/// What a read that rode at the end of a flush read.
enum ReadAhead {
    Read(ReadBatch),
    /// `unknown`: no reply came, so Redis may have delivered entries to this consumer.
    Failed {
        error: RedisError,
        unknown: bool,
    },
}

impl ReadAhead {
    fn from_reply(reply: Result<fred::prelude::Value, fred::error::Error>) -> Self {
        match reply {
            Ok(reply) => match stream::read_ahead_batch(reply) {
                Ok(batch) => ReadAhead::Read(batch),
                Err(error) => ReadAhead::Failed {
                    error,
                    unknown: false,
                },
            },
            Err(err) => ReadAhead::Failed {
                unknown: flush::unanswered(&err),
                error: RedisError::from_fred("XREADGROUP", &err),
            },
        }
    }
}

/// How long a flush with an unknown outcome waits for its connection to come back, so that
/// nothing of it can still run after its entries are read again.
const UNKNOWN_FLUSH_BARRIER: Duration = Duration::from_secs(60);

/// The most queued flushes one pipeline carries (each at most a read's worth of segments).
const MAX_FLUSHES_PER_ROUND_TRIP: usize = 16;

/// Now, in Unix milliseconds (the unit of the delay set's scores).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Sleeps until the deadline, or forever when there is none.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Moves due retry_after entries back, for as long as the subscription runs.
async fn promote(redis: Redis, form: Form, every: Duration) {
    const LIMIT: u32 = 256;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            let now_ms = now_ms();
            match form.promote_due(&redis, now_ms, LIMIT).await {
                Ok(n) if n == u64::from(LIMIT) => continue,
                Ok(n) => {
                    if n > 0 {
                        debug!(promoted = n, "retry_after entries are due again");
                    }
                    break;
                }
                Err(err) => {
                    debug!(error = %err, "promoting delayed entries failed; will try again");
                    break;
                }
            }
        }
    }
}

/// On a cluster, everything a subscription writes atomically must share the slot of its key:
/// refuse to open otherwise, with the fix.
fn check_cluster_slots(
    cluster: bool,
    source: &Source,
    form: &Form,
    dead_letter: Option<&str>,
) -> Result<(), SessionError> {
    if !cluster {
        return Ok(());
    }
    let Some(slot) = form.slot() else {
        return Ok(());
    };
    let (key, _, _) = source.describe();
    let mut names: Vec<Bytes> = vec![form.delayed().clone()];
    if let Form::List(keys) = form {
        names.extend(keys.companions().into_iter().cloned());
    }
    if let Some(target) = dead_letter {
        names.push(Bytes::copy_from_slice(target.as_bytes()));
    }
    match names.iter().find(|name| redis_keyslot(name) != slot) {
        Some(name) => Err(SessionError::InvalidRequest(format!(
            "on a cluster, {:?} must be in the hash slot of {key:?} ({slot}) to be written atomically with its settles, but it is in slot {}; use a key with a hash tag, such as \"{{{}}}\" for the subscription and \"{{{}}}:dead\" for its dead letter",
            String::from_utf8_lossy(name),
            redis_keyslot(name),
            hash_tag(&key).unwrap_or(&key),
            hash_tag(&key).unwrap_or(&key),
        ))),
        None => Ok(()),
    }
}
