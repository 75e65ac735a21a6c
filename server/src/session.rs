//! One subscription stream: the task that owns its window and `select!`s over the client's
//! messages, the reads, the flush results and shutdown. Reads run on a reader task with the
//! subscription's dedicated connection; flushes run in order on a flusher task over the pool,
//! so the client never waits for a flush before getting the next read.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fred::interfaces::ClientLike;
use futures::{Stream, StreamExt};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::redis::entry::Entry;
use crate::redis::flush::{self, FlushResult};
use crate::redis::stream::{self, Mode, ReadBatch, StreamKeys, StreamReader, StreamSource};
use crate::redis::{Redis, RedisError};
use crate::window::{
    Command, CommandError, FlushBatch, Limits, Outcome, ReadId, SlotError, SlotId, Window,
};

/// Settings every session shares, from the configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub default_consumer: String,
    pub max_commands_per_slot: usize,
    pub shutdown_grace: Duration,
    pub promote_interval: Duration,
    pub reclaim_interval: Duration,
}

/// What all sessions of the process share.
#[derive(Debug)]
pub struct Shared {
    pub redis: Redis,
    pub settings: Settings,
    /// Cancelled on SIGTERM/SIGINT: sessions stop reading and drain.
    pub shutdown: CancellationToken,
    next_id: AtomicU64,
    /// (key, group, consumer) of open stream subscriptions: two readers with one consumer name
    /// would read each other's pending entries.
    consumers: Mutex<HashSet<(String, String, String)>>,
}

impl Shared {
    pub fn new(redis: Redis, settings: Settings, shutdown: CancellationToken) -> Self {
        Self {
            redis,
            settings,
            shutdown,
            next_id: AtomicU64::new(1),
            consumers: Mutex::new(HashSet::new()),
        }
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
}

/// What a subscription reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A stream through a consumer group. An empty consumer means the sidecar's default.
    Stream(StreamSource),
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
}

/// An outcome for a slot, with the client's reason.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleRequest {
    pub slot: SlotId,
    pub outcome: Outcome,
    pub reason: Option<String>,
}

/// What the session tells the client.
#[derive(Debug)]
pub enum Event {
    Opened(Opened),
    Read {
        read_id: ReadId,
        first_slot: SlotId,
        entries: Vec<Arc<Entry>>,
    },
    Flushed(FlushReport),
    Rejected(Vec<SlotError>),
}

/// The settings in effect for an opened subscription.
#[derive(Clone, Debug)]
pub struct Opened {
    pub subscription_id: String,
    /// The source with the consumer name in use filled in.
    pub source: StreamSource,
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
        "consumer {consumer:?} is already reading {key:?} in group {group:?} on this sidecar; give each subscription its own consumer name (or wait for the other stream to close)"
    )]
    ConsumerBusy {
        key: String,
        group: String,
        consumer: String,
    },
    #[error("cannot open the subscription: {0}")]
    Redis(#[from] RedisError),
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
    /// The transport failed: the client is gone.
    #[error("the client's stream failed: {0}")]
    Transport(String),
}

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
            Some(Err(InboundError::Transport(_))) | None => return,
        },
        () = shared.shutdown.cancelled() => return fail(&out, SessionError::ShuttingDown).await,
    };
    let id = format!("sub-{}", shared.next_id.fetch_add(1, Ordering::Relaxed));
    let Source::Stream(mut source) = open.source.clone();
    if source.consumer.is_empty() {
        source.consumer = shared.settings.default_consumer.clone();
    }
    let span = info_span!("subscription", id = %id, key = %source.key, group = %source.group, consumer = %source.consumer);
    async move {
        let claim = (
            source.key.clone(),
            source.group.clone(),
            source.consumer.clone(),
        );
        if !shared
            .consumers
            .lock()
            .expect("not poisoned")
            .insert(claim.clone())
        {
            let (key, group, consumer) = claim;
            return fail(
                &out,
                SessionError::ConsumerBusy {
                    key,
                    group,
                    consumer,
                },
            )
            .await;
        }
        let _release = Release(&shared, claim);
        match Session::open(&shared, id, source, open, &out).await {
            Ok(session) => session.run(inbound).await,
            Err(err) => fail(&out, err).await,
        }
    }
    .instrument(span)
    .await
}

