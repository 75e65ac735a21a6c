//! The task that runs one subscription: it `select!`s over the client's messages, the reader's
//! answers, the flusher's reports, lease renewals, shutdown and the engine's next deadline,
//! hands each to the [`Engine`], and executes the actions it answers with. It decides nothing
//! itself: what to read, deliver, flush, give back and when to end is the engine's. Opening is
//! in [`open`], the client's side in [`client`], flushes in [`flushes`].

mod client;
mod flushes;
mod held;
mod open;
mod poison;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use futures::{Stream, StreamExt};
use opentelemetry::trace::SpanContext;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

use super::io::Flushed;
use super::io::flusher::FlushJob;
use super::io::lane::LaneRead;
use super::io::reader::ReadRequest;
use super::observe::{self, PartitionView, SubscriptionView};
use super::{
    ClientMessage, Event, Inbound, InboundError, OpenRequest, Outbound, Release, SessionError,
    Shared,
};
use crate::domain::{Entry, ReadBatch, Source};
use crate::engine::{Action, Engine, FetchId, FlushId, Lane, LeaseRenewal, ReadFrom, Stop};
use crate::metrics::{FormLabels, SubscriptionLabels};
use crate::redis::RedisError;
use crate::redis::form::{Form, ReadInterrupter};
use crate::redis::keys::KeySpecs;
use crate::redis::lease::ConsumerLease;
use crate::window::{ReadId, SlotId};

type Item = Arc<Entry>;

/// What a fetch of parked entries or a count of due retries found.
type Fetched = (Lookup, FetchId, Result<Vec<Option<Entry>>, RedisError>);

/// A look-up of pending entries by id that answers the engine.
#[derive(Clone, Copy, Debug)]
enum Lookup {
    /// [`Action::Fetch`].
    Fetch,
    /// [`Action::Count`].
    Count,
}

/// Where a subscription runs: alone on its client stream, or as one partition of a
/// partitioned stream's subscription, beside the others this replica reads.
#[derive(Clone)]
pub(super) struct Placement {
    /// Cancelled when the subscription is to stop reading and drain: at shutdown, or when its
    /// partition is handed over.
    pub(in crate::session) stop: CancellationToken,
    /// Its slot and read ids begin after this.
    pub(in crate::session) numbered_from: u64,
    pub(in crate::session) partition: Option<PartitionView>,
}

impl Placement {
    /// A subscription alone on its client stream.
    pub(in crate::session) fn alone(shared: &Shared) -> Self {
        Self {
            stop: shared.shutdown.clone(),
            numbered_from: 0,
            partition: None,
        }
    }
}

/// One open subscription.
pub(super) struct Subscription {
    shared: Arc<Shared>,
    /// Stop reading and drain (see [`Placement::stop`]).
    stop: CancellationToken,
    request: OpenRequest,
    source: Source,
    form: Form,
    engine: Engine<Item>,
    /// Taken when the engine ends the client's stream.
    out: Option<Outbound>,
    /// Ended with by the session itself (a malformed message, a second open).
    ended_with: Option<SessionError>,
    reader_tx: mpsc::Sender<ReadRequest>,
    reader_rx: mpsc::Receiver<Result<ReadBatch, RedisError>>,
    /// Cuts the reader's blocking read short when the subscription closes.
    interrupter: Option<ReadInterrupter>,
    flush_tx: mpsc::UnboundedSender<FlushJob>,
    /// An ordered stream's read lane.
    lane_tx: Option<mpsc::UnboundedSender<LaneRead>>,
    flush_rx: mpsc::UnboundedReceiver<Flushed>,
    /// Fetches of parked entries and counts of due retries answer here.
    fetch_tx: mpsc::UnboundedSender<Fetched>,
    fetch_rx: mpsc::UnboundedReceiver<Fetched>,
    lease: Option<ConsumerLease>,
    lease_tx: mpsc::UnboundedSender<LeaseRenewal>,
    lease_rx: mpsc::UnboundedReceiver<LeaseRenewal>,
    /// The local hold on the consumer name.
    release: Option<Release>,
    /// Background tasks that live as long as the subscription (promoter, sampler).
    helpers: Vec<JoinHandle<()>>,
    /// When the read under way was asked for, for its span.
    reading_since: Option<SystemTime>,
    /// Spans of reads not yet flushed, and the client's contexts of settled slots, while
    /// tracing is on.
    read_spans: HashMap<ReadId, SpanContext>,
    client_spans: HashMap<SlotId, SpanContext>,
    /// Why entries an atomic-mode segment left pending failed, for their dead letter.
    poison: flushes::PoisonReasons,
    /// A simple list's flushes under way with requeues: the entries of each one's requeue
    /// step, in its order (`None` for those without a requeue write), the only copy of them.
    popped: HashMap<FlushId, Vec<Option<Item>>>,
    /// A simple list's entries Redis refused to take back, until it does.
    held: held::Held<Item>,
    view: SubscriptionView,
    form_labels: FormLabels,
    labels: SubscriptionLabels,
    key_specs: Arc<KeySpecs>,
}