async fn fail(out: &Outbound, err: SessionError) {
    debug!(error = %err, "ending the subscription stream");
    let _ = out.send(Err(err)).await;
}

/// Frees a consumer name when its session ends, however it ends.
struct Release<'a>(&'a Shared, (String, String, String));

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0
            .consumers
            .lock()
            .expect("not poisoned")
            .remove(&self.1);
    }
}

/// A flush handed to the flusher task.
struct FlushJob {
    report: FlushReport,
    plan: flush::FlushPlan,
}

enum ReaderCommand {
    Read { count: u32 },
    RereadPending,
}

struct Session<'a> {
    shared: &'a Shared,
    id: String,
    request: OpenRequest,
    source: StreamSource,
    keys: StreamKeys,
    window: Window<Arc<Entry>>,
    out: &'a Outbound,
    reader_tx: mpsc::Sender<ReaderCommand>,
    reader_rx: mpsc::Receiver<Result<ReadBatch, RedisError>>,
    reader: JoinHandle<()>,
    reader_client: fred::clients::Client,
    /// Taken at close, which ends the flusher once it has sent what it was given.
    flush_tx: Option<mpsc::UnboundedSender<FlushJob>>,
    flush_rx: mpsc::UnboundedReceiver<FlushReport>,
    flusher: JoinHandle<()>,
    promoter: JoinHandle<()>,
    /// A read was requested and has not come back.
    reading: bool,
    /// Flushes handed to the flusher whose reports have not come back.
    flushing: usize,
    /// The client is still there to receive messages.
    client_here: bool,
    /// Consecutive failed reads, for backoff.
    read_failures: u32,
    retry_read_at: Option<tokio::time::Instant>,
    stats: Stats,
}

/// Counters logged when the session closes.
#[derive(Debug, Default)]
struct Stats {
    reads: u64,
    deliveries: u64,
    flushes: u64,
    failed_flushes: u64,
    outcomes: HashMap<&'static str, u64>,
}

impl<'a> Session<'a> {
    async fn open(
        shared: &'a Shared,
        id: String,
        source: StreamSource,
        request: OpenRequest,
        out: &'a Outbound,
    ) -> Result<Session<'a>, SessionError> {
        let redis = &shared.redis;
        stream::ensure_group(redis.pool(), &source).await?;
        let reader_client = redis.dedicated_client().await?;
        let keys = StreamKeys::new(&source);