impl Subscription {
    /// Runs until the engine is done: the client's stream has ended and the last read
    /// returned.
    pub(super) async fn run(mut self, mut inbound: impl Stream<Item = Inbound> + Unpin) {
        let mut inbound_open = true;
        let now = || Instant::now().into_std();
        self.execute().await;
        while !self.engine.is_done() {
            if self.out.is_some() {
                self.publish_view();
            }
            let deadline = self.engine.next_deadline().map(Instant::from_std);
            tokio::select! {
                // Cancel-safe: a message is either returned or left in the stream.
                message = inbound.next(), if inbound_open => {
                    let ended = match message {
                        Some(Ok(ClientMessage::Batch(batch))) => {
                            self.apply(batch).await;
                            None
                        }
                        Some(Ok(ClientMessage::Open(_))) => Some(SessionError::SecondOpen),
                        Some(Err(InboundError::Invalid(msg))) => Some(SessionError::InvalidRequest(msg)),
                        Some(Err(InboundError::TooLarge(msg))) => Some(SessionError::TooLarge(msg)),
                        // The client half-closed: it reads no further deliveries but still
                        // gets the reports of what it settled.
                        None => {
                            inbound_open = false;
                            self.engine.client_closed(now());
                            None
                        }
                        Some(Err(InboundError::Transport(_))) => {
                            inbound_open = false;
                            self.engine.client_gone(now());
                            None
                        }
                    };
                    if let Some(err) = ended {
                        inbound_open = false;
                        self.ended_with.get_or_insert(err);
                        self.engine.client_closed(now());
                    }
                }
                // Cancel-safe: mpsc receive.
                Some(batch) = self.reader_rx.recv() => {
                    let read = self.read_result(batch);
                    self.engine.read_returned(now(), ReadFrom::Reader, read);
                }
                // Cancel-safe: mpsc receive.
                Some(flushed) = self.flush_rx.recv() => self.flushed(flushed),
                // Cancel-safe: mpsc receive.
                Some((lookup, id, found)) = self.fetch_rx.recv() => {
                    let found = self.fetch_result(lookup, found);
                    match lookup {
                        Lookup::Fetch => self.engine.fetched(now(), id, found),
                        Lookup::Count => self.engine.counted(now(), id, found),
                    }
                }
                // Cancel-safe: mpsc receive.
                Some(renewal) = self.lease_rx.recv() => self.engine.lease_renewed(now(), renewal),
                () = self.stop.cancelled(), if !self.view.draining => {
                    if self.shared.shutdown.is_cancelled() {
                        info!(outstanding = self.engine.view().outstanding, grace = ?self.shared.settings.shutdown_grace, "shutdown: waiting for outstanding outcomes");
                    } else {
                        info!(outstanding = self.engine.view().outstanding, grace = ?self.shared.settings.shutdown_grace, "partition handed over: waiting for outstanding outcomes");
                    }
                    self.view.draining = true;
                    self.engine.shutdown(now());
                }
                () = sleep_until(deadline) => self.engine.tick(now()),
                () = sleep_until(self.held.due().map(Instant::from_std)) => self.give_back_held().await,
            }
            self.execute().await;
        }
        self.closed().await;
    }

    /// Executes what the engine decided, in order.
    async fn execute(&mut self) {
        loop {
            let actions = self.engine.take_actions();
            if actions.is_empty() {
                return;
            }
            for action in actions {
                self.act(action).await;
            }
        }
    }

    async fn act(&mut self, action: Action<Item>) {
        match action {
            Action::Read {
                count,
                lane: Lane::InOrder(id),
            } => self.read_in_order(id, count),
            Action::Read {
                count,
                lane:
                    Lane::Reader {
                        block,
                        reread,
                        recover,
                    },
            } => {
                if reread {
                    debug!("reading this consumer's own entries again");
                }
                self.reading_since = Some(SystemTime::now());
                let request = ReadRequest {
                    count,
                    block,
                    reread,
                    recover,
                };
                if self.reader_tx.send(request).await.is_err() {
                    warn!("the reader stopped");
                }
            }
            Action::Fetch { fetch, parked } => {
                let (form, client) = (self.form.clone(), self.shared.redis.pool().clone());
                let answer = self.fetch_tx.clone();
                // Beside everything else: the entries are this consumer's pending ones.
                tokio::spawn(
                    async move {
                        let found = form.fetch(&client, &parked).await;
                        let _ = answer.send((Lookup::Fetch, fetch, found));
                    }
                    .in_current_span(),
                );
            }
            Action::Count { count, entries } => {
                let (form, client) = (self.form.clone(), self.shared.redis.pool().clone());
                let answer = self.fetch_tx.clone();
                // Beside everything else: the entries are this consumer's pending ones.
                tokio::spawn(
                    async move {
                        let refs: Vec<&Entry> = entries.iter().map(|e| &**e).collect();
                        let found = form.count_due(&client, &refs).await;
                        if let Ok(found) = &found {
                            observe::claimed_away(&entries, found);
                        }
                        let _ = answer.send((Lookup::Count, count, found));
                    }
                    .in_current_span(),
                );
            }
            Action::InterruptRead => {
                if let Some(interrupter) = self.interrupter.clone() {
                    // On its own task: the backchannel may need a connection first, and the
                    // close goes on meanwhile.
                    tokio::spawn(async move { interrupter.interrupt().await }.in_current_span());
                }
            }
            Action::Deliver {
                read,
                entries,
                redelivery,
                lost,
                report,
            } => self.deliver(read, entries, redelivery, lost, report).await,
            Action::Lost(lost) => {
                let event = Event::Read {
                    read_id: 0,
                    first_slot: 0,
                    entries: Vec::new(),
                    lost,
                    read_trace: None,
                    flushed: None,
                    partition: None,
                };
                self.send(event).await;
            }
            Action::Flush {
                flush,
                batch,
                read_ahead,
            } => self.flush(flush, batch, read_ahead),
            Action::DeadLetter { flush, entries } => self.dead_letter(flush, entries),
            Action::Report(report) => self.send(Event::Flushed(report)).await,
            Action::GiveBack { entries, seen } => {
                let refs: Vec<&Entry> = entries.iter().map(|e| &**e).collect();
                if let Err(err) = self
                    .form
                    .give_back(self.shared.redis.pool(), &refs, seen)
                    .await
                {
                    if self.form.pops() {
                        warn!(error = %err, entries = refs.len(), "Redis refused to take popped entries back: held here until it does");
                        self.held.hold(entries, seen, Instant::now().into_std());
                    } else {
                        warn!(error = %err, entries = refs.len(), seen, "could not give entries back; they count one delivery more");
                    }
                }
            }
            Action::Extend(entries) => {
                let (form, client) = (self.form.clone(), self.shared.redis.pool().clone());
                tokio::spawn(
                    async move {
                        let refs: Vec<&Entry> = entries.iter().map(|e| &**e).collect();
                        if let Err(err) = form.extend(&client, &refs).await {
                            debug!(error = %err, entries = refs.len(), "extending deliveries failed; the client may extend again");
                        }
                    }
                    .in_current_span(),
                );
            }
            Action::RenewLease => {
                if let Some(lease) = self.lease.clone() {
                    let (client, answer) =
                        (self.shared.redis.pool().clone(), self.lease_tx.clone());
                    tokio::spawn(async move {
                        let renewal = match lease.take(&client).await {
                            Ok(true) => LeaseRenewal::Held,
                            Ok(false) => LeaseRenewal::Lost,
                            Err(err) => {
                                debug!(error = %err, "renewing the consumer lease failed; trying again");
                                LeaseRenewal::Failed
                            }
                        };
                        let _ = answer.send(renewal);
                    });
                }
            }
            Action::Draining { grace, outstanding } => {
                self.send(Event::Draining { grace, outstanding }).await;
            }
            Action::EndStream(stop) => self.end_stream(stop).await,
            Action::Done => {}
        }
    }

    async fn send(&mut self, event: Event) {
        let Some(out) = &self.out else { return };
        if out.send(Ok(event)).await.is_err() {
            // The response stream was dropped: the client is gone.
            self.engine.client_gone(Instant::now().into_std());
        }
    }

    /// Ends the client's stream; the consumer name stays held until the engine is done (its
    /// last read returned), so that a reopen finds what that read took.
    async fn end_stream(&mut self, stop: Option<Stop>) {
        let err = match stop {
            Some(stop) => Some(self.stopped(stop)),
            None => self.ended_with.take(),
        };
        if let (Some(err), Some(out)) = (err, self.out.take()) {
            let _ = out.send(Err(err)).await;
        }
        self.out = None;
        if let Some(release) = &self.release {
            release.closing();
        }
        self.forget();
    }