        let (reader_tx, mut commands) = mpsc::channel::<ReaderCommand>(4);
        let (results, reader_rx) = mpsc::channel(1);
        let mut reader = StreamReader::new(
            reader_client.clone(),
            &source,
            request.block,
            shared.settings.reclaim_interval,
        );
        let reader_task = tokio::spawn(
            async move {
                while let Some(command) = commands.recv().await {
                    match command {
                        ReaderCommand::RereadPending => reader.reread_pending(),
                        ReaderCommand::Read { count } => {
                            let batch = reader.read(count).await;
                            if results.send(batch).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                reader.close().await;
            }
            .in_current_span(),
        );

        // Flushes run one after another so side effects of later reads never overtake
        // earlier ones; the queue is bounded by the in-flight limit (one job per read).
        let (flush_tx, mut jobs) = mpsc::unbounded_channel::<FlushJob>();
        let (reports, flush_rx) = mpsc::unbounded_channel();
        let pool = redis.clone();
        let flusher = tokio::spawn(
            async move {
                while let Some(FlushJob { mut report, plan }) = jobs.recv().await {
                    report.result = flush::execute(pool.pool(), &plan).await;
                    if reports.send(report).is_err() {
                        break;
                    }
                }
            }
            .in_current_span(),
        );

        let promoter = tokio::spawn(
            promote(
                redis.clone(),
                keys.clone(),
                shared.settings.promote_interval,
            )
            .in_current_span(),
        );

        info!(
            count = request.count,
            mode = request.mode.as_str(),
            max_in_flight = request.max_in_flight,
            "subscription opened"
        );
        let opened = Opened {
            subscription_id: id.clone(),
            source: source.clone(),
            request: request.clone(),
        };
        let mut session = Session {
            shared,
            id,
            keys,
            window: Window::new(Limits {
                max_commands_per_slot: shared.settings.max_commands_per_slot,
            }),
            out,
            reader_tx,
            reader_rx,
            reader: reader_task,
            reader_client,
            flush_tx: Some(flush_tx),
            flush_rx,
            flusher,
            promoter,
            reading: false,
            flushing: 0,
            client_here: true,
            read_failures: 0,
            retry_read_at: None,
            stats: Stats::default(),
            request,
            source,
        };
        session.send(Event::Opened(opened)).await;
        Ok(session)
    }

    async fn run(mut self, mut inbound: impl Stream<Item = Inbound> + Unpin) {
        let mut stopping: Option<tokio::time::Instant> = None;
        let mut ended_with: Option<SessionError> = None;
        loop {
            if stopping.is_none() && self.client_here {
                self.request_read().await;
            }
            if stopping.is_some() && self.window.outstanding() == 0 {
                break;
            }
            let retry_read_at = self.retry_read_at;
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
                    self.reading = false;
                    if stopping.is_none() {
                        self.deliver(batch).await;
                    }
                    // While stopping, entries read now stay pending and come back later.
                }
                Some(report) = self.flush_rx.recv() => self.reported(report).await,
                () = self.shared.shutdown.cancelled(), if stopping.is_none() => {
                    info!(outstanding = self.window.outstanding(), grace = ?self.shared.settings.shutdown_grace, "shutdown: waiting for outstanding outcomes");
                    stopping = Some(tokio::time::Instant::now() + self.shared.settings.shutdown_grace);
                    ended_with = Some(SessionError::ShuttingDown);
                }
                () = sleep_until(stopping) => break,
                () = sleep_until(retry_read_at) => self.retry_read_at = None,
            }
            if !self.client_here {
                break;
            }
        }
        self.close(ended_with).await;
    }

    /// Asks the reader for more when the window has room and no read is under way.
    async fn request_read(&mut self) {
        let room = (self.request.max_in_flight as usize).saturating_sub(self.window.outstanding());
        if self.reading || room == 0 || self.retry_read_at.is_some() {
            return;
        }
        let count = room.min(self.request.count as usize) as u32;
        if self
            .reader_tx
            .send(ReaderCommand::Read { count })
            .await
            .is_ok()
        {
            self.reading = true;
        }
    }

    async fn deliver(&mut self, batch: Result<ReadBatch, RedisError>) {
        let batch = match batch {
            Ok(batch) => {
                self.read_failures = 0;
                batch
            }
            Err(err) => {
                self.read_failures += 1;
                let backoff = Duration::from_millis(100 << self.read_failures.min(5));
                if self.read_failures == 1 {
                    warn!(error = %err, "read failed; retrying");
                }
                if let RedisError::Refused { message, .. } = &err
                    && message.starts_with("NOGROUP")
                {
                    // The group was deleted under us: recreate it and go on.
                    let _ = stream::ensure_group(self.shared.redis.pool(), &self.source).await;
                }
                self.retry_read_at = Some(tokio::time::Instant::now() + backoff);
                return;
            }
        };
        let mut entries = batch.entries;
        if batch.redelivery {
            // A pending or claimed entry may be one this window already handed out.
            let outstanding: HashSet<&Bytes> =
                self.window.outstanding_entries().map(|e| &e.id).collect();
            entries.retain(|e| !outstanding.contains(&e.id));
        }
        let entries: Vec<Arc<Entry>> = entries.into_iter().map(Arc::new).collect();
        let Some(read) = self.window.open_read(entries.clone()) else {
            return;
        };
        self.stats.reads += 1;
        self.stats.deliveries += entries.len() as u64;
        self.send(Event::Read {
            read_id: read.read_id,
            first_slot: read.first_slot,
            entries,
        })
        .await;
    }

    async fn apply(&mut self, batch: ClientBatch) {
        let mut rejected = Vec::new();
        for (slot, command) in batch.commands {
            if let Err(err) = self.window.queue(slot, command) {
                rejected.push(err);
            }
        }
        for outcome in batch.outcomes {
            let result = outcome.and_then(|settle| {
                let flush = self
                    .window
                    .settle(settle.slot, settle.outcome, settle.reason)?;
                *self
                    .stats
                    .outcomes
                    .entry(settle.outcome.as_str())
                    .or_default() += 1;
                Ok(flush)
            });
            match result {
                Ok(Some(batch)) => self.flush(batch),
                Ok(None) => {}
                Err(err) => rejected.push(err),
            }
        }
        if !rejected.is_empty() {
            self.send(Event::Rejected(rejected)).await;
        }
    }

    fn flush(&mut self, batch: FlushBatch<Arc<Entry>>) {
        let plan = plan_flush(&self.keys, &batch, self.request.mode);
        let report = FlushReport {
            read_id: batch.read_id,
            segments_kept: batch.kept.len(),
            segments_dropped: batch.dropped_segments(),
            commands: plan.side_effects,
            settles: plan.settles,
            result: FlushResult::default(),
        };
        let Some(flush_tx) = &self.flush_tx else {
            return;
        };
        if flush_tx.send(FlushJob { report, plan }).is_ok() {
            self.flushing += 1;
        }
    }

    async fn reported(&mut self, report: FlushReport) {
        self.flushing -= 1;
        self.stats.flushes += 1;
        if !report.result.ok() {
            self.stats.failed_flushes += 1;
            warn!(
                read_id = report.read_id,
                commands = report.commands,
                settles = report.settles,
                failed = report.result.failed,
                settle_failed = report.result.settle_failed,
                error = report.result.first_error.as_deref().unwrap_or(""),
                "flush failed"
            );
            if report.result.settle_failed {
                // The read's entries are still pending on this consumer: read them again.
                let _ = self.reader_tx.send(ReaderCommand::RereadPending).await;
            }
        }
        self.send(Event::Flushed(report)).await;
    }

    async fn send(&mut self, event: Event) {
        if self.client_here && self.out.send(Ok(event)).await.is_err() {
            // The response stream was dropped: the client is gone.
            self.client_here = false;
        }
    }

    /// Abandons what is outstanding, flushes what is owed and waits for it, then ends the
    /// stream.
    async fn close(mut self, ended_with: Option<SessionError>) {
        let abandoned = self.window.outstanding();
        for batch in self.window.abandon_all() {
            self.flush(batch);
        }
        self.flush_tx = None;
        let owed = self.flushing;
        while self.flushing > 0 {
            match self.flush_rx.recv().await {
                Some(report) => self.reported(report).await,
                None => break,
            }
        }
        let _ = self.flusher.await;
        self.promoter.abort();
        // The reader may be blocked in XREADGROUP: stop it and close its connection. Entries
        // that read delivered stay pending on this consumer and come back.
        self.reader.abort();
        let client = self.reader_client.clone();
        tokio::spawn(async move {
            let _ = client.quit().await;
        });
        info!(
            id = %self.id,
            reads = self.stats.reads,
            deliveries = self.stats.deliveries,
            flushes = self.stats.flushes,
            failed_flushes = self.stats.failed_flushes,
            flushed_at_close = owed,
            left_pending = abandoned,
            outcomes = ?self.stats.outcomes,
            "subscription closed"
        );
        if let Some(err) = ended_with
            && self.client_here
        {
            let _ = self.out.send(Err(err)).await;
        }
    }
}

fn plan_flush(keys: &StreamKeys, batch: &FlushBatch<Arc<Entry>>, mode: Mode) -> flush::FlushPlan {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    stream::plan_flush(keys, batch, mode, now_ms)
}

/// Sleeps until the deadline, or forever when there is none.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Moves due retry_after entries back into the stream, for as long as the subscription runs.
async fn promote(redis: Redis, keys: StreamKeys, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    const LIMIT: u32 = 256;
    loop {
        tick.tick().await;
        loop {
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default();
            match stream::promote_due(redis.pool(), &keys, now_ms, LIMIT).await {
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