    fn stopped(&self, stop: Stop) -> SessionError {
        let (key, group, consumer) = self.source.describe();
        match stop {
            Stop::Shutdown => SessionError::ShuttingDown,
            Stop::GroupDeleted => SessionError::GroupDeleted { key, group },
            Stop::WrongType => SessionError::WrongType {
                key,
                form: self.form_labels.form,
            },
            Stop::LeaseLost => SessionError::LeaseLost { key, consumer },
        }
    }

    /// Refreshes the admin view and the outstanding gauge.
    fn publish_view(&mut self) {
        let view = self.engine.view();
        self.view.reads_in_flight = u32::from(view.reading);
        self.view.open_reads = view.open_reads;
        self.view.outstanding_deliveries = view.outstanding;
        self.view.kept_segments = view.kept_segments;
        self.view.waiting_for_key = view.waiting_for_key;
        self.view.flushes_in_flight = view.flushes;
        self.view.draining |= view.draining;
        self.shared
            .metrics
            .outstanding
            .get_or_create(&self.labels)
            .set(view.outstanding as i64);
        if self.request.ordering_key.is_some() {
            self.shared
                .metrics
                .waiting_for_key
                .get_or_create(&self.labels)
                .set(view.waiting_for_key as i64);
        }
        self.shared
            .views
            .lock()
            .insert(self.view.id.clone(), self.view.clone());
    }

    /// Pushes a simple list's held entries back where they were read; held again, for a later
    /// try, if Redis still refuses.
    async fn give_back_held(&mut self) {
        let now = || Instant::now().into_std();
        let (seen, unseen) = self.held.take();
        for (entries, seen) in [(seen, true), (unseen, false)] {
            if entries.is_empty() {
                continue;
            }
            let refs: Vec<&Entry> = entries.iter().map(|e| &**e).collect();
            match self
                .form
                .give_back(self.shared.redis.pool(), &refs, seen)
                .await
            {
                Ok(()) => {
                    info!(
                        entries = refs.len(),
                        "held entries taken back by Redis: they are delivered again"
                    );
                    self.held.given_back();
                }
                Err(err) => {
                    debug!(error = %err, entries = refs.len(), "Redis still refuses to take held entries back");
                    self.held.refused(entries, seen, now());
                }
            }
        }
    }

    /// The engine is done (the last read returned): give back what is held, free the lease,
    /// then the name.
    async fn closed(mut self) {
        // At shutdown the process ends soon after the last subscription: a try or two, then
        // the error line, before it does.
        let hold = if self.shared.shutdown.is_cancelled() {
            HELD_AT_SHUTDOWN
        } else {
            HELD_AT_CLOSE
        };
        let until = Instant::now() + hold;
        while let Some(due) = self.held.due().map(Instant::from_std) {
            if due > until {
                let (seen, unseen) = self.held.take();
                let first = seen.iter().chain(&unseen).next();
                error!(
                    entries = seen.len() + unseen.len(),
                    first = %first.map(|e| String::from_utf8_lossy(e.value())).unwrap_or_default(),
                    "popped entries lost: Redis refused to take them back until the subscription closed (a simple list is at most once)"
                );
                break;
            }
            tokio::time::sleep_until(due).await;
            self.give_back_held().await;
        }
        if let Some(lease) = &self.lease
            && let Err(err) = lease.free(self.shared.redis.pool()).await
        {
            debug!(error = %err, "freeing the consumer lease failed; it expires by itself");
        }
        // Dropping the reader's sender stops it (its read under way has returned) and closes
        // its connection; dropping `release` frees the name on this sidecar.
    }

    /// The client's stream ended: the subscription is closed for operators too (its gauges,
    /// series, admin view and helpers go), though its name is held until its last read returns.
    fn forget(&mut self) {
        for helper in &self.helpers {
            helper.abort();
        }
        let metrics = &self.shared.metrics;
        metrics
            .subscriptions_open
            .get_or_create(&self.form_labels)
            .dec();
        metrics.outstanding.remove(&self.labels);
        metrics.waiting_for_key.remove(&self.labels);
        self.shared.views.lock().remove(&self.view.id);
        let c = &self.view.counters;
        let closed = self.engine.view().closed;
        info!(
            reads = c.reads,
            deliveries = c.deliveries,
            flushes = c.flushes,
            failed_flushes = c.failed_flushes,
            flushed_at_close = closed.flushed_at_close,
            left_pending = closed.left_pending,
            outcomes = ?c.outcomes,
            "subscription closed"
        );
    }
}

/// How long a closing subscription keeps trying to give back the entries it holds: after its
/// client left, and at shutdown (within the drain's slack past the grace period).
const HELD_AT_CLOSE: std::time::Duration = std::time::Duration::from_secs(10);
const HELD_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_millis(800);

/// Sleeps until the deadline, or forever when there is none.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
